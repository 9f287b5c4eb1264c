"""`raybench reliability`: the metric reliability audit of a finished run (every part, heavy ones included)."""

from __future__ import annotations

import click


@click.command()
@click.option("--run-dir", default="runs/demo", show_default=True, help="Run folder written by `raybench grid`.")
@click.option("--num-workers", type=int, default=None, help="Parallel Ray tasks (default: what Ray has).")
@click.option("--cheap-only", is_flag=True, help="Only the cheap parts (what every analyze runs).")
def reliability(run_dir: str, num_workers: int | None, cheap_only: bool) -> None:
    """How far each metric can be trusted: reseeds, seed variance, ground truth, training curves, verdicts; then
    re-render report.html."""
    from raybench.analysis.cli import resolve_config
    from raybench.analysis.reliability.run import run_reliability
    from raybench.analysis.report.render import render_report
    from raybench.analysis.stage import local_run_dir
    from raybench.infra import ray_session

    root = local_run_dir(run_dir)
    cfg = resolve_config(run_dir, None)
    ray_session.init_ray(cfg.resources)
    res = run_reliability(root, cfg.protocol, cfg.reliability, heavy=not cheap_only, num_workers=num_workers)
    rel = res.tables["reliability"]
    from raybench.analysis.reliability.run import closing_note

    click.echo(closing_note(rel))
    click.echo("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in res.seconds.items()))
    from raybench.analysis.reliability.figures import make_reliability_figures

    figures = make_reliability_figures(root)
    click.echo(f"tables: {len(res.tables)} in {root / 'tables'}; figures: {len(figures)}; "
               f"report: {render_report(root)}")
