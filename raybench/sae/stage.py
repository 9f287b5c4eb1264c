"""The train stage of `raybench grid` (see raybench.infra.stage): every SAE cell of the grid on Ray Tune, then the
cells table."""

from __future__ import annotations

from dataclasses import replace

from raybench.core.config import RunConfig
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout
from raybench.infra.stage import Stage


class TrainError(RaybenchError, ValueError):
    """The run folder cannot be trained on here (a remote folder for `raybench train`)."""


def with_trial_resources(cfg: RunConfig, trial_gpus: float | None = None,
                         max_concurrent: int | None = None) -> RunConfig:
    """cfg with resources.trial_gpus / max_concurrent_trials replaced when given (validated)."""
    res = cfg.resources
    if trial_gpus is not None:
        res = replace(res, trial_gpus=trial_gpus)
    if max_concurrent is not None:
        res = replace(res, max_concurrent_trials=max_concurrent)
    res.validate()
    return replace(cfg, resources=res)


def check_trainable(cfg: RunConfig) -> None:
    """`raybench train` works on a local (or mounted) run folder that holds the manifest and every grid model's
    activation stores; checked before the command records its config in the folder, so a refused train leaves
    nothing behind (a run.yaml written there would refuse a later `grid --config` of another config)."""
    if "://" in cfg.run_dir:
        raise TrainError(f"--run-dir {cfg.run_dir}: `raybench train` needs a local (or mounted) run folder; "
                         "`raybench grid` works on s3:// runs")
    layout = RunLayout.at(cfg.run_dir)
    if not layout.manifest.exists():
        raise TrainError(f"no manifest at {layout.manifest}: build it with `raybench manifest` (or run "
                         f"`raybench grid --run-dir {cfg.run_dir}`, which runs every stage)")
    unencoded = [m for m in cfg.protocol.grid.models if not (layout.activations_dir / m).is_dir()]
    if unencoded:
        raise TrainError(f"no activation store for model(s) {', '.join(unencoded)} under {layout.activations_dir}: "
                         f"run `raybench encode --run-dir {cfg.run_dir}` first")


def train_complete(cfg: RunConfig) -> bool:
    """The cells table is all ok under this config, and every cell itself records the current stores."""
    import pandas as pd

    layout = RunLayout.at(cfg.run_dir)
    if not layout.cells_table.exists():
        return False
    table = pd.read_parquet(layout.cells_table)
    if not (bool(len(table)) and bool((table["status"] == "ok").all())
            and set(table["config_hash"]) == {cfg.config_hash()}):
        return False
    # the table may predate new activation stores or hand-copied cells: every cell must match them itself
    from raybench.encoders.store import ActivationStore, StoreError
    from raybench.sae.cells import build_cells
    from raybench.sae.freshness import cell_done, expected_provenance

    try:
        cells = build_cells(cfg.protocol, ActivationStore.for_run(layout.root).model_dims(cfg.protocol.grid.models))
    except (StoreError, KeyError):
        return False
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    return set(table["cell_id"]) == {c.cell_id for c in cells} and all(cell_done(layout, expect, c) for c in cells)


def train_run(cfg: RunConfig, remote: str | None = None, verbose: int = 0):
    """Train every missing cell; returns the cells table. A missing input file (manifest, store) is a TrainError."""
    from raybench.sae.grid import run_grid

    try:
        return run_grid(cfg, remote_uri=remote, verbose=verbose)
    except FileNotFoundError as err:
        raise TrainError(f"{err}; run `raybench manifest` and `raybench encode` first") from None


def train_summary(cfg: RunConfig, remote: str | None = None) -> str:
    table = train_run(cfg, remote)
    ok = int((table["status"] == "ok").sum())
    return f"{ok}/{len(table)} cells ok"


TRAIN_STAGE = Stage("train", inputs=("manifest", "activations_dir"), is_complete=train_complete, run=train_summary)
