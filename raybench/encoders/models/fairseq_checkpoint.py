"""Reading fairseq(-signals) `.pt` checkpoints without a full unpickle.

A fairseq checkpoint is a dict `{'args', 'cfg', 'model', 'criterion', 'optimizer_history', 'task_state',
'extra_state', ...}`. fairseq-signals' trainer writes `cfg` as a plain container, but a file that went
through `checkpoint_utils.load_checkpoint_to_cpu` and was saved again (the usual way a published file is
slimmed: load, drop the optimizer state, save) carries `cfg` as an omegaconf `DictConfig`; legacy files
carry an `argparse.Namespace` under `args`; the optimizer history and extra state hold numpy scalars.
`torch.load(weights_only=True)` refuses all of these.

`load_fairseq_checkpoint` still loads with `weights_only=True`, adding to torch's allow-list exactly the
globals such files contain (`FAIRSEQ_GLOBALS`). The omegaconf, numpy and builtin-type names are bound to
inert stand-ins defined here (omegaconf need not be installed, and no omegaconf or numpy code runs): a
stand-in only records the pickled state, which `to_plain` then turns into dicts, lists and scalars (a numpy
scalar is decoded from its bytes only for bool/int/float dtypes). `argparse.Namespace` is allowed as itself
(it only sets attributes). Any other global still fails, naming itself.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from raybench.encoders.base import CheckpointError, load_failure


class _Recorded:
    """Base of the stand-ins: keeps the pickled state (BUILD) and nothing else."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self._state = state

    @property
    def state(self) -> dict:
        s = getattr(self, "_state", None)
        if isinstance(s, tuple) and len(s) == 2 and isinstance(s[1], dict):  # (dict state, slot state)
            merged = dict(s[0] or {})
            merged.update(s[1])
            return merged
        return s if isinstance(s, dict) else {}


class OmegaDict(_Recorded):
    """omegaconf.DictConfig: `_content` maps keys to nodes/containers (or None / '???' / '${...}')."""


class OmegaList(_Recorded):
    """omegaconf.ListConfig: `_content` is a list of nodes/containers."""


class OmegaNode(_Recorded):
    """omegaconf value nodes (AnyNode, StringNode, ...): the value is `_val`."""


class OmegaMetadata(_Recorded):
    """omegaconf.base.Metadata / ContainerMetadata: type and flag bookkeeping, ignored."""


class _TypeRef:
    """A builtin type referenced as data (e.g. a node's `ref_type=int`); never called."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<type {self.name}>"


class NumpyDType(_Recorded):
    """numpy.dtype(code, align, copy) with its BUILD state (byte order at index 1)."""

    def __init__(self, code=None, *args):
        self.code = str(code)

    def as_numpy(self) -> np.dtype:
        s = getattr(self, "_state", None)
        order = s[1] if isinstance(s, tuple) and len(s) > 1 and s[1] in "<>=|" else "="
        return np.dtype(self.code).newbyteorder(order) if order in "<>" else np.dtype(self.code)


def _numpy_scalar(dtype, data=None):
    """numpy.core.multiarray.scalar(dtype, bytes) -> a Python number (plain dtypes), else None."""
    if isinstance(dtype, NumpyDType) and isinstance(data, bytes | bytearray):
        try:
            dt = dtype.as_numpy()
            if dt.kind in "biuf" and dt.itemsize == len(data):
                return np.frombuffer(bytes(data), dtype=dt)[0].item()
        except (TypeError, ValueError):
            return None
    return None


def _plain_dict(*args, **kwargs):
    """collections.defaultdict(factory) -> a plain dict (its items follow via SETITEMS)."""
    return {}


_ANY = _TypeRef("typing.Any")

_NODES = ("AnyNode", "StringNode", "IntegerNode", "FloatNode", "BooleanNode", "EnumNode", "BytesNode",
          "PathNode", "ValueNode", "InterpolationResultNode")

# Exactly the globals a fairseq / fairseq-signals checkpoint pickles (omegaconf 2.0-2.3, numpy 1.x and 2.x).
FAIRSEQ_GLOBALS: list = [
    (OmegaDict, "omegaconf.dictconfig.DictConfig"),
    (OmegaList, "omegaconf.listconfig.ListConfig"),
    (OmegaMetadata, "omegaconf.base.ContainerMetadata"),
    (OmegaMetadata, "omegaconf.base.Metadata"),
    *[(OmegaNode, f"omegaconf.nodes.{n}") for n in _NODES],
    (_ANY, "typing.Any"),
    *[(_TypeRef(n), f"builtins.{n}") for n in ("int", "float", "str", "bool", "dict", "list", "bytes", "tuple")],
    (_plain_dict, "collections.defaultdict"),
    argparse.Namespace,
    (NumpyDType, "numpy.dtype"),
    (_numpy_scalar, "numpy.core.multiarray.scalar"),
    (_numpy_scalar, "numpy._core.multiarray.scalar"),
]


def to_plain(obj: object) -> object:
    """Stand-ins -> dicts / lists / scalars (recursively); tensors and plain containers as they are."""
    if isinstance(obj, OmegaDict):
        content = obj.state.get("_content")
        if isinstance(content, Mapping):
            return {k: to_plain(v) for k, v in content.items()}
        return None if content is None else str(content)  # None config, '???' (missing), '${...}'
    if isinstance(obj, OmegaList):
        content = obj.state.get("_content")
        if isinstance(content, list | tuple):
            return [to_plain(v) for v in content]
        return None if content is None else str(content)
    if isinstance(obj, OmegaNode):
        return to_plain(obj.state.get("_val"))
    if isinstance(obj, argparse.Namespace):
        return {k: to_plain(v) for k, v in vars(obj).items()}
    if isinstance(obj, _Recorded | _TypeRef):
        return None
    if isinstance(obj, dict):  # includes OrderedDict (state dicts): values pass through unless stand-ins
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_plain(v) for v in obj)
    return obj


def load_fairseq_checkpoint(path: str | Path) -> dict:
    """A fairseq `.pt` -> plain dict (cfg / args as nested dicts), via `torch.load(weights_only=True)`
    with the `FAIRSEQ_GLOBALS` allow-list; no code from the file runs."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} not found; pass the file in the model's upstream format")
    try:
        with torch.serialization.safe_globals(FAIRSEQ_GLOBALS):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(
            f"checkpoint {path} cannot be loaded safely (weights_only=True with the fairseq allow-list: "
            f"omegaconf configs, argparse.Namespace, numpy scalars): {load_failure(path, err)}") from err
    plain = to_plain(obj)
    if not isinstance(plain, dict):
        raise CheckpointError(f"{path}: expected a dict at the top level, found {type(obj).__name__}")
    return plain


def model_config(ckpt: Mapping, source: str) -> dict:
    """The model options of a fairseq checkpoint: `cfg['model']` (hydra era; fairseq puts converted legacy
    args there as a Namespace) or the legacy `args` Namespace; `arch` names the model when `_name` is absent."""
    cfg = ckpt.get("cfg")
    model_cfg = cfg.get("model") if isinstance(cfg, Mapping) else None
    if isinstance(model_cfg, Mapping):  # a Namespace there (fairseq's converted legacy args) is a dict by now
        out = dict(model_cfg)
        if not out.get("_name") and out.get("arch"):
            out["_name"] = out["arch"]
        return out
    args = ckpt.get("args")
    if isinstance(args, Mapping) and args:
        out = dict(args)
        out.setdefault("_name", args.get("arch"))
        return out
    raise CheckpointError(f"{source}: no cfg['model'] entry (nor legacy args); the fairseq checkpoint must carry "
                          "its model config (it defines the architecture)")
