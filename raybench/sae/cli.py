"""`raybench train`: run (or resume) the SAE atlas on Ray Tune from an encoded run folder."""

from __future__ import annotations

from dataclasses import replace

import click

from raybench.config import load_run_config


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="YAML run config. Default: the embedded demo.")
@click.option("--run-dir", default=None, help="Run folder holding manifest/ and activations/.")
@click.option("--trial-gpus", type=float, default=None, help="GPU fraction per trial, e.g. 0.25 packs four per GPU.")
@click.option("--max-concurrent", type=int, default=None, help="Cap on concurrent trials (0: as resources allow).")
def train(config_path: str | None, run_dir: str | None, trial_gpus: float | None, max_concurrent: int | None) -> None:
    """Train every missing cell (450 primary + 90 sensitivity) and write tables/cells.parquet."""
    from raybench.sae.grid import run_grid

    cfg = load_run_config(config_path)
    if run_dir:
        cfg = replace(cfg, run_dir=run_dir)
    res = cfg.resources
    if trial_gpus is not None:
        res = replace(res, trial_gpus=trial_gpus)
    if max_concurrent is not None:
        res = replace(res, max_concurrent_trials=max_concurrent)
    res.validate()
    table = run_grid(replace(cfg, resources=res), verbose=1)
    ok = int((table["status"] == "ok").sum())
    click.echo(f"{ok}/{len(table)} cells ok; table: {cfg.run_dir}/tables/cells.parquet")
    failed = table[table["status"] != "ok"]
    for _, row in failed.head(20).iterrows():
        click.echo(f"  {row['cell_id']}: {row['status']}")
