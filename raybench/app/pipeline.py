"""`raybench grid`: cohort -> manifest -> encode -> train -> analyze, each stage skipped when complete.

This module keeps only the progress display, the run folder's config (run.yaml, config_hash.json, the config a
stage command works under) and the stage sequence; the stages (raybench.infra.stage.Stage) live beside the code they
drive. Errors are RaybenchErrors (`PipelineError` for the run folder); the command line prints them.

With no arguments it runs the embedded default: a local Ray instance, the built-in synthetic cohort,
the six demo encoders and the demo protocol (450 + 90 cells). Rerunning after any interruption
finishes only the remaining work.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import click

from raybench.analysis.stage import ANALYZE_STAGE, analyze_stage
from raybench.cohorts.stage import COHORT_STAGE, MANIFEST_STAGE
from raybench.core.config import RunConfig, load_run_config
from raybench.core.paths import RunLayout
from raybench.core.run_state import PipelineError, write_run_yaml
from raybench.encoders.stage import ENCODE_STAGE
from raybench.infra import progress
from raybench.infra.stage import Stage
from raybench.sae.stage import TRAIN_STAGE


class Progress:
    """The run's stage lines (`[i/n] stage running ... / done in s / complete, skipped`), written through the live
    display (raybench.infra.progress) the stages also report their counts to. `before_work(stage)` runs only when a
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
    drop_model: accept a config whose grid.models lacks models of the run folder (raybench.core.run_state)."""
    from raybench.infra.storage import check_writable, is_remote, local_mirror, sync_down

    cfg.validate()
    stages = [analyze_stage(allow_incomplete=True) if allow_incomplete and s.name == "analyze" else s
              for s in STAGES]
    for stage in stages:  # every stage's external inputs (models, checkpoints), before Ray starts or anything
        stage.check(cfg)  # is written, even for stages after `until`
    if until is not None:
        names = [s.name for s in stages]
        if until not in names:
            raise PipelineError(f"unknown stage {until!r} for until: choose one of {', '.join(names)}")
        stages = stages[:names.index(until) + 1]
    check_writable(cfg.run_dir)
    from raybench.infra.run_lock import run_lock

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
    from raybench.infra.storage import sync_up

    def start_ray(stage: Stage) -> None:
        if stage.name not in RAY_FREE:
            from raybench.infra.ray_session import init_ray

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
@click.option("--trust-config-destinations", "trust_destinations", is_flag=True,
              help="Accept a remote run_dir or a non-local resources.address from the --config file (refused "
                   "otherwise; never for credentialed cohorts: give those on the command line).")
def grid(config_path: str | None, run_dir: str | None, address: str | None, num_cpus: int | None,
         allow_incomplete: bool, drop_model: bool, until: str | None, trust_destinations: bool = False) -> None:
    """Run the whole audit: cohort -> manifest -> encode -> train -> analyze -> report."""
    cfg = load_run_config(config_path)
    if config_path is not None:  # where the data and the driver go: not chosen by a config file unasked
        from raybench.core.destinations import check_destinations

        check_destinations(cfg, f"--config {config_path}", run_dir_given=bool(run_dir), address_given=bool(address),
                           trusted=trust_destinations)
    if run_dir:
        cfg = replace(cfg, run_dir=run_dir)
    if address or num_cpus:
        cfg = replace(cfg, resources=replace(cfg.resources, address=address or cfg.resources.address,
                                             num_cpus=num_cpus or cfg.resources.num_cpus))
    timings = run_pipeline(cfg, allow_incomplete=allow_incomplete, drop_model=drop_model, until=until)
    if until is not None and until != STAGES[-1].name:
        click.echo(f"total {timings['total']:.1f} s; stopped after {until} (`raybench grid` again goes on)")
        return
    from raybench.infra.storage import is_remote

    report = f"{cfg.run_dir.rstrip('/')}/report.html" if is_remote(cfg.run_dir) else \
        RunLayout.at(cfg.run_dir).report.resolve()
    if not is_remote(cfg.run_dir):
        from raybench.analysis.summary.headline import headline

        for line in headline(cfg.run_dir):  # weights, cohort, what the run found: the terminal's last lines
            click.echo(line)
    click.echo(f"total {timings['total']:.1f} s; report: {report}")
