"""`raybench analyze` (the analyze stage: tables -> secondary analyses -> figures -> audit -> report, the same
sequence `raybench grid` runs) and `raybench report` (re-render only)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from raybench.core.config import RunConfig

if TYPE_CHECKING:
    from raybench.analysis.stage import Rendered

log = logging.getLogger(__name__)


def resolve_config(run_dir: str, config_path: str | None) -> RunConfig:
    """--config when given (refused when its config hash differs from the run's recorded one), else the resolved
    config recorded in the run's run.yaml."""
    from raybench.core.run_state import stage_config

    return stage_config(run_dir, config_path, demo_fallback=False)


def _local_dir(run_dir: str) -> Path:
    from raybench.analysis.stage import local_run_dir

    return local_run_dir(run_dir)


def _echo_rendered(rendered: Rendered, root: Path) -> None:
    click.echo(f"figures: {len(rendered.figures)} files in {root / 'figures'}")
    if rendered.audit is not None:
        click.echo(f"release audit: {rendered.audit.summary}")
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
@click.option("-v", "--verbose", is_flag=True, help="Log skipped figures and other notes.")
def analyze(run_dir: str, config_path: str | None, num_workers: int | None, strict: bool, allow_incomplete: bool,
            verbose: bool) -> None:
    """Compute the analysis tables (Ray bootstraps), then figures, the release audit and report.html."""
    _logging(verbose)
    root = _local_dir(run_dir)
    cfg = resolve_config(run_dir, config_path)  # the run's own run.yaml unless --config
    from raybench.analysis.stage import run_analyze_stage

    result = run_analyze_stage(cfg, num_workers=num_workers, allow_incomplete=allow_incomplete)
    for name, tables in result.tables.items():
        click.echo(f"{name} tables: {', '.join(sorted(tables)) or '-'}")
    _echo_rendered(result.rendered, root)
    _exit_on_audit(root, strict)


@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder with finished tables.")
@click.option("--strict", is_flag=True, help="Exit with status 1 when the release audit is incomplete.")
@click.option("-v", "--verbose", is_flag=True, help="Log skipped figures and other notes.")
def report(run_dir: str, strict: bool, verbose: bool) -> None:
    """Re-draw figures and re-render report.html from existing tables (no recomputation, no Ray)."""
    _logging(verbose)
    root = _local_dir(run_dir)
    from raybench.analysis.stage import render_outputs

    protocol = None
    if (root / "run.yaml").exists():
        protocol = resolve_config(run_dir, None).protocol
    else:
        click.echo("no run.yaml: keeping any existing release audit (tables/audit.json)")
    _echo_rendered(render_outputs(root, protocol), root)
    _exit_on_audit(root, strict)


def _exit_on_audit(root: Path, strict: bool) -> None:
    from raybench.analysis.release_audit.run import read_audit

    audit = read_audit(root)
    if strict and (audit is None or not audit.get("passed")):
        raise click.ClickException("release audit incomplete (see report.html, section 'Release audit')")


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
