"""Changing the config of an existing run folder: the model list may grow (or, asked for, shrink); nothing else.

A cell's SAE depends on the config and on its own model's activations only, never on which other models the grid
holds. So a config that differs from the run's only in `protocol.grid.models` may reuse every cell and activation
store already there: the encode stage then encodes only the new models, the train stage trains only their cells
and the analyze stage re-runs over all models (its completion is "report newer than the cells table").

The run's stamp (a `# stamp:` line of run.yaml, copied to `config_hash.json`) records the current config hash,
its `base_hash` (the config hash with the model list removed), the model list, and `compatible_hashes`: the earlier
config hashes of this run, which differ from the current one only by the model list. A cell counts as trained under
the current config when it records the current hash or one of those (raybench.sae.provenance). Any other change is
refused, naming the keys.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raybench.config import RunConfig
from raybench.errors import RaybenchError

STAMP = "config_hash.json"
STAMP_LINE = "# stamp: "  # the stamp as one comment line of run.yaml: written with the config in one atomic rename
MODELS_KEY = "protocol.grid.models"


class RunChangeError(RaybenchError, ValueError):
    """The run folder holds results of a config that differs in more than the model list (or loses a model)."""


@dataclass(frozen=True)
class ModelChange:
    """How the model list of a run changes."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def base_hash(cfg: RunConfig) -> str:
    """The config hash with `protocol.grid.models` emptied: equal for configs that differ only in their models."""
    grid = dataclasses.replace(cfg.protocol.grid, models=())
    return dataclasses.replace(cfg, protocol=dataclasses.replace(cfg.protocol, grid=grid)).config_hash()


def config_diff(old: RunConfig, new: RunConfig) -> list[str]:
    """Dotted keys of what determines results (RunConfig.hashed_config) whose values differ, sorted."""
    return sorted(_diff(old.hashed_config(), new.hashed_config(), ""))


def _diff(a: Any, b: Any, prefix: str) -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k for key in set(a) | set(b) for k in _diff(a.get(key), b.get(key), f"{prefix}.{key}".lstrip("."))}
    return set() if a == b else {prefix}


def check_change(recorded: RunConfig | None, stamp: dict[str, Any] | None, cfg: RunConfig, *,
                 drop_model: bool = False, where: str = "the run folder") -> ModelChange:
    """Whether `cfg` may write into a run folder made with `recorded` (its run.yaml config) and `stamp` (its
    config_hash.json); a RunChangeError names what differs and the fix. Returns the models added and removed."""
    if stamp is None or stamp.get("config_hash") == cfg.config_hash():
        return ModelChange()
    old_hash = stamp.get("config_hash")
    if recorded is None or recorded.config_hash() != old_hash:
        raise RunChangeError(
            f"{where} holds results of another config (hash {old_hash}, now {cfg.config_hash()}) and its run.yaml "
            f"does not record that config, so what differs cannot be listed; use a new --run-dir, or delete the "
            "folder to start over")
    keys = [k for k in config_diff(recorded, cfg) if k != MODELS_KEY]
    if keys:
        old, new = recorded.hashed_config(), cfg.hashed_config()
        shown = "; ".join(f"{k}: {_at(old, k)!r} -> {_at(new, k)!r}" for k in keys[:12])
        more = f" (and {len(keys) - 12} more)" if len(keys) > 12 else ""
        raise RunChangeError(
            f"{where} holds results of another config (hash {old_hash}, now {cfg.config_hash()}); keys that differ: "
            f"{shown}{more}. Only {MODELS_KEY} may change in an existing run (added models are encoded and trained "
            "alone); use a new --run-dir for any other change, or delete the folder to start over")
    before, after = recorded.protocol.grid.models, cfg.protocol.grid.models
    change = ModelChange(tuple(m for m in after if m not in before), tuple(m for m in before if m not in after))
    if change.removed and not drop_model:
        raise RunChangeError(
            f"the config drops model(s) {list(change.removed)} from {where} ({MODELS_KEY} was {list(before)}); "
            "pass --drop-model to analyze the run without them (their cells and stores stay on disk), or put them "
            "back in the config")
    return change


def _at(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def new_stamp(old: dict[str, Any] | None, cfg: RunConfig) -> dict[str, Any]:
    """config_hash.json after `cfg` was accepted (check_change): the earlier hashes stay compatible."""
    h = cfg.config_hash()
    earlier = set((old or {}).get("compatible_hashes", []))
    if old is not None and old.get("config_hash"):
        earlier.add(str(old["config_hash"]))
    return {"config_hash": h, "base_hash": base_hash(cfg), "models": list(cfg.protocol.grid.models),
            "compatible_hashes": sorted(earlier - {h})}


def read_stamp(run_root: str | Path) -> dict[str, Any] | None:
    """The run's stamp: the `# stamp:` line of run.yaml (written in one rename with the config it stamps), else
    config_hash.json (run folders of an older raybench, which wrote only that); None when there is neither.

    config_hash.json is still written after run.yaml, as a copy: a kill between the two leaves it stale, never
    the record, so a rerun is not refused for a config change that was accepted."""
    root = Path(run_root)
    try:
        text = (root / "run.yaml").read_text()
    except FileNotFoundError:
        text = ""
    for line in text.splitlines():
        if not line.startswith("#"):
            break  # only the header comments
        if line.startswith(STAMP_LINE):
            stamp = json.loads(line[len(STAMP_LINE):])
            return stamp if isinstance(stamp, dict) else None
    path = root / STAMP
    return json.loads(path.read_text()) if path.exists() else None


def stamp_line(stamp: dict[str, Any]) -> str:
    """The `# stamp:` header line of run.yaml for `stamp` (new_stamp)."""
    return f"{STAMP_LINE}{json.dumps(stamp, sort_keys=True)}\n"


def compatible_hashes(run_root: str | Path, config_hash: str) -> frozenset[str]:
    """The config hashes a cell of this run may record to count as trained under `config_hash`: that hash, and the
    run's earlier ones (same config but the model list) when its stamp is at `config_hash`."""
    try:
        stamp = read_stamp(run_root)
    except (OSError, ValueError):
        return frozenset({config_hash})
    if not isinstance(stamp, dict) or stamp.get("config_hash") != config_hash:
        return frozenset({config_hash})
    return frozenset({config_hash, *map(str, stamp.get("compatible_hashes", []))})
