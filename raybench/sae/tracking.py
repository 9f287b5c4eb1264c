"""Experiment tracking of the SAE grid (config `tracking`): Ray Tune's own logger callbacks, fed by the trials.

A trial trains several cells, so each report carries every cell under its own key: `cells/<cell_id>/mse`,
`.../aux`, `.../dead_fraction` every `tracking.log_every` SAE steps (raybench.sae.train `on_log`), and
`cells/<cell_id>/final/<metric>` once the cell is evaluated. `timesteps_total` is the SAE step, which both
callbacks take as the x axis, so each cell's curve runs over its own steps. TensorBoard event files land in each
trial folder under <run>/tune/; MLflow gets one run per trial (a local file store in <run>/mlruns by default).
Tracking is outside config_hash: it records training and changes none of its results.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from raybench.core.config import RunConfig
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout
from raybench.sae.cells import CellSpec


class TrackingError(RaybenchError, ImportError):
    """The run config asks for a tracker that is not installed."""


STEP_KEY = "timesteps_total"  # what TBXLoggerCallback and MLflowLoggerCallback use as the step when present


def curve_report(cells: list[CellSpec], step: int, point: dict[str, np.ndarray]) -> dict[str, Any]:
    """One logged point of a stack's curves (train.py `_log_point`: [S] arrays) as a Tune result."""
    return {STEP_KEY: int(step),
            "cells": {c.cell_id: {key: float(values[i]) for key, values in point.items()} for i, c in enumerate(cells)}}


def final_report(finals: dict[str, dict[str, Any]], steps: int) -> dict[str, Any]:
    """Final metrics of evaluated cells (cell_id -> metrics.json's metrics) as a Tune result: numeric ones only."""
    cells = {cid: {"final": {k: float(v) for k, v in m.items() if _is_number(v)}} for cid, m in finals.items()}
    return {STEP_KEY: int(steps), "cells": cells}


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float | np.integer | np.floating) and not isinstance(v, bool) and math.isfinite(v)


def mlflow_uri(cfg: RunConfig) -> str | None:
    """The MLflow tracking URI of the run: the configured one, else the run folder's local file store."""
    if cfg.tracking.mlflow is None:
        return None
    return cfg.tracking.mlflow.uri or RunLayout.at(cfg.run_dir).mlflow_dir.resolve().as_uri()


def tracking_callbacks(cfg: RunConfig) -> list:
    """Tune logger callbacks for `cfg.tracking` (empty when tracking is off: Tune's default loggers only)."""
    callbacks: list = []
    if cfg.tracking.tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        _require("tensorboardX", "tracking.tensorboard")
        callbacks.append(TBXLoggerCallback())
    uri = mlflow_uri(cfg)
    if uri is not None:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        import raybench

        _require("mlflow", "tracking.mlflow")
        if uri.startswith("file:"):  # MLflow 3 refuses its file store unless asked for explicitly
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        callbacks.append(MLflowLoggerCallback(
            tracking_uri=uri, experiment_name=cfg.tracking.mlflow.experiment or f"raybench-{cfg.config_hash()}",
            tags={"raybench.config_hash": cfg.config_hash(), "raybench.version": raybench.__version__,
                  "raybench.core.protocol": cfg.protocol.name}))
    return callbacks


def _require(module: str, key: str) -> None:
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise TrackingError(f"{key} is set in the run config but {module} is not installed: `pip install "
                            f"raybench[tracking]`, or turn {key} off")
