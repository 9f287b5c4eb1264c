"""The encoder interface, strict checkpoint loading, and the registry (with a plugin entry-point group).

An encoder is a frozen `torch.nn.Module` that
  * declares `name`, `n_layers` (audited states) and `d` (state width),
  * turns one raw record (12 x T millivolts at fs, leads in `LEADS` order) into its native input
    with `preprocess` (numpy, per record, so Ray Data workers can run it beside the model), and
  * maps a batch of native inputs to token-mean-pooled states of every audited layer with
    `layer_states(x) -> Tensor[n_layers, B, d]`.
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path

import numpy as np
import torch
from torch import nn

from raybench.core.errors import RaybenchError
from raybench.core.models import BUILTIN

ENTRY_POINT_GROUP = "raybench.encoders"
SIZES = ("demo", "full")
PROFILES = ("native", "published")


class CheckpointError(RaybenchError, ValueError):
    """A checkpoint does not fit the model; the message lists the offending keys and the file."""


@dataclass(frozen=True)
class EncoderSpec:
    name: str
    size: str = "demo"  # demo: small shared width d=64, seeded init; full: published architecture
    checkpoint: str | None = None  # path in the model's upstream format; None keeps seeded init
    profile: str = "native"  # native (upstream preprocessing) | published (the protocol's code)
    init_seed: int = 0

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise ValueError(f"encoder size must be one of {SIZES}, got {self.size!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"encoder profile must be one of {PROFILES}, got {self.profile!r}")


class ECGEncoder(nn.Module):
    """Base class for all adapters. Subclasses set the class attributes and implement two methods."""

    name: str = ""
    n_layers: int = 0
    d: int = 0
    profile: str = "native"
    # Bumped by an adapter whenever its preprocessing or pooling changes, so stores written under the old rule
    # stop counting as complete (the fingerprint below mixes it in).
    revision: str = "1"

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        """One record [12, T] (mV, LEADS order) at `fs` -> this model's native input, float32."""
        raise NotImplementedError

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of native inputs -> [n_layers, B, d] token-mean-pooled layer states."""
        raise NotImplementedError

    def fingerprint(self) -> str:
        """Identity of weights + preprocessing: keys the activation store (changes invalidate it)."""
        h = hashlib.sha256(f"{type(self).__module__}.{type(self).__qualname__}|{self.profile}|{self.revision}"
                           .encode())
        for key, tensor in sorted(self.state_dict().items()):
            h.update(key.encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


def freeze(model: nn.Module) -> nn.Module:
    """Eval mode, no gradients: an audited encoder is never updated."""
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def load_torch_checkpoint(path: str | Path) -> dict:
    """`torch.load` with `weights_only=True`: tensors and plain containers only, never pickled code."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} not found; pass the file in the model's upstream format")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"checkpoint {path} cannot be loaded safely (weights_only=True): "
                              f"{load_failure(path, err)}") from err


def load_failure(path: Path, err: BaseException) -> str:
    """Why torch.load refused `path`, in raybench's words: torch's own text suggests `weights_only=False`, which
    raybench never does (it would run code from the file), and an empty file gives no text at all."""
    if path.is_file() and path.stat().st_size == 0:
        return "the file is empty (0 bytes): copy the checkpoint again"
    text = " ".join(str(err).split())
    if "Weights only load failed" in text:
        detail = text.split("WeightsUnpickler error:", 1)[1].split(" Check the documentation")[0].strip() \
            if "WeightsUnpickler error:" in text else ""
        return ("not a checkpoint raybench can read without running code from it (a corrupt or foreign file, or "
                "one that pickles objects beyond tensors)" + (f"; torch: {detail}" if detail else ""))
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def load_state_dict_strict(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load with every key accounted for; shape or key mismatches name the keys and the file."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: checkpoint keys do not match {type(model).__name__}: "
            f"missing {_short(missing)}, unexpected {_short(unexpected)}. "
            "Check that the file is the published checkpoint for this model and size."
        )
    bad = [f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
           if tuple(state[k].shape) != tuple(v.shape)]
    if bad:
        raise CheckpointError(f"{source}: tensor shapes do not match the model: {_short(bad)}")
    model.load_state_dict(dict(state), strict=True)


def _short(items: list[str], n: int = 8) -> str:
    more = f", ... ({len(items)} total)" if len(items) > n else ""
    return "[" + ", ".join(items[:n]) + more + "]"


# ---------------------------------------------------------------- registry

EncoderFactory = Callable[[EncoderSpec], ECGEncoder]
_REGISTRY: dict[str, EncoderFactory] = {}


class RegistrationError(RaybenchError, ValueError):
    """A second encoder under a name that is taken; the message names both factories."""


def register_encoder(name: str, *, replace: bool = False) -> Callable[[EncoderFactory], EncoderFactory]:
    """Decorator: `@register_encoder("my_model")` on a factory `spec -> ECGEncoder`.

    A name holds one factory: registering another factory under a taken name (a built-in's, a plugin's, another
    module's) raises RegistrationError, so no run silently audits a model other than the one its name says. The
    same definition registered again (a module reloaded, a notebook cell run twice: same module and qualified name)
    takes the place of the old one; `replace=True` swaps in a different factory on purpose."""

    def deco(factory: EncoderFactory) -> EncoderFactory:
        held = _REGISTRY.get(name)
        if held is not None and _qualname(held) != _qualname(factory) and not replace:
            raise RegistrationError(
                f"encoder {name!r} is already registered ({_qualname(held)}); {_qualname(factory)} cannot take "
                "its name: pick another name, or pass replace=True to register_encoder to swap it on purpose")
        _REGISTRY[name] = factory
        return factory

    return deco


def _qualname(factory: EncoderFactory) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


IMPORT_ERRORS: dict[str, str] = {}
"""Built-in adapters that failed to import: name -> error (reported by build_encoder)."""


def load_builtin(names: Iterable[str] = BUILTIN) -> None:
    """Import (and so register) the named built-in adapters (raybench/encoders/models/<name>.py, by name: the
    adapters import this module, never the reverse); failures land in IMPORT_ERRORS."""
    for name in names:
        if name not in BUILTIN:
            continue
        try:
            importlib.import_module(f"raybench.encoders.models.{name}")
        except ImportError as err:  # pragma: no cover - depends on the environment
            IMPORT_ERRORS[name] = f"{type(err).__name__}: {err}"


def _load_builtin_and_plugins(name: str | None = None) -> None:
    """Register the built-in adapters and entry-point plugins: all of them, or just what `name` needs."""
    if name is not None and name in _REGISTRY:
        return
    if name in BUILTIN:
        load_builtin([name])
        return
    load_builtin()
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name not in _REGISTRY:
            _REGISTRY[ep.name] = ep.load()


def available_encoders() -> list[str]:
    _load_builtin_and_plugins()
    return sorted(_REGISTRY)


def build_encoder(spec: EncoderSpec) -> ECGEncoder:
    """Build, load weights (if a checkpoint is given) and freeze the encoder named by `spec`."""
    _load_builtin_and_plugins(spec.name)
    if spec.name not in _REGISTRY:
        if spec.name in IMPORT_ERRORS:
            raise KeyError(f"encoder {spec.name!r} failed to import: {IMPORT_ERRORS[spec.name]}")
        raise KeyError(f"unknown encoder {spec.name!r}; available: {sorted(_REGISTRY)} "
                       f"(plugins register in the {ENTRY_POINT_GROUP!r} entry-point group)")
    return build_with(_REGISTRY[spec.name], spec)


def build_with(factory: EncoderFactory, spec: EncoderSpec) -> ECGEncoder:
    """Seeded build + profile + freeze: what every worker does with a factory."""
    torch.manual_seed(spec.init_seed)
    model = factory(spec)
    model.profile = spec.profile
    return freeze(model)


def worker_builder(name: str) -> Callable[[EncoderSpec], ECGEncoder] | None:
    """A builder to ship to Ray workers for an encoder registered at run time in this process.

    Built-in and entry-point encoders register themselves in every worker, so they need none (None);
    a model registered with `register_encoder` in the driver only (a notebook, a script) travels as its
    factory, pickled with the builder.
    """
    import functools

    _load_builtin_and_plugins(name)
    plugins = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name in BUILTIN or name in plugins or name not in _REGISTRY:
        return None
    return functools.partial(build_with, _REGISTRY[name])


def key_report(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> dict:
    """loaded / missing / extra keys (and shape mismatches) of `state` against a model's state dict, with the
    parameter counts: `n_params` loaded, `n_params_model` the model's."""
    loaded = sorted(k for k in expected if k in state and tuple(state[k].shape) == tuple(expected[k].shape))
    return {
        "loaded": loaded,
        "missing": sorted(set(expected) - set(state)),
        "extra": sorted(set(state) - set(expected)),
        "shape_mismatch": sorted(f"{k} {tuple(state[k].shape)} != {tuple(v.shape)}" for k, v in expected.items()
                                 if k in state and tuple(state[k].shape) != tuple(v.shape)),
        "n_params": int(sum(expected[k].numel() for k in loaded)),
        "n_params_model": int(sum(v.numel() for v in expected.values())),
    }

