"""`raybench checkpoint inspect FILE --model NAME`: what a checkpoint file would load into a model, before a run.

Two paths give the same report (model, file, variant, architecture, loaded / missing / extra keys, shape
mismatches, keys dropped by name, parameter counts vs the published count):

  adapter  the model's own `inspect_checkpoint(path, size)` (every built-in adapter has one): its reader (the
           allow-listed loader for files that pickle config objects, e.g. fairseq's `cfg` or HuBERT-ECG's
           `model_config`), its key renames and the key groups it drops by name.
  generic  any registered model (a plugin too, or `--generic`): the model built at `--size` (full: the published
           architecture) on the meta device by `raybench.encoders.base`, compared key by key and shape by shape
           with the file's tensors. The file is read as the adapters read it: safetensors, or `torch.load` with
           `weights_only=True`; objects pickled beside the tensors (config classes, argparse / omegaconf
           objects) are read as inert placeholders registered under their names for that one load (their
           classes are never imported, no code of the file runs) and listed; nested dicts are flattened to
           dotted names and the prefix pair (file side, model side: e.g. `module.`, `encoder.`, `model.`)
           that matches most keys is used.

Exit status: 0 when the file would load strictly, 1 when it would not (the report says why), 2 for a file that
cannot be read at all (one `Error:` line).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import torch

from raybench.encoders.base import CheckpointError, EncoderSpec, key_report, load_torch_checkpoint

REPORT_KEYS = ("loaded", "missing", "extra", "shape_mismatch")
# published-count attributes an adapter module may define, in the order they are looked up (generic path)
PUBLISHED_ATTRS = ("PUBLISHED_PARAMS", "PUBLISHED_BACKBONE_PARAMS", "UPSTREAM_PARAMS", "UPSTREAM_TINY_PARAMS")


# ---------------------------------------------------------------- generic path

def read_tensors(path: str | Path) -> tuple[dict[str, torch.Tensor], list[str]]:
    """A checkpoint file or HuggingFace folder -> (tensors under dotted names, the non-tensor entries' names)."""
    from safetensors.torch import load_file

    p = Path(path)
    if p.is_dir():
        single, index, binary = p / "model.safetensors", p / "model.safetensors.index.json", p / "pytorch_model.bin"
        if single.exists():
            return load_file(str(single)), []
        if index.exists():
            state: dict[str, torch.Tensor] = {}
            for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
                state.update(load_file(str(p / Path(shard).name)))
            return state, []
        if not binary.exists():
            raise CheckpointError(f"{p}: a folder without model.safetensors, an index or pytorch_model.bin")
        p = binary
    if p.suffix == ".safetensors":
        return load_file(str(p)), []
    objects: list[str] = []
    try:
        obj = load_torch_checkpoint(p)
    except CheckpointError as err:
        try:
            objects = torch.serialization.get_unsafe_globals_in_checkpoint(p)
        except Exception:
            raise err from None
        if not objects:
            raise
        try:
            with torch.serialization.safe_globals([(_inert(name), name) for name in objects]):
                obj = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as again:
            raise CheckpointError(f"{p}: cannot be read with weights_only=True even with inert placeholders for "
                                  f"{objects}: {again}") from again
    tensors: dict[str, torch.Tensor] = {}
    other: list[str] = []
    _flatten(obj, "", tensors, other)
    return tensors, other + [f"object {name}" for name in objects]


class _Inert:
    """Stands in for a pickled object's class during a weights_only load: keeps its arguments, runs nothing."""

    def __init__(self, *args: object, **kwargs: object):
        self.args, self.kwargs = args, kwargs

    def __setstate__(self, state: object) -> None:
        self.state = state


def _inert(name: str) -> type:
    return type(name.rsplit(".", 1)[-1], (_Inert,), {"__module__": "raybench.inert", "pickled_as": name})


def _flatten(obj: object, prefix: str, tensors: dict[str, torch.Tensor], other: list[str]) -> None:
    if isinstance(obj, torch.Tensor):
        tensors[prefix[:-1]] = obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            _flatten(v, f"{prefix}{k}.", tensors, other)
    elif isinstance(obj, list | tuple) and any(isinstance(v, torch.Tensor | Mapping) for v in obj):
        for i, v in enumerate(obj):
            _flatten(v, f"{prefix}{i}.", tensors, other)
    elif prefix and "." not in prefix[:-1]:  # top-level non-tensor entries (cfg, args, optimizer history ...)
        other.append(prefix[:-1])


def _prefixes(keys: list[str], depth: int) -> set[str]:
    out = {""}
    for k in keys:
        parts = k.split(".")
        out.update(".".join(parts[:i]) + "." for i in range(1, min(depth, len(parts) - 1) + 1))
    return out


def align(expected: Mapping[str, torch.Tensor], found: Mapping[str, torch.Tensor]
          ) -> tuple[str, str, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The (file prefix, model prefix) to strip that matches most keys -> (P, Q, model side, file side)."""
    model_keys, file_keys = list(expected), list(found)
    best = ("", "", -1)
    for q in sorted(_prefixes(model_keys, 1), key=len):
        model_side = {k[len(q):] for k in model_keys if k.startswith(q)}
        for p in sorted(_prefixes(file_keys, 2), key=len):
            n = sum(1 for k in file_keys if k.startswith(p) and k[len(p):] in model_side)
            if n > best[2]:
                best = (p, q, n)
    p, q, _ = best
    exp = {k[len(q):]: v for k, v in expected.items() if k.startswith(q)}
    exp |= {k: v for k, v in expected.items() if not k.startswith(q)}  # keys outside the prefix stay as they are
    got = {k[len(p):]: v for k, v in found.items() if k.startswith(p)}  # the file's other tensors: see generic
    return p, q, exp, got


def generic_inspect(path: str, name: str, size: str = "full") -> dict:
    """The generic report: `name` built at `size` on the meta device vs the file's tensors."""
    from raybench.encoders.base import build_encoder

    with torch.device("meta"):
        model = build_encoder(EncoderSpec(name, size=size))
    expected = model.state_dict()
    found, other = read_tensors(path)
    p, q, exp, got = align(expected, found)
    report = key_report(exp, got)
    published, source = _published(name)
    dropped = {"not_tensors": other} if other else {}
    outside = sorted(k for k in found if not k.startswith(p))
    if outside:  # e.g. optimizer states beside the model's entry: not part of the comparison
        dropped[f"tensors outside {p!r}"] = outside
    return {"model": name, "file": str(path), "variant": "generic comparison",
            "architecture": f"{size}: {model.n_layers} audited layers x {model.d} ({type(model).__name__})",
            **report, "dropped": dropped,
            "prefixes": {"file": p, "model": q},
            "published_params": published, "published_params_source": source}


def _published(name: str) -> tuple[float | None, str]:
    module = _adapter_module(name)
    for attr in PUBLISHED_ATTRS:
        if module is not None and isinstance(getattr(module, attr, None), int | float):
            return getattr(module, attr), f"{module.__name__}.{attr}"
    return None, "no published count known for this model"


def _adapter_module(name: str):
    from raybench.core.models import BUILTIN

    if name not in BUILTIN:
        return None
    return importlib.import_module(f"raybench.encoders.models.{name}")


# ---------------------------------------------------------------- entry point

def inspect(path: str, name: str, size: str = "full", generic: bool = False) -> dict:
    """The report for `path` as model `name`: the adapter's own inspect when it has one, else the generic one."""
    from raybench.encoders.base import available_encoders

    if not Path(path).exists():
        raise CheckpointError(f"checkpoint {path} not found")
    names = available_encoders()
    if name not in names:
        raise CheckpointError(f"unknown model {name!r}; available: {names}")
    module = None if generic else _adapter_module(name)
    own = getattr(module, "inspect_checkpoint", None) if module is not None else None
    report = own(str(path), size=size) if own is not None else generic_inspect(str(path), name, size)
    report["path_used"] = "adapter" if own is not None else "generic"
    report["loads"] = not any(report.get(k) for k in ("missing", "extra", "shape_mismatch"))
    return report


def format_report(r: dict[str, Any], n: int = 12) -> str:
    def keys(items: list[str]) -> str:
        if not items:
            return "0"
        more = f", ... (+{len(items) - n})" if len(items) > n else ""
        return f"{len(items)}: " + ", ".join(items[:n]) + more

    lines = [f"model          {r['model']} ({r['path_used']} report)", f"file           {r['file']}",
             f"variant        {r.get('variant', '')}", f"architecture   {r.get('architecture', '')}"]
    if r.get("prefixes"):
        lines.append(f"prefixes       file {r['prefixes']['file'] or '(none)'!r} <-> model "
                     f"{r['prefixes']['model'] or '(none)'!r}")
    lines += [f"would load     {len(r['loaded'])} tensors, {r['n_params']:,} parameters",
              f"missing        {keys(r['missing'])}", f"extra          {keys(r['extra'])}",
              f"shape mismatch {keys(r['shape_mismatch'])}"]
    for group, items in sorted((r.get("dropped") or {}).items()):
        lines.append(f"dropped        {group}: {keys(list(items))}")
    lines.append(f"parameters     file {r['n_params']:,} loaded of the model's {r['n_params_model']:,}"
                 + (f"; backbone {r['n_params_backbone']:,}" if "n_params_backbone" in r else ""))
    pub = r.get("published_params")
    if pub:
        ref = r.get("n_params_backbone", r["n_params"])
        lines.append(f"published      {_count(pub)} ({r.get('published_params_source', '')}); "
                     f"file/published = {ref / float(pub):.4f}")
    else:
        lines.append(f"published      none known ({r.get('published_params_source', '')})")
    lines.append("verdict        loads strictly" if r["loads"] else
                 "verdict        would NOT load: the keys above must match (missing / extra / shapes)")
    return "\n".join(lines)


def _count(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and x % 100_000 else f"{x / 1e6:.1f}M"


@click.group("checkpoint")
def checkpoint() -> None:
    """Look into model checkpoint files before a run."""


@checkpoint.command("inspect")
@click.argument("file", type=click.Path(exists=True))
@click.option("--model", "name", required=True, help="Registered encoder name (ecg_fm, cardiac_fm, csfm, "
              "ecg_jepa, hubert_ecg, st_mem, or a plugin).")
@click.option("--size", type=click.Choice(["full", "demo"]), default="full", show_default=True,
              help="Architecture to compare with (full = the published one); models whose file carries its "
                   "own config ignore it.")
@click.option("--generic", is_flag=True, help="Use the generic key/shape comparison even if the adapter has its "
              "own report.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def inspect_cmd(file: str, name: str, size: str, generic: bool, as_json: bool) -> None:
    """Print what FILE would load into model NAME: loaded, missing and extra keys, shape mismatches, keys
    dropped by name, and the parameter count against the published one. Exit 1 if it would not load."""
    report = inspect(file, name, size=size, generic=generic)
    click.echo(json.dumps(report, indent=1, default=str) if as_json else format_report(report))
    if not report["loads"]:
        raise SystemExit(1)
