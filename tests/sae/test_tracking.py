"""Experiment tracking: per-cell loss curves and final metrics through Tune's TensorBoard and MLflow callbacks."""

from __future__ import annotations

import json
import shutil
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from raybench.core.config import MLflowConfig, TrackingConfig, load_run_config
from raybench.core.paths import RunLayout
from raybench.sae.cells import CellSpec
from raybench.sae.tracking import curve_report, final_report
from tests.small_run import small_config


def read_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """tag -> step -> value of every scalar in the TensorBoard event files under `folder` (TFRecord framing:
    length, masked CRC of the length, an Event proto, masked CRC of the data; the CRCs are checked)."""
    from tensorboardX.crc32c import crc32c
    from tensorboardX.proto.event_pb2 import Event

    def masked(data: bytes) -> int:
        c = crc32c(data)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    out: dict[str, dict[int, float]] = {}
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        raw, pos = path.read_bytes(), 0
        while pos < len(raw):
            header = raw[pos:pos + 8]
            (n,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", raw[pos + 8:pos + 12])[0] == masked(header)
            data = raw[pos + 12:pos + 12 + n]
            assert struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])[0] == masked(data)
            pos += 16 + n
            event = Event.FromString(data)
            for v in event.summary.value:
                out.setdefault(v.tag, {})[int(event.step)] = float(v.simple_value)
    return out


def test_reports_key_each_cell_and_keep_numeric_final_metrics():
    cells = [CellSpec("m", 0.0, 0, 2, 4, "primary", 1, 4, 1, s) for s in (1, 2)]
    rep = curve_report(cells, 20, {"mse": np.array([0.5, 0.25]), "dead_fraction": np.array([0.0, 0.75])})
    assert rep == {"timesteps_total": 20, "cells": {cells[0].cell_id: {"mse": 0.5, "dead_fraction": 0.0},
                                                    cells[1].cell_id: {"mse": 0.25, "dead_fraction": 0.75}}}
    fin = final_report({"a": {"val_r2": 0.5, "gate_ok": True, "n": 3, "x": float("nan"), "s": "t"}}, 40)
    assert fin == {"timesteps_total": 40, "cells": {"a": {"final": {"val_r2": 0.5, "n": 3.0}}}}


def test_train_stack_logs_window_means_and_the_dead_fraction():
    from raybench.core.protocol import SAEProtocol
    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack

    sae = SAEProtocol(steps=23, batch_size=32, aux_k=8, dead_after_batches=2, checkpoint_every=0)
    cfgs = [SAECellConfig.from_protocol(sae, 8, 64, 2, seed) for seed in (1, 2)]
    x = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32)
    points: dict[int, dict] = {}
    result = train_stack(x, cfgs, on_log=lambda step, point: points.update({step: point}), log_every=10)
    assert sorted(points) == [10, 20, 23]  # every 10 steps, and the last one
    for step, lo in ((10, 0), (20, 10), (23, 20)):
        np.testing.assert_allclose(points[step]["mse"], result.loss_mse[:, lo:step].mean(axis=1))
        np.testing.assert_allclose(points[step]["aux"], result.loss_aux[:, lo:step].mean(axis=1))
    np.testing.assert_allclose(points[23]["dead_fraction"], (result.dead_counter >= 2).mean(axis=1))
    assert points[23]["dead_fraction"].max() > 0  # 64 latents, k = 2: some die, so the curve can show it
    again = train_stack(x, cfgs)  # logging changes nothing
    np.testing.assert_array_equal(again.loss_mse, result.loss_mse)


def test_tracking_is_config_but_not_config_hash(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"preset": "demo", "tracking": {"tensorboard": True, "mlflow": {}}}))
    cfg = load_run_config(path)
    assert cfg.tracking == TrackingConfig(tensorboard=True, mlflow=MLflowConfig())
    assert cfg.tracking.enabled and not TrackingConfig().enabled
    assert cfg.config_hash() == replace(cfg, tracking=TrackingConfig()).config_hash()
    path.write_text(yaml.safe_dump({"preset": "demo", "tracking": {"log_every": 0}}))
    with pytest.raises(ValueError, match="tracking.log_every"):
        load_run_config(path)


def test_callbacks_follow_the_config_and_name_a_missing_tracker(tmp_path, monkeypatch):
    import importlib.util

    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.tune.logger import TBXLoggerCallback

    from raybench.sae.tracking import TrackingError, mlflow_uri, tracking_callbacks

    cfg = small_config(tmp_path / "run")
    assert tracking_callbacks(cfg) == [] and mlflow_uri(cfg) is None
    on = replace(cfg, tracking=TrackingConfig(tensorboard=True, mlflow=MLflowConfig()))
    assert [type(c) for c in tracking_callbacks(on)] == [TBXLoggerCallback, MLflowLoggerCallback]
    assert mlflow_uri(on) == (tmp_path / "run" / "mlruns").resolve().as_uri()
    remote = replace(on, tracking=TrackingConfig(mlflow=MLflowConfig(uri="http://tracker:5000", experiment="x")))
    (callback,) = tracking_callbacks(remote)
    assert (callback.tracking_uri, callback.experiment_name) == ("http://tracker:5000", "x")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    with pytest.raises(TrackingError, match=r"tracking.mlflow .* raybench\[tracking\]"):
        tracking_callbacks(on)


@pytest.mark.slow
def test_grid_with_tracking_writes_tensorboard_and_mlflow(tmp_path, encoded_small_run):
    from mlflow.tracking import MlflowClient

    from raybench.sae.grid import run_grid

    # a copy of the session's encoded small run (conftest: small_config's cohort and both models' activations,
    # built once), trained on its csfm activations: one 2-seed stack (2 cells, one trial) shows both writers
    shutil.copytree(encoded_small_run.run_dir, tmp_path / "run",
                    ignore=shutil.ignore_patterns("cells", "tune", "tables"))
    cfg = small_config(tmp_path / "run", models=("csfm",), steps=40)
    grid = replace(cfg.protocol.grid, depths=(0.0,), expansions=(1,), sensitivity_depth=None)
    cfg = replace(cfg, protocol=replace(cfg.protocol, grid=grid),
                  resources=replace(cfg.resources, trial_unit="model"),
                  tracking=TrackingConfig(tensorboard=True, mlflow=MLflowConfig(), log_every=10))
    table = run_grid(cfg)
    assert len(table) == 2 and (table["status"] == "ok").all()
    layout = RunLayout.at(cfg.run_dir)
    finals = {cid: json.loads((layout.cell_dir(cid) / "metrics.json").read_text())
              for cid in table["cell_id"]}

    scalars = read_scalars(layout.tune_dir)
    for cid, metrics in finals.items():
        for curve in ("mse", "aux", "dead_fraction"):
            points = scalars[f"ray/tune/cells/{cid}/{curve}"]
            assert sorted(points) == [10, 20, 30, 40], (cid, curve)
        mse = scalars[f"ray/tune/cells/{cid}/mse"]
        assert mse[40] < mse[10]  # the loss falls
        assert all(0.0 <= v <= 1.0 for v in scalars[f"ray/tune/cells/{cid}/dead_fraction"].values())
        assert scalars[f"ray/tune/cells/{cid}/final/val_r2"] == {40: pytest.approx(metrics["val_r2"], rel=1e-6)}

    client = MlflowClient(tracking_uri=layout.mlflow_dir.resolve().as_uri())
    experiment = client.get_experiment_by_name(f"raybench-{cfg.config_hash()}")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # one trial (trial_unit: model)
    run_id = runs[0].info.run_id
    assert runs[0].data.tags["raybench.config_hash"] == cfg.config_hash()
    for cid, metrics in finals.items():
        history = client.get_metric_history(run_id, f"cells/{cid}/mse")
        assert [m.step for m in sorted(history, key=lambda m: m.step)] == [10, 20, 30, 40]
        assert {m.step: m.value for m in history} == pytest.approx(scalars[f"ray/tune/cells/{cid}/mse"])
        final = client.get_metric_history(run_id, f"cells/{cid}/final/val_r2")
        assert [(m.step, m.value) for m in final] == [(40, pytest.approx(metrics["val_r2"]))]
