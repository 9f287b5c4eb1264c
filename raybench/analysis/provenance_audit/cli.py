"""`raybench provenance --run-dir R`: the provenance audit on a finished (or encoded) run, then the report."""

from __future__ import annotations

import time

import click


@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder written by `raybench grid`.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run config YAML (default: the run's own run.yaml); its provenance section sets the audit.")
@click.option("--target", default=None, help="Diagnostic superclass of the target (NORM, MI, STTC, CD, HYP); "
                                             "default: provenance.target (NORM).")
def provenance(run_dir: str, config_path: str | None, target: str | None) -> None:
    """Audit whether each encoder carries device/site and whether a head relies on it (Recover / Stress /
    Intervene / Verify per model x depth), write tables/provenance_*, figures and re-render report.html."""
    from dataclasses import replace

    from raybench.analysis.cli import resolve_config
    from raybench.analysis.provenance_audit.run import run_provenance
    from raybench.analysis.report.render import render_report

    cfg = resolve_config(run_dir, config_path)
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
    click.echo(f"report: {render_report(cfg.run_dir)}")
