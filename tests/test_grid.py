"""The SAE atlas on Ray Tune: complete tables, retries, resume after a killed driver, failures kept."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pandas as pd
import pytest

from raybench.paths import RunLayout
from raybench.sae.grid import CELL_COLUMNS, run_grid
from tests.small_run import build_encoded_run, small_config


@pytest.fixture(scope="module")
def encoded(tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("grid") / "run"
    return build_encoded_run(small_config(root))


def _fresh(encoded, tmp_path, **resources):
    """A copy of the encoded run without any training outputs."""
    root = tmp_path / "run"
    shutil.copytree(encoded.run_dir, root, ignore=shutil.ignore_patterns("cells", "tune", "tables"))
    cfg = replace(encoded, run_dir=str(root))
    return replace(cfg, resources=replace(cfg.resources, **resources)) if resources else cfg


def test_grid_trains_every_cell_and_retries_a_failing_trial(encoded, tmp_path):
    cfg = _fresh(encoded, tmp_path, trial_unit="layer", trial_gpus=0.25, max_failures=2)
    table = run_grid(cfg, fail_once_dir=str(tmp_path / "fail-once"))
    assert list(table.columns) == CELL_COLUMNS
    assert len(table) == 24 and (table["status"] == "ok").all(), table["status"].tolist()
    assert len(list((tmp_path / "fail-once").iterdir())) >= 1  # every trial failed once, then succeeded
    assert table["cell_id"].is_unique
    assert pd.read_parquet(RunLayout.at(cfg.run_dir).cells_table).equals(table)
    assert table["val_r2"].notna().all() and table["val_r2"].median() > 0  # 40 steps: fit has begun
    assert table["test_accessibility"].between(0, 1).all()
    # a rerun trains nothing: every cell folder is untouched
    cells = RunLayout.at(cfg.run_dir).cells_dir
    before = {p.name: p.stat().st_mtime_ns for p in cells.iterdir()}
    again = run_grid(cfg)
    assert {p.name: p.stat().st_mtime_ns for p in cells.iterdir()} == before
    assert again.equals(table)


def test_a_trial_that_exhausts_its_retries_is_reported_failed(encoded, tmp_path):
    cfg = _fresh(encoded, tmp_path, trial_unit="model", max_failures=0)
    cfg = replace(cfg, protocol=replace(cfg.protocol, grid=replace(cfg.protocol.grid, models=("csfm",),
                                                                      sensitivity_depth=None)))
    table = run_grid(cfg, fail_once_dir=str(tmp_path / "fail-once"))
    assert len(table) == 8, "failed cells stay in the table (the denominator)"
    assert table["status"].str.startswith("failed: ").all()
    assert table["status"].str.contains("injected failure").all()


# Killing the driver mid-grid and resuming is tested against an uninterrupted run in test_elastic.py.
