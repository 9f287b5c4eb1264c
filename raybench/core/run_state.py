"""The run folder's state: run.yaml (the resolved config and its stamp), the config a stage command works under,
and which config changes an existing run folder accepts. The pipeline writes it, stages and analyses read it.

Changing the config of an existing run folder: the model list may grow (or, asked for, shrink); nothing else.

A cell's SAE depends on the config and on its own model's activations only, never on which other models the grid
holds. So a config that differs from the run's only in `protocol.grid.models` may reuse every cell and activation
store already there: the encode stage then encodes only the new models, the train stage trains only their cells
and the analyze stage re-runs over all models (its completion is "report newer than the cells table").

The run's stamp (a `# stamp:` line of run.yaml, copied to `config_hash.json`) records the current config hash,
its `base_hash` (the config hash with the model list removed), the model list, and `compatible_hashes`: the earlier
config hashes of this run, which differ from the current one only by the model list. A cell counts as trained under
the current config when it records the current hash or one of those (raybench.sae.freshness). Any other change is
refused, naming the keys.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from raybench.core.atomic import write_json, write_text
from raybench.core.config import ConfigError, Protocol, RunConfig, dump_run_config, from_dict, load_run_config
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout

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


# ---------------------------------------------------------------- reading run.yaml

def read_run_yaml(root: str | Path) -> dict[str, Any] | None:
    """run.yaml as a mapping, or None when absent (safe_load only: no code runs from config)."""
    path = RunLayout.at(root).run_yaml
    if not path.exists():
        return None
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return raw


def run_section(raw: dict[str, Any] | None, name: str) -> dict[str, Any] | None:
    """A config section from run.yaml, whether it sits at the top level or under `config:`."""
    if not raw:
        return None
    for holder in (raw, raw.get("config"), raw.get("run_config"), raw.get("resolved")):
        if isinstance(holder, dict) and isinstance(holder.get(name), dict):
            return holder[name]
    return None


def run_protocol(root: str | Path) -> Protocol | None:
    """The protocol recorded in run.yaml, or None when the run has no run.yaml (or no protocol in it)."""
    section = run_section(read_run_yaml(root), "protocol")
    if section is None:
        return None
    try:
        protocol = from_dict(Protocol, section, "protocol")
        protocol.validate()
    except ConfigError as err:
        raise ConfigError(f"{RunLayout.at(root).run_yaml}: {err}") from None
    return protocol


# ---------------------------------------------------------------- writing run.yaml; a stage command's config

class PipelineError(RaybenchError):
    """The run folder cannot take this run (another config's results, an unreadable run.yaml)."""


def write_run_yaml(cfg: RunConfig, drop_model: bool = False) -> None:
    """Record the resolved config and provenance; refuse to mix two configs in one run folder, except that models
    may be added to `protocol.grid.models` (removed with `drop_model`): raybench.core.run_state."""
    import platform
    from importlib.metadata import version

    import raybench

    layout = RunLayout.at(cfg.run_dir)
    old = read_stamp(layout.root)
    if old is not None and old.get("config_hash") != cfg.config_hash():
        try:
            recorded = recorded_run_config(layout.root)[0]
        except ConfigError:
            recorded = None  # unreadable run.yaml: the refusal names both hashes
        try:
            check_change(recorded, old, cfg, drop_model=drop_model, where=str(layout.root))
        except RunChangeError as err:
            raise PipelineError(str(err)) from None
    provenance = (f"# raybench {raybench.__version__}, python {platform.python_version()}, ray {version('ray')}, "
                  f"torch {version('torch')}\n# config_hash: {cfg.config_hash()}\n")
    stamp = new_stamp(old, cfg)
    # one atomic write records config and stamp together; config_hash.json after it is a copy for older readers
    write_text(layout.run_yaml, provenance + stamp_line(stamp) + dump_run_config(cfg))
    write_json(layout.root / STAMP, stamp)



def recorded_run_config(run_dir: str | Path) -> tuple[RunConfig | None, str | None]:
    """The config recorded in `run_dir`/run.yaml (None when absent) and the run's config stamp: the hash in the
    stamp (run.yaml's `# stamp:` line, else config_hash.json: raybench.core.run_state.read_stamp), else the hash of
    run.yaml's config; None when neither exists."""
    layout = RunLayout.at(run_dir)
    recorded = read_stamp(layout.root)
    stamp = str(recorded["config_hash"]) if recorded is not None else None
    raw = read_run_yaml(layout.root)
    if raw is None:
        return None, stamp
    names = [f.name for f in dataclasses.fields(RunConfig) if f.name != "run_dir"]  # every section, new ones too
    sections = {k: run_section(raw, k) for k in names}
    if sections["protocol"] is None:
        raise ConfigError(f"{layout.run_yaml} holds no protocol section: pass --config with the run's config")
    try:
        cfg = from_dict(RunConfig, {"run_dir": str(run_dir), **{k: v for k, v in sections.items() if v is not None}},
                        "run.yaml").validate()
    except ConfigError as err:
        raise ConfigError(f"{layout.run_yaml}: {err}") from None
    return cfg, stamp or cfg.config_hash()


def check_config_stamp(cfg: RunConfig, stamp: str | None, what: str) -> None:
    """Refuse `cfg` (described by `what`, e.g. "--config x.yaml") when the run folder holds another config."""
    if stamp is None or cfg.config_hash() == stamp:
        return
    try:
        recorded = recorded_run_config(cfg.run_dir)[0]
    except ConfigError:
        recorded = None
    keys = (f" (keys that differ: {', '.join(config_diff(recorded, cfg))})"
            if recorded is not None and recorded.config_hash() == stamp else "")
    raise PipelineError(
        f"{what} has config hash {cfg.config_hash()}, but the run folder {cfg.run_dir} was made with config hash "
        f"{stamp} (its run.yaml / {STAMP}){keys}, and one run must not mix results of two configs. To continue this "
        "run, leave out --config (and any option that changes results): stage commands read the run's own run.yaml; "
        "to add models to grid.models, run `raybench grid --config` on the run folder; to run this config, give it a "
        "new --run-dir")


def stage_config(run_dir: str | None, config_path: str | None, *, demo_fallback: bool = True,
                 trust_destinations: bool = False) -> RunConfig:
    """The config a stage command (`encode`, `train`, `analyze`) works under.

    Without --config: the run folder's own run.yaml (written by `raybench grid` or the first stage command),
    else the embedded demo (or a usage error without `demo_fallback`). With --config: that file, refused when
    its config hash differs from the run's recorded one. `run_dir` defaults to the config's run_dir; a remote one,
    or a non-local resources.address, read from --config needs `trust_destinations` (raybench.core.destinations).
    """
    from raybench.core.config import demo_run

    given = load_run_config(config_path) if config_path else None
    if given is not None:
        from raybench.core.destinations import check_destinations

        check_destinations(given, f"--config {config_path}", run_dir_given=run_dir is not None, address_given=False,
                           trusted=trust_destinations)
    run_dir = run_dir or (given.run_dir if given is not None else demo_run().run_dir)
    recorded, stamp = (None, None) if "://" in run_dir else recorded_run_config(run_dir)
    if given is not None:
        cfg = replace(given, run_dir=run_dir)
        check_config_stamp(cfg, stamp, f"--config {config_path}")
        return cfg
    if recorded is None:
        if not demo_fallback:
            raise PipelineError(f"{RunLayout.at(run_dir).run_yaml} not found: pass --config with the run's config "
                                   "(the same file given to `raybench grid`)")
        cfg = replace(demo_run(), run_dir=run_dir)
        check_config_stamp(cfg, stamp, "the embedded demo config (no run.yaml)")
        return cfg
    check_config_stamp(recorded, stamp, f"{RunLayout.at(run_dir).run_yaml} (edited?)")
    return recorded


def stamp_run(cfg: RunConfig, what: str = "this config") -> None:
    """Before a stage command writes into an existing local run folder: refuse a config other than the run's, and
    record run.yaml + config_hash.json when the run has none yet, so later stages read the same config."""
    if "://" in cfg.run_dir or not Path(cfg.run_dir).is_dir():
        return
    recorded, stamp = recorded_run_config(cfg.run_dir)
    check_config_stamp(cfg, stamp, what)
    if recorded is None:
        write_run_yaml(cfg)
