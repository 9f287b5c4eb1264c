"""The analysis commands: `raybench analyze` (the analyze stage: every analysis of the registry, then figures,
audit and report, the same sequence `raybench grid` runs), `raybench report` (re-render only), and the audits
run on their own with their heavy parts, `raybench reliability` and `raybench provenance`."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from raybench.core.config import RunConfig
from raybench.core.symlinks import ANALYSIS_OUTPUTS, refuse_symlinks
from raybench.infra.run_lock import local_run, locks_run

if TYPE_CHECKING:
    from raybench.analysis.stage import Rendered

log = logging.getLogger(__name__)


def resolve_config(run_dir: str, config_path: str | None, trust_destinations: bool = False) -> RunConfig:
    """--config when given (refused when its config hash differs from the run's recorded one, or when it sends the
    driver off this machine unconfirmed: raybench.core.destinations), else the config in the run's run.yaml."""
    from raybench.core.run_state import stage_config

    return stage_config(run_dir, config_path, demo_fallback=False, trust_destinations=trust_destinations)


def _plain_outputs(params: dict) -> None:
    """A local --run-dir's analysis outputs hold no symlink (raybench.core.symlinks): guard of locks_run."""
    if local_run(params) is not None:
        refuse_symlinks(params["run_dir"], ANALYSIS_OUTPUTS)


def _local_dir(run_dir: str) -> Path:
    from raybench.analysis.stage import local_run_dir

    return local_run_dir(run_dir)


def _echo_rendered(rendered: Rendered, root: Path) -> None:
    from raybench.analysis.summary.headline import headline

    click.echo(f"figures: {len(rendered.figures)} files in {root / 'figures'}")
    if rendered.audit is not None:
        click.echo(f"release audit: {rendered.audit.summary} (grid completeness, not a model comparison)")
    for line in headline(root):  # weights, cohort, what the run found
        click.echo(line)
    click.echo(f"report: {rendered.report}")


@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder written by `raybench grid`.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run config YAML (default: the run's own run.yaml).")
@click.option("--num-workers", type=int, default=None, help="Parallel bootstrap tasks (default: what Ray has).")
@click.option("--strict", is_flag=True, help="Exit with status 1 when the release audit is incomplete.")
@click.option("--allow-incomplete", is_flag=True,
              help="Analyze a grid with missing or failed cells (refused by default, naming them); every table then "
                   "flags its short denominators (n_expected, n_present, short_denominator).")
@click.option("--only", multiple=True, metavar="NAME",
              help="Compute only this analysis' tables (repeatable; a name of raybench.analysis.registry.ANALYSES, "
                   "e.g. a newly added one); the others' tables stay as they are. Figures and the report are redrawn.")
@click.option("-v", "--verbose", is_flag=True, help="Log skipped figures and other notes.")
@click.option("--trust-config-destinations", "trust_destinations", is_flag=True,
              help="Accept a non-local resources.address from the --config file (refused otherwise; never for "
                   "credentialed cohorts).")
@locks_run("analyze", local_run, _plain_outputs)
def analyze(run_dir: str, config_path: str | None, num_workers: int | None, strict: bool, allow_incomplete: bool,
            only: tuple[str, ...], verbose: bool, trust_destinations: bool = False) -> None:
    """Compute the analysis tables (Ray bootstraps), then figures, the release audit and report.html."""
    _logging(verbose)
    root = _local_dir(run_dir)
    cfg = resolve_config(run_dir, config_path, trust_destinations)  # the run's own run.yaml unless --config
    _check_folder(run_dir, "analyze")
    from raybench.analysis.stage import run_analyze_stage

    result = run_analyze_stage(cfg, num_workers=num_workers, allow_incomplete=allow_incomplete, only=only or None)
    for name, tables in result.tables.items():
        click.echo(f"{name} tables: {', '.join(sorted(tables)) or '-'}")
    _echo_rendered(result.rendered, root)
    _exit_on_audit(root, strict)


@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder with finished tables.")
@click.option("--strict", is_flag=True, help="Exit with status 1 when the release audit is incomplete.")
@click.option("-v", "--verbose", is_flag=True, help="Log skipped figures and other notes.")
@locks_run("report", local_run, _plain_outputs)
def report(run_dir: str, strict: bool, verbose: bool) -> None:
    """Re-draw figures and re-render report.html from existing tables (no recomputation, no Ray)."""
    _logging(verbose)
    root = _local_dir(run_dir)
    _check_folder(run_dir, "report")  # before anything is drawn or deleted
    from raybench.analysis.stage import render_outputs

    protocol = None
    if (root / "run.yaml").exists():
        protocol = resolve_config(run_dir, None).protocol
    else:
        click.echo("no run.yaml: keeping any existing release audit (tables/audit.json)")
    _echo_rendered(render_outputs(root, protocol), root)
    _exit_on_audit(root, strict)


def _check_folder(run_dir: str, command: str) -> None:
    """Refuse a damaged run folder before the command writes anything (raybench.analysis.run_folder)."""
    from raybench.analysis import run_folder

    run_folder.check_run_folder(run_dir, command, run_folder.ANALYZE if command == "analyze" else run_folder.REPORT)


def _exit_on_audit(root: Path, strict: bool) -> None:
    from raybench.analysis.records import read_audit

    audit = read_audit(root)
    if strict and (audit is None or not audit.get("passed")):
        raise click.ClickException("release audit incomplete (see report.html, section 'Release audit')")


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")


# ---------------------------------------------------------------- the audits on their own

@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder written by `raybench grid`.")
@click.option("--num-workers", type=int, default=None, help="Parallel Ray tasks (default: what Ray has).")
@click.option("--cheap-only", is_flag=True, help="Only the cheap parts (what every analyze runs).")
@locks_run("reliability", local_run, _plain_outputs)
def reliability(run_dir: str, num_workers: int | None, cheap_only: bool) -> None:
    """How far each metric can be trusted: reseeds, seed variance, ground truth, training curves, verdicts; then
    re-render report.html."""
    from raybench.analysis.reliability.run import run_reliability
    from raybench.analysis.stage import local_run_dir, render_outputs
    from raybench.infra import ray_session

    root = local_run_dir(run_dir)
    cfg = resolve_config(run_dir, None)
    ray_session.init_ray(cfg.resources)
    res = run_reliability(root, cfg.protocol, cfg.reliability, heavy=not cheap_only, num_workers=num_workers)
    rel = res.tables["reliability"]
    from raybench.analysis.reliability.run import closing_note

    click.echo(closing_note(rel))
    click.echo("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res.seconds.items()))
    rendered = render_outputs(root, cfg.protocol, only=("reliability",))  # the other figures did not change
    figures = [p for p in rendered.figures if p.name.startswith("reliability_")]
    click.echo(f"tables: {len(res.tables)} in {root / 'tables'}; figures: {len(figures)}; "
               f"report: {rendered.report}")


@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder written by `raybench grid`.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run config YAML (default: the run's own run.yaml); its provenance section sets the audit.")
@click.option("--target", default=None, help="Diagnostic superclass of the target (NORM, MI, STTC, CD, HYP); "
                                             "default: provenance.target (NORM).")
@click.option("--trust-config-destinations", "trust_destinations", is_flag=True,
              help="Accept a non-local resources.address from the --config file (never for credentialed cohorts).")
@locks_run("provenance", local_run, _plain_outputs)
def provenance(run_dir: str, config_path: str | None, target: str | None, trust_destinations: bool = False) -> None:
    """Audit whether each encoder carries device/site and whether a head relies on it (Recover / Stress /
    Intervene / Verify per model x depth), write tables/provenance_*, figures and re-render report.html."""
    from dataclasses import replace

    from raybench.analysis.provenance_audit.run import run_provenance
    from raybench.analysis.stage import render_outputs

    cfg = resolve_config(run_dir, config_path, trust_destinations)
    if target is not None:
        cfg = replace(cfg, provenance=replace(cfg.provenance, target=target))
        cfg.provenance.validate()
    t0 = time.perf_counter()
    tables = run_provenance(cfg.run_dir, cfg)
    seconds = time.perf_counter() - t0
    ver = tables["provenance_verdicts"]
    counts = ver.verdict.value_counts().sort_index() if len(ver) else {}
    click.echo(f"provenance audit: {len(ver)} model x depth x variable rows in {seconds:.1f}s; "
               + ", ".join(f"{k}: {v}" for k, v in dict(counts).items()))
    rendered = render_outputs(cfg.run_dir, cfg.protocol, only=("provenance_audit",))  # the others did not change
    click.echo(f"report: {rendered.report}")
