"""`raybench grid`: manifest -> encode -> train -> analyze -> report, each stage skipped when complete.

With no arguments it runs the embedded default: a local Ray instance, the built-in synthetic cohort,
the six demo encoders and the demo protocol (450 + 90 cells). Rerunning after any interruption
finishes only the remaining work.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from raybench.atomic import read_json, write_json, write_text
from raybench.config import ConfigError, RunConfig, dump_run_config, from_dict, load_run_config
from raybench.paths import RunLayout

if TYPE_CHECKING:
    from raybench.encoders.base import EncoderSpec


@dataclass(frozen=True)
class Stage:
    name: str
    is_complete: Callable[[RunConfig], bool]
    run: Callable[[RunConfig, str | None], str | None]  # (work config, remote run URI) -> summary line


class Progress:
    """One progress display for the whole run: a line per stage with its status and wall time."""

    def __init__(self, stages: list[Stage], echo: Callable[[str], None] = click.echo):
        self.n = len(stages)
        self.echo = echo
        self.timings: dict[str, float] = {}

    def run(self, i: int, stage: Stage, cfg: RunConfig, remote: str | None = None, force: bool = False) -> None:
        head = f"[{i}/{self.n}] {stage.name:<9}"
        if not force and stage.is_complete(cfg):
            self.timings[stage.name] = 0.0
            self.echo(f"{head} complete, skipped")
            return
        self.echo(f"{head} running ...")
        t0 = time.perf_counter()
        summary = stage.run(cfg, remote)
        dt = time.perf_counter() - t0
        self.timings[stage.name] = dt
        self.echo(f"{head} done in {dt:6.1f} s" + (f"  ({summary})" if summary else ""))


# ---------------------------------------------------------------- stages

def _cohort_complete(cfg: RunConfig) -> bool:
    if cfg.cohort.kind != "synth":
        return True
    return (RunLayout.at(cfg.run_dir).cohort_dir / "ptbxl_database.csv").exists()


def _cohort_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.cohorts.synth import generate_synth_cohort

    c = cfg.cohort
    out = RunLayout.at(cfg.run_dir).cohort_dir
    generate_synth_cohort(out, n_records=c.records, n_patients=c.patients, seed=c.seed, bad_fraction=c.bad_fraction)
    return f"{c.records} synthetic records, {c.patients} patients"


def cohort_root(cfg: RunConfig) -> Path:
    if cfg.cohort.kind == "synth":
        return RunLayout.at(cfg.run_dir).cohort_dir
    return Path(cfg.cohort.root)


def _manifest_complete(cfg: RunConfig) -> bool:
    layout = RunLayout.at(cfg.run_dir)
    return layout.manifest.exists() and layout.manifest_summary.exists()


def _manifest_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.ptbxl import build_ptbxl_manifest

    layout = RunLayout.at(cfg.run_dir)
    if cfg.cohort.kind == "mimic":
        from raybench.cohorts.mimic import build_mimic_manifest

        c = cfg.cohort
        build_mimic_manifest(Path(c.root), layout.manifest_dir, max_records=c.max_records,
                             concept_extractor=c.concept_extractor, record_pool=c.record_pool, admissions=c.admissions)
    else:
        build_ptbxl_manifest(cohort_root(cfg), layout.manifest_dir, sampling_rate=cfg.cohort.sampling_rate,
                             concepts=cfg.cohort.concepts)
    df, info = load_manifest(layout.manifest)
    counts = df["split"].value_counts().to_dict()
    return (f"{len(df)} records ({counts.get('train', 0)}/{counts.get('val', 0)}/{counts.get('test', 0)}), "
            f"{len(info.concepts)} concepts")


def encoder_spec(cfg: RunConfig, model: str) -> EncoderSpec:
    """The EncoderSpec of `model` under the run's encoder config (what `encode` extracts with)."""
    from raybench.encoders.base import EncoderSpec

    enc = cfg.encoders
    return EncoderSpec(name=model, size=enc.size, checkpoint=enc.checkpoints.get(model), profile=enc.profile,
                       init_seed=enc.init_seed)


def _encode_complete(cfg: RunConfig) -> bool:
    """Every audited store matches the *current* manifest hash and encoder fingerprint (not its own index)."""
    from raybench.cohorts.manifest import ManifestError, load_manifest
    from raybench.config import audited_layers
    from raybench.encoders.base import build_encoder
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(cfg.run_dir)
    if not layout.manifest.exists():
        return False
    try:
        manifest_hash = load_manifest(layout.manifest)[1].manifest_hash
    except ManifestError:
        return False  # the encode stage reports what is wrong with it
    store = ActivationStore(layout.activations_dir)
    for model in cfg.protocol.grid.models:
        encoder = build_encoder(encoder_spec(cfg, model))
        fingerprint, n_layers = encoder.fingerprint(), int(encoder.n_layers)
        del encoder
        for layer in audited_layers(cfg.protocol, n_layers):
            if not store.is_complete(model, layer, manifest_hash, fingerprint):
                return False
    return True


def _encode_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.config import audited_layers
    from raybench.encoders.base import build_encoder
    from raybench.encoders.extract import extract_activations

    layout = RunLayout.at(cfg.run_dir)
    enc = cfg.encoders
    for model in cfg.protocol.grid.models:
        spec = encoder_spec(cfg, model)
        n_layers = build_encoder(spec).n_layers
        extract_activations(layout.manifest, layout.root, spec, enc, layers=audited_layers(cfg.protocol, n_layers),
                            progress=False)
    return f"{len(cfg.protocol.grid.models)} encoders"


def _train_complete(cfg: RunConfig) -> bool:
    import pandas as pd

    layout = RunLayout.at(cfg.run_dir)
    if not layout.cells_table.exists():
        return False
    table = pd.read_parquet(layout.cells_table)
    if not (bool(len(table)) and bool((table["status"] == "ok").all())
            and set(table["config_hash"]) == {cfg.config_hash()}):
        return False
    # the table may predate new activation stores or hand-copied cells: every cell must match them itself
    from raybench.encoders.store import ActivationStore, StoreError
    from raybench.sae.cells import build_cells
    from raybench.sae.provenance import cell_complete, expected_provenance

    try:
        cells = build_cells(cfg.protocol, ActivationStore.for_run(layout.root).model_dims(cfg.protocol.grid.models))
    except (StoreError, KeyError):
        return False
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    return set(table["cell_id"]) == {c.cell_id for c in cells} and all(
        expect[c.cell_id] is not None and cell_complete(layout.cell_dir(c.cell_id), expect[c.cell_id])
        for c in cells)


def _train_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.sae.grid import run_grid

    table = run_grid(cfg, remote_uri=remote)
    ok = int((table["status"] == "ok").sum())
    return f"{ok}/{len(table)} cells ok"


def _analyze_complete(cfg: RunConfig) -> bool:
    layout = RunLayout.at(cfg.run_dir)
    return layout.report.exists() and layout.report.stat().st_mtime >= layout.cells_table.stat().st_mtime \
        if layout.cells_table.exists() else False


def _analyze_run(cfg: RunConfig, remote: str | None = None, allow_incomplete: bool = False) -> str:
    """The analyze stage, exactly as `raybench analyze` runs it (raybench.analysis.stage.run_analyze_stage)."""
    from raybench.analysis.completeness import IncompleteGridError
    from raybench.analysis.stage import run_analyze_stage

    try:
        return run_analyze_stage(cfg, allow_incomplete=allow_incomplete).summary()
    except IncompleteGridError as err:
        raise click.ClickException(str(err)) from None


STAGES = [
    Stage("cohort", _cohort_complete, _cohort_run),
    Stage("manifest", _manifest_complete, _manifest_run),
    Stage("encode", _encode_complete, _encode_run),
    Stage("train", _train_complete, _train_run),
    Stage("analyze", _analyze_complete, _analyze_run),
]


def write_run_yaml(cfg: RunConfig) -> None:
    """Record the resolved config and provenance; refuse to mix two configs in one run folder."""
    import platform

    import ray
    import torch

    import raybench

    layout = RunLayout.at(cfg.run_dir)
    stamp = layout.root / "config_hash.json"
    if stamp.exists():
        old = read_json(stamp)["config_hash"]
        if old != cfg.config_hash():
            raise click.ClickException(
                f"{layout.root} holds results of another config (hash {old}, now {cfg.config_hash()}); "
                "use a new --run-dir, or delete the folder to start over")
    provenance = (f"# raybench {raybench.__version__}, python {platform.python_version()}, ray {ray.__version__}, "
                  f"torch {torch.__version__}\n# config_hash: {cfg.config_hash()}\n")
    write_text(layout.run_yaml, provenance + dump_run_config(cfg))
    write_json(stamp, {"config_hash": cfg.config_hash()})


# ---------------------------------------------------------------- the run's own config (stage commands)

STAMP = "config_hash.json"


def recorded_run_config(run_dir: str | Path) -> tuple[RunConfig | None, str | None]:
    """The config recorded in `run_dir`/run.yaml (None when absent) and the run's config stamp: the hash in
    config_hash.json (written beside run.yaml), else the hash of run.yaml's config; None when neither exists."""
    from raybench.analysis.audit import read_run_yaml, run_section

    layout = RunLayout.at(run_dir)
    stamp_path = layout.root / STAMP
    stamp = str(read_json(stamp_path)["config_hash"]) if stamp_path.exists() else None
    raw = read_run_yaml(layout.root)
    if raw is None:
        return None, stamp
    sections = {k: run_section(raw, k) for k in ("protocol", "cohort", "encoders", "resources")}
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
    raise click.ClickException(
        f"{what} has config hash {cfg.config_hash()}, but the run folder {cfg.run_dir} was made with config hash "
        f"{stamp} (its run.yaml / {STAMP}), and one run must not mix results of two configs. To continue this run, "
        "leave out --config (and any option that changes results): stage commands read the run's own run.yaml; "
        "to run this config, give it a new --run-dir")


def stage_config(run_dir: str | None, config_path: str | None, *, demo_fallback: bool = True) -> RunConfig:
    """The config a stage command (`encode`, `train`, `analyze`) works under.

    Without --config: the run folder's own run.yaml (written by `raybench grid` or the first stage command),
    else the embedded demo (or a usage error without `demo_fallback`). With --config: that file, refused when
    its config hash differs from the run's recorded one. `run_dir` defaults to the config's run_dir.
    """
    from raybench.config import demo_run

    try:
        given = load_run_config(config_path) if config_path else None
        run_dir = run_dir or (given.run_dir if given is not None else demo_run().run_dir)
        recorded, stamp = (None, None) if "://" in run_dir else recorded_run_config(run_dir)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    if given is not None:
        cfg = replace(given, run_dir=run_dir)
        check_config_stamp(cfg, stamp, f"--config {config_path}")
        return cfg
    if recorded is None:
        if not demo_fallback:
            raise click.UsageError(f"{RunLayout.at(run_dir).run_yaml} not found: pass --config with the run's config "
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
    try:
        recorded, stamp = recorded_run_config(cfg.run_dir)
    except ConfigError as err:
        raise click.ClickException(str(err)) from None
    check_config_stamp(cfg, stamp, what)
    if recorded is None:
        write_run_yaml(cfg)


def run_pipeline(cfg: RunConfig, echo: Callable[[str], None] = click.echo,
                 allow_incomplete: bool = False) -> dict[str, float]:
    """Run every stage. A remote run_dir (s3://...) is worked on in a node-local mirror, synced per stage.

    allow_incomplete: analyze a grid with missing or failed cells (refused otherwise; see `raybench analyze`)."""
    from raybench.ray_session import init_ray
    from raybench.storage import StorageError, check_writable, is_remote, local_mirror, sync_down, sync_up

    cfg.validate()
    try:
        check_writable(cfg.run_dir)
    except StorageError as err:
        raise click.ClickException(str(err)) from None
    remote = cfg.run_dir if is_remote(cfg.run_dir) else None
    if remote:
        mirror = local_mirror(remote)
        sync_down(remote, mirror)
        cfg = replace(cfg, run_dir=str(mirror))
    layout = RunLayout.at(cfg.run_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    write_run_yaml(cfg)
    init_ray(cfg.resources)
    stages = [replace(s, run=functools.partial(_analyze_run, allow_incomplete=True))
              if allow_incomplete and s.name == "analyze" else s for s in STAGES]
    progress = Progress(stages, echo)
    t0 = time.perf_counter()
    for i, stage in enumerate(stages, 1):
        progress.run(i, stage, cfg, remote)
        if remote:
            sync_up(layout.root, remote)
    progress.timings["total"] = time.perf_counter() - t0
    return progress.timings


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="YAML run config (see `raybench config`). Default: the embedded demo.")
@click.option("--run-dir", default=None, help="Run folder (local path). Default: runs/demo or the config's run_dir.")
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local instance).")
@click.option("--num-cpus", type=int, default=None, help="CPUs for a local Ray instance.")
@click.option("--allow-incomplete", is_flag=True,
              help="Analyze even when cells are missing or failed (refused by default, naming them); every table "
                   "then flags its short denominators.")
def grid(config_path: str | None, run_dir: str | None, address: str | None, num_cpus: int | None,
         allow_incomplete: bool) -> None:
    """Run the whole audit: cohort -> manifest -> encode -> train -> analyze -> report."""
    cfg = load_run_config(config_path)
    if run_dir:
        cfg = replace(cfg, run_dir=run_dir)
    if address or num_cpus:
        cfg = replace(cfg, resources=replace(cfg.resources, address=address or cfg.resources.address,
                                             num_cpus=num_cpus or cfg.resources.num_cpus))
    timings = run_pipeline(cfg, allow_incomplete=allow_incomplete)
    from raybench.storage import is_remote

    report = f"{cfg.run_dir.rstrip('/')}/report.html" if is_remote(cfg.run_dir) else \
        RunLayout.at(cfg.run_dir).report.resolve()
    click.echo(f"total {timings['total']:.1f} s; report: {report}")
