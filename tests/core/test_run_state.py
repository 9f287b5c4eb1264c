"""A run folder's config may gain models (or lose them with --drop-model); any other change is refused by key."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from raybench.app import pipeline as pl
from raybench.core import run_state as rs
from raybench.core.config import FeaturesConfig
from raybench.core.paths import RunLayout
from raybench.core.run_state import (
    RunChangeError,
    base_hash,
    check_change,
    compatible_hashes,
    config_diff,
    new_stamp,
)
from tests.small_run import copy_run, small_config


def _with_models(cfg, models):
    return replace(cfg, protocol=replace(cfg.protocol, grid=replace(cfg.protocol.grid, models=models)))


def test_config_diff_lists_dotted_keys_and_base_hash_ignores_models(tmp_path):
    cfg = small_config(tmp_path / "run")
    other = replace(cfg, protocol=replace(cfg.protocol, sae=replace(cfg.protocol.sae, steps=7)),
                    cohort=replace(cfg.cohort, seed=99))
    assert config_diff(cfg, other) == ["cohort.seed", "protocol.sae.steps"]
    assert config_diff(cfg, replace(cfg, resources=replace(cfg.resources, trial_cpus=2.0))) == []  # not results
    more = _with_models(cfg, ("ecg_fm", "csfm", "st_mem"))
    assert config_diff(cfg, more) == ["protocol.grid.models"]
    assert base_hash(cfg) == base_hash(more) and cfg.config_hash() != more.config_hash()
    assert base_hash(cfg) != base_hash(other)


def test_check_change_accepts_added_models_and_refuses_the_rest(tmp_path):
    cfg = small_config(tmp_path / "run")
    stamp = new_stamp(None, cfg)
    assert check_change(cfg, stamp, cfg) == check_change(None, None, cfg)  # nothing changes
    more = _with_models(cfg, ("ecg_fm", "csfm", "st_mem"))
    assert check_change(cfg, stamp, more).added == ("st_mem",)
    fewer = _with_models(cfg, ("csfm",))
    with pytest.raises(RunChangeError, match=r"drops model\(s\) \['ecg_fm'\].*--drop-model"):
        check_change(cfg, stamp, fewer)
    assert check_change(cfg, stamp, fewer, drop_model=True).removed == ("ecg_fm",)
    other = replace(more, protocol=replace(more.protocol, sae=replace(more.protocol.sae, steps=7)))
    with pytest.raises(RunChangeError, match=r"keys that differ: protocol\.sae\.steps: 40 -> 7\. Only"):
        check_change(cfg, stamp, other)
    with pytest.raises(RunChangeError, match="another config.*cannot be listed"):
        check_change(None, stamp, more)  # no run.yaml: only the hashes are known


def test_stamps_keep_every_earlier_hash_compatible(tmp_path):
    cfg = small_config(tmp_path / "run")
    more = _with_models(cfg, ("ecg_fm", "csfm", "st_mem"))
    most = _with_models(cfg, ("ecg_fm", "csfm", "st_mem", "ecg_jepa"))
    stamp = new_stamp(new_stamp(new_stamp(None, cfg), more), most)
    assert stamp["config_hash"] == most.config_hash() and stamp["models"] == list(most.protocol.grid.models)
    assert stamp["compatible_hashes"] == sorted([cfg.config_hash(), more.config_hash()])
    root = tmp_path / "run"
    root.mkdir()
    (root / "config_hash.json").write_text(json.dumps(stamp))
    assert compatible_hashes(root, most.config_hash()) == {cfg.config_hash(), more.config_hash(), most.config_hash()}
    assert compatible_hashes(root, "another") == {"another"}  # the stamp belongs to another config


def test_write_run_yaml_adds_models_refuses_others_by_key(tmp_path):
    cfg = small_config(tmp_path / "run")
    RunLayout.at(cfg.run_dir).root.mkdir()
    rs.write_run_yaml(cfg)
    more = _with_models(cfg, ("ecg_fm", "csfm", "st_mem"))
    rs.write_run_yaml(more)
    stamp = json.loads((Path(cfg.run_dir) / rs.STAMP).read_text())
    assert stamp["compatible_hashes"] == [cfg.config_hash()] and stamp["base_hash"] == base_hash(cfg)
    assert rs.recorded_run_config(cfg.run_dir)[0] == more
    with pytest.raises(rs.PipelineError, match="drops model"):
        rs.write_run_yaml(cfg)
    other = replace(more, cohort=replace(more.cohort, records=99))
    with pytest.raises(rs.PipelineError, match=r"another config .* keys that differ: cohort\.records: 120 -> 99"):
        rs.write_run_yaml(other)
    rs.write_run_yaml(cfg, drop_model=True)
    assert rs.recorded_run_config(cfg.run_dir)[0] == cfg
    with pytest.raises(rs.PipelineError, match=r"\(keys that differ: cohort\.records\)"):  # stage commands too
        rs.stamp_run(replace(cfg, cohort=replace(cfg.cohort, records=99)))


def _files(folder: Path) -> dict[str, tuple[int, str]]:
    return {p.relative_to(folder).as_posix(): (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_third_encoder_is_encoded_trained_and_analyzed_alone(tmp_path, finished_small_run):
    cfg = copy_run(finished_small_run[0], tmp_path / "run")  # ecg_fm, csfm: 24 cells, finished
    layout = RunLayout.at(cfg.run_dir)
    before = {"cells": _files(layout.cells_dir), "activations": _files(layout.activations_dir)}
    assert {p.split("/")[0] for p in before["activations"]} == {"ecg_fm", "csfm"}

    more = _with_models(cfg, ("ecg_fm", "csfm", "st_mem"))
    # the feature dashboards, secondary analyses and the reliability audit's cheap part (outside config_hash) are
    # not this test's: off for the rerun; st_mem encoded in one batch, its 2 trials (primary, sensitivity) one
    # after the other in 1 reused process (speed only)
    more = replace(more, features=FeaturesConfig(enabled=False),
                   resources=replace(more.resources, max_concurrent_trials=1),
                   secondary=replace(more.secondary_settings(), analyses=()),
                   reliability=replace(more.reliability, cheap=False),
                   encoders=replace(more.encoders, batch_size=128))
    lines: list[str] = []
    timings = pl.run_pipeline(more, echo=lines.append)
    assert timings["encode"] > 0 and timings["train"] > 0 and timings["analyze"] > 0, lines
    after = {"cells": _files(layout.cells_dir), "activations": _files(layout.activations_dir)}
    for part in ("cells", "activations"):  # the first two models: not a byte or an mtime changed
        assert {k: v for k, v in after[part].items() if "st_mem" not in k} == before[part], part
        assert any("st_mem" in k for k in after[part]), part
    table = pd.read_parquet(layout.cells_table)
    assert len(table) == 36 and (table["status"] == "ok").all()
    assert set(table["config_hash"]) == {more.config_hash()}
    assert table.groupby("model").size().to_dict() == {"csfm": 12, "ecg_fm": 12, "st_mem": 12}
    trained = {json.loads((layout.cell_dir(c) / "metrics.json").read_text())["config_hash"] for c in table.cell_id
               if c.startswith("st_mem")}
    assert trained == {more.config_hash()}
    assert any("audit: 24/24 cells, 8/8 blocks" in line for line in lines), lines
    profiles = pd.read_parquet(layout.tables_dir / "profiles.parquet")
    assert set(profiles["model"]) == {"ecg_fm", "csfm", "st_mem"}
    html = layout.report.read_text()
    assert all(m in html for m in ("ecg_fm", "csfm", "st_mem"))
    assert layout.report.stat().st_mtime_ns > layout.cells_table.stat().st_mtime_ns - 1
