"""`raybench train`: run (or resume) the SAE atlas on Ray Tune from an encoded run folder."""

from __future__ import annotations

import click


@click.command()
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="YAML run config. Default: the run folder's own run.yaml (else the embedded demo); a config "
                   "other than the run's is refused.")
@click.option("--run-dir", default=None, help="Run folder holding manifest/ and activations/ (default: the "
              "config's run_dir).")
@click.option("--trial-gpus", type=float, default=None, help="GPU fraction per trial, e.g. 0.25 packs four per GPU.")
@click.option("--max-concurrent", type=int, default=None, help="Cap on concurrent trials (0: as resources allow).")
@click.option("--trust-config-destinations", "trust_destinations", is_flag=True,
              help="Accept a remote run_dir or a non-local resources.address from the --config file (refused "
                   "otherwise; never for credentialed cohorts: give those on the command line).")
def train(config_path: str | None, run_dir: str | None, trial_gpus: float | None, max_concurrent: int | None,
          trust_destinations: bool = False) -> None:
    """Train every missing cell of the config's grid (primary arm: models x depths x E x seeds; the fixed-k/N
    sensitivity arm) and write tables/cells.parquet."""
    from raybench.core.run_state import stage_config, stamp_run
    from raybench.sae.stage import check_trainable, train_run, with_trial_resources

    cfg = with_trial_resources(stage_config(run_dir, config_path, trust_destinations=trust_destinations), trial_gpus,
                               max_concurrent)
    check_trainable(cfg)
    stamp_run(cfg, f"--config {config_path}" if config_path else "the run's config")
    table = train_run(cfg, verbose=1)
    ok = int((table["status"] == "ok").sum())
    click.echo(f"{ok}/{len(table)} cells ok; table: {cfg.run_dir}/tables/cells.parquet")
    failed = table[table["status"] != "ok"]
    for _, row in failed.head(20).iterrows():
        click.echo(f"  {row['cell_id']}: {row['status']}")
