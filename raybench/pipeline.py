"""`raybench grid`: manifest -> encode -> train -> analyze -> report, each stage skipped when complete.

With no arguments it runs the embedded default: a local Ray instance, the built-in synthetic cohort,
the six demo encoders and the demo protocol (450 + 90 cells). Rerunning after any interruption
finishes only the remaining work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import click

from raybench.config import RunConfig, dump_run_config, load_run_config
from raybench.io import read_json, write_json, write_text
from raybench.paths import RunLayout


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
    from raybench.cohorts.manifest import build_ptbxl_manifest, load_manifest

    layout = RunLayout.at(cfg.run_dir)
    if cfg.cohort.kind == "mimic":
        from raybench.cohorts.mimic import build_mimic_manifest

        build_mimic_manifest(Path(cfg.cohort.root), layout.manifest_dir)
    else:
        build_ptbxl_manifest(cohort_root(cfg), layout.manifest_dir, sampling_rate=cfg.cohort.sampling_rate,
                             concepts=cfg.cohort.concepts)
    df, info = load_manifest(layout.manifest)
    counts = df["split"].value_counts().to_dict()
    return (f"{len(df)} records ({counts.get('train', 0)}/{counts.get('val', 0)}/{counts.get('test', 0)}), "
            f"{len(info.concepts)} concepts")


def _encode_complete(cfg: RunConfig) -> bool:
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(cfg.run_dir)
    if not layout.manifest.exists():
        return False
    store = ActivationStore(layout.activations_dir)
    for model in cfg.protocol.grid.models:
        indexes = sorted((layout.activations_dir / model).glob("layer_*/index.json"))
        if not indexes:
            return False
        idx = read_json(indexes[0])
        from raybench.sae.cells import audited_layers

        for layer in audited_layers(cfg.protocol, int(idx["n_layers"])):
            if not store.is_complete(model, layer, idx["manifest_hash"], idx["fingerprint"]):
                return False
    return True


def _encode_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.encoders.base import EncoderSpec, build_encoder
    from raybench.encoders.extract import extract_activations
    from raybench.sae.cells import audited_layers

    layout = RunLayout.at(cfg.run_dir)
    enc = cfg.encoders
    for model in cfg.protocol.grid.models:
        spec = EncoderSpec(name=model, size=enc.size, checkpoint=enc.checkpoints.get(model), profile=enc.profile,
                           init_seed=enc.init_seed)
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
    return bool(len(table)) and bool((table["status"] == "ok").all()) and \
        set(table["config_hash"]) == {cfg.config_hash()}


def _train_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.sae.grid import run_grid

    table = run_grid(cfg, remote_uri=remote)
    ok = int((table["status"] == "ok").sum())
    return f"{ok}/{len(table)} cells ok"


def _analyze_complete(cfg: RunConfig) -> bool:
    layout = RunLayout.at(cfg.run_dir)
    return layout.report.exists() and layout.report.stat().st_mtime >= layout.cells_table.stat().st_mtime \
        if layout.cells_table.exists() else False


def _analyze_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.analysis.audit import release_audit
    from raybench.analysis.figures import make_figures
    from raybench.analysis.report import render_report
    from raybench.analysis.secondary import run_secondary
    from raybench.analysis.tables import analyze_run

    layout = RunLayout.at(cfg.run_dir)
    tables = analyze_run(layout.root, cfg.protocol, cohort_kind=cfg.cohort.kind)
    secondary = run_secondary(layout.root, cfg.protocol, cfg)
    figures = make_figures(layout.root)
    audit = release_audit(layout.root, cfg.protocol)
    render_report(layout.root)
    return f"{len(tables) + len(secondary)} tables, {len(figures)} figures; audit: {audit.summary}"


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


def run_pipeline(cfg: RunConfig, echo: Callable[[str], None] = click.echo) -> dict[str, float]:
    """Run every stage. A remote run_dir (s3://...) is worked on in a node-local mirror, synced per stage."""
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
    progress = Progress(STAGES, echo)
    t0 = time.perf_counter()
    for i, stage in enumerate(STAGES, 1):
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
def grid(config_path: str | None, run_dir: str | None, address: str | None, num_cpus: int | None) -> None:
    """Run the whole audit: cohort -> manifest -> encode -> train -> analyze -> report."""
    cfg = load_run_config(config_path)
    if run_dir:
        cfg = replace(cfg, run_dir=run_dir)
    if address or num_cpus:
        cfg = replace(cfg, resources=replace(cfg.resources, address=address or cfg.resources.address,
                                             num_cpus=num_cpus or cfg.resources.num_cpus))
    timings = run_pipeline(cfg)
    from raybench.storage import is_remote

    report = f"{cfg.run_dir.rstrip('/')}/report.html" if is_remote(cfg.run_dir) else \
        RunLayout.at(cfg.run_dir).report.resolve()
    click.echo(f"total {timings['total']:.1f} s; report: {report}")
