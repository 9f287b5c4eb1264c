"""`raybench grid`: cohort -> manifest -> encode -> train -> analyze, each stage skipped when complete.

This module keeps only the progress display, the run folder's config (run.yaml, config_hash.json, the config a
stage command works under) and the stage sequence; the stages (raybench.stage.Stage) live beside the code they
drive. Errors are RaybenchErrors (`PipelineError` for the run folder); the command line prints them.

With no arguments it runs the embedded default: a local Ray instance, the built-in synthetic cohort,
the six demo encoders and the demo protocol (450 + 90 cells). Rerunning after any interruption
finishes only the remaining work.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click

from raybench import progress
from raybench.analysis.analyze_stage import ANALYZE_STAGE, analyze_stage
from raybench.atomic import write_json, write_text
from raybench.cohorts.stage import COHORT_STAGE, MANIFEST_STAGE
from raybench.config import ConfigError, RunConfig, dump_run_config, from_dict, load_run_config
from raybench.encoders.stage import ENCODE_STAGE
from raybench.errors import RaybenchError
from raybench.paths import RunLayout
from raybench.sae.stage import TRAIN_STAGE
from raybench.stage import Stage


class Progress:
    """The run's stage lines (`[i/n] stage running ... / done in s / complete, skipped`), written through the live
    display (raybench.progress) the stages also report their counts to. `before_work(stage)` runs only when a
    stage has work (the pipeline starts Ray there, so a rerun with nothing to do never does)."""

    def __init__(self, stages: list[Stage], echo: Callable[[str], None] | None = None,
                 reporter: progress.Reporter | None = None,
                 before_work: Callable[[Stage], None] | None = None):
        self.n = len(stages)
        self.reporter = reporter or (progress.PlainReporter(echo, timer=False) if echo else progress.current())
        self.before_work = before_work
        self.timings: dict[str, float] = {}

    def run(self, i: int, stage: Stage, cfg: RunConfig, remote: str | None = None, force: bool = False) -> None:
        head = f"[{i}/{self.n}] {stage.name:<9}"
        if not force and stage.is_complete(cfg):
            self.timings[stage.name] = 0.0
            self.reporter.note(f"{head} complete, skipped")
            return
        self.reporter.note(f"{head} running ...")
        t0 = time.perf_counter()
        if self.before_work is not None:
            self.before_work(stage)
        try:
            summary = stage.run(cfg, remote)
        except Exception as err:
            self.reporter.error(f"{head} failed after {time.perf_counter() - t0:.1f} s: {type(err).__name__}")
            raise
        dt = time.perf_counter() - t0
        self.timings[stage.name] = dt
        self.reporter.note(f"{head} done in {dt:6.1f} s" + (f"  ({summary})" if summary else ""))


# ---------------------------------------------------------------- the stage sequence

STAGES: list[Stage] = [COHORT_STAGE, MANIFEST_STAGE, ENCODE_STAGE, TRAIN_STAGE, ANALYZE_STAGE]
"""What `raybench grid` runs, in order; each stage lives beside the code it drives."""


class PipelineError(RaybenchError):
    """The run folder cannot take this run (another config's results, an unreadable run.yaml)."""


def write_run_yaml(cfg: RunConfig, drop_model: bool = False) -> None:
    """Record the resolved config and provenance; refuse to mix two configs in one run folder, except that models
    may be added to `protocol.grid.models` (removed with `drop_model`): raybench.run_changes."""
    import platform
    from importlib.metadata import version

    import raybench

    layout = RunLayout.at(cfg.run_dir)
    from raybench.run_changes import RunChangeError, check_change, new_stamp, read_stamp, stamp_line

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


# ---------------------------------------------------------------- the run's own config (stage commands)

STAMP = "config_hash.json"


def recorded_run_config(run_dir: str | Path) -> tuple[RunConfig | None, str | None]:
    """The config recorded in `run_dir`/run.yaml (None when absent) and the run's config stamp: the hash in the
    stamp (run.yaml's `# stamp:` line, else config_hash.json: raybench.run_changes.read_stamp), else the hash of
    run.yaml's config; None when neither exists."""
    from raybench.analysis.audit import read_run_yaml, run_section
    from raybench.run_changes import read_stamp

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
    from raybench.run_changes import config_diff

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


def stage_config(run_dir: str | None, config_path: str | None, *, demo_fallback: bool = True) -> RunConfig:
    """The config a stage command (`encode`, `train`, `analyze`) works under.

    Without --config: the run folder's own run.yaml (written by `raybench grid` or the first stage command),
    else the embedded demo (or a usage error without `demo_fallback`). With --config: that file, refused when
    its config hash differs from the run's recorded one. `run_dir` defaults to the config's run_dir.
    """
    from raybench.config import demo_run

    given = load_run_config(config_path) if config_path else None
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


RAY_FREE = ("cohort",)
"""Stages that never use Ray: running them does not start it."""


def run_pipeline(cfg: RunConfig, echo: Callable[[str], None] | None = None, allow_incomplete: bool = False,
                 reporter: progress.Reporter | None = None, drop_model: bool = False,
                 until: str | None = None) -> dict[str, float]:
    """Run every stage (up to and including `until`, a stage name, when given). A remote run_dir (s3://...) is
    worked on in a node-local mirror, synced per stage.

    Progress goes to `reporter` (default: a live display in a terminal, else plain periodic lines; with `echo`,
    plain lines through it). Ray starts only before the first stage with work, so a complete run never starts it.
    allow_incomplete: analyze a grid with missing or failed cells (refused otherwise; see `raybench analyze`).
    drop_model: accept a config whose grid.models lacks models of the run folder (raybench.run_changes)."""
    from raybench.storage import check_writable, is_remote, local_mirror, sync_down

    cfg.validate()
    stages = [analyze_stage(allow_incomplete=True) if allow_incomplete and s.name == "analyze" else s
              for s in STAGES]
    if until is not None:
        names = [s.name for s in stages]
        if until not in names:
            raise PipelineError(f"unknown stage {until!r} for until: choose one of {', '.join(names)}")
        stages = stages[:names.index(until) + 1]
    for stage in stages:  # every stage's external inputs, before Ray starts or anything is written
        stage.check(cfg)
    check_writable(cfg.run_dir)
    from raybench.run_lock import run_lock

    with run_lock(cfg.run_dir, "grid"):  # one writer per run folder (or s3:// prefix); released on any exit
        remote = cfg.run_dir if is_remote(cfg.run_dir) else None
        if remote:
            mirror = local_mirror(remote)
            sync_down(remote, mirror)
            cfg = replace(cfg, run_dir=str(mirror))
        layout = RunLayout.at(cfg.run_dir)
        layout.root.mkdir(parents=True, exist_ok=True)
        write_run_yaml(cfg, drop_model=drop_model)
        return _run_stages(cfg, stages, remote, layout, reporter, echo)


def _run_stages(cfg: RunConfig, stages: list[Stage], remote: str | None, layout: RunLayout,
                reporter: progress.Reporter | None, echo: Callable[[str], None] | None) -> dict[str, float]:
    """The stage sequence of run_pipeline, under the run's lock; a remote run syncs up after each stage."""
    from raybench.storage import sync_up

    def start_ray(stage: Stage) -> None:
        if stage.name not in RAY_FREE:
            from raybench.ray_session import init_ray

            init_ray(cfg.resources)

    if reporter is None:
        reporter = progress.PlainReporter(echo) if echo is not None else progress.make_reporter()
    t0 = time.perf_counter()
    with progress.active(reporter):
        runner = Progress(stages, reporter=reporter, before_work=start_ray)
        for i, stage in enumerate(stages, 1):
            runner.run(i, stage, cfg, remote)
            if remote:
                sync_up(layout.root, remote)
    runner.timings["total"] = time.perf_counter() - t0
    return runner.timings


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="YAML run config (see `raybench config`). Default: the embedded demo.")
@click.option("--run-dir", default=None, help="Run folder (local path). Default: runs/demo or the config's run_dir.")
@click.option("--address", default=None, help="Ray cluster address (default: RAY_ADDRESS, else a local instance).")
@click.option("--num-cpus", type=int, default=None, help="CPUs for a local Ray instance.")
@click.option("--allow-incomplete", is_flag=True,
              help="Analyze even when cells are missing or failed (refused by default, naming them); every table "
                   "then flags its short denominators.")
@click.option("--drop-model", is_flag=True,
              help="Accept a config that removes models from an existing run folder's grid.models (refused by "
                   "default); added models need no flag: only they are encoded and trained.")
@click.option("--until", type=click.Choice([s.name for s in STAGES]), default=None,
              help="Stop after this stage (e.g. train on a cluster, analyze later); `raybench grid` again goes on.")
def grid(config_path: str | None, run_dir: str | None, address: str | None, num_cpus: int | None,
         allow_incomplete: bool, drop_model: bool, until: str | None) -> None:
    """Run the whole audit: cohort -> manifest -> encode -> train -> analyze -> report."""
    cfg = load_run_config(config_path)
    if run_dir:
        cfg = replace(cfg, run_dir=run_dir)
    if address or num_cpus:
        cfg = replace(cfg, resources=replace(cfg.resources, address=address or cfg.resources.address,
                                             num_cpus=num_cpus or cfg.resources.num_cpus))
    timings = run_pipeline(cfg, allow_incomplete=allow_incomplete, drop_model=drop_model, until=until)
    if until is not None and until != STAGES[-1].name:
        click.echo(f"total {timings['total']:.1f} s; stopped after {until} (`raybench grid` again goes on)")
        return
    from raybench.storage import is_remote

    report = f"{cfg.run_dir.rstrip('/')}/report.html" if is_remote(cfg.run_dir) else \
        RunLayout.at(cfg.run_dir).report.resolve()
    click.echo(f"total {timings['total']:.1f} s; report: {report}")
