"""`raybench config`: print a preset or a resolved config as YAML (a starting point for --config)."""

from __future__ import annotations

import click

from raybench.config import PRESETS, RunConfig, demo_run, dump_run_config, load_run_config


@click.command()
@click.option("--preset", type=click.Choice(sorted(PRESETS)), default="demo", show_default=True,
              help="Protocol preset to print.")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Validate and print this YAML config instead of a preset.")
def config(preset: str, config_path: str | None) -> None:
    """Print a validated run config as YAML (edit it, then pass it to `raybench grid --config`)."""
    if config_path:
        cfg = load_run_config(config_path)
    elif preset == "demo":
        cfg = demo_run()
    else:
        cfg = RunConfig(run_dir="runs/paper", protocol=PRESETS[preset]()).validate()
    click.echo(dump_run_config(cfg), nl=False)
