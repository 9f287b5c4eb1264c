"""`raybench encode`: extract the audited layer states of each model into the run's activation store."""

from __future__ import annotations

import click

from raybench.core.config import MODELS


@click.command()
@click.option("--run-dir", default=None, help="Run folder (default: the config's run_dir). Needs manifest/ built.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Run config YAML (default: the run folder's own run.yaml, else the embedded demo config); a "
                   "config other than the run's is refused.")
@click.option("--models", default=None, help=f"Comma-separated models (default: the config's grid; known: "
              f"{', '.join(MODELS)}).")
@click.option("--size", type=click.Choice(["demo", "full"]), default=None, help="Encoder size (overrides config).")
@click.option("--batch-size", type=int, default=None, help="Records per encoder batch (overrides config).")
@click.option("--num-gpus", type=float, default=None, help="GPU share per encoder actor, e.g. 0.25 (overrides config).")
@click.option("--all-layers", is_flag=True, help="Store every layer, not only the audited depths.")
@click.option("--quiet", is_flag=True, help="No progress bars or per-model lines.")
@click.option("--trust-config-destinations", "trust_destinations", is_flag=True,
              help="Accept a remote run_dir or a non-local resources.address from the --config file (refused "
                   "otherwise; never for credentialed cohorts: give those on the command line).")
def encode(run_dir: str | None, config_path: str | None, models: str | None, size: str | None,
           batch_size: int | None, num_gpus: float | None, all_layers: bool, quiet: bool,
           trust_destinations: bool = False) -> None:
    """Run every model over the manifest with Ray Data and write one float32 store per model x layer.

    Complete stores (same manifest hash and encoder fingerprint) are skipped, so rerunning after an
    interruption only does the remaining work. Bad records go to activations/<model>/quarantine.csv.
    """
    from raybench.core.run_state import stage_config, stamp_run
    from raybench.encoders.stage import check_encodable, encode_models, with_encoder_overrides

    cfg = with_encoder_overrides(stage_config(run_dir, config_path, trust_destinations=trust_destinations),
                                 size=size, batch_size=batch_size, num_gpus=num_gpus)
    names = [m.strip() for m in models.split(",") if m.strip()] if models else list(cfg.protocol.grid.models)
    if not names:
        raise click.BadParameter("is empty", param_hint="--models")
    from raybench.infra.run_lock import run_lock

    if "://" in cfg.run_dir:
        check_encodable(cfg)  # refuses a remote folder (stores are local files) before any lock is taken there
    with run_lock(cfg.run_dir, "encode"):  # one writer per run folder (raybench.infra.run_lock)
        check_encodable(cfg)
        what = f"--config {config_path}" if config_path else "the run's config"
        stamp_run(cfg, f"{what} with --size {size}" if size else what)  # --size changes results: same check
        for line in encode_models(cfg, names, all_layers=all_layers, progress=not quiet):
            if not quiet:
                click.echo(line)
