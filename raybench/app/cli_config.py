"""`raybench config`: print a preset or a resolved config as YAML (a starting point for --config)."""

from __future__ import annotations

import click

from raybench.core.config import RUN_PRESETS, dump_run_config, load_run_config


@click.command()
@click.option("--preset", type=click.Choice(sorted(RUN_PRESETS)), default="demo", show_default=True,
              help="paper: the published protocol as executed, with the protocol code's encoder preprocessing "
                   "(encoders.profile: published) - the preset that reproduces the published tables. "
                   "paper-native: the same protocol with each encoder's native preprocessing (not the published "
                   "numbers). demo: laptop-sized, same structure.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Validate and print this YAML config instead of a preset.")
def config(preset: str, config_path: str | None) -> None:
    """Print a validated run config as YAML (edit it, then pass it to `raybench grid --config`).

    `--preset paper` reproduces the published tables (published protocol, seeds, per-step sampler, gradient
    clipping, selection subset and the `published` preprocessing profile); `--preset paper-native` differs
    only in `encoders.profile: native` (and its name).
    """
    cfg = load_run_config(config_path) if config_path else RUN_PRESETS[preset]()
    click.echo(dump_run_config(cfg), nl=False)
