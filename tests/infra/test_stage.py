"""The Stage contract (raybench.infra.stage) and the stage sequence `raybench grid` runs (raybench.app.pipeline)."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

import raybench.app.pipeline as pl
from raybench.analysis.stage import ANALYZE_STAGE, analyze_stage
from raybench.app.cli import main
from raybench.cohorts.stage import COHORT_STAGE, MANIFEST_STAGE, CohortError
from raybench.core import run_state as rs
from raybench.core.config import CohortConfig, EncoderConfig, RunConfig, demo_protocol
from raybench.core.errors import USER_EXIT_CODE, RaybenchError
from raybench.core.paths import RunLayout
from raybench.encoders.stage import ENCODE_STAGE
from raybench.infra.stage import Stage
from raybench.sae.stage import TRAIN_STAGE


def _config(run_dir, **cohort) -> RunConfig:
    return RunConfig(run_dir=str(run_dir), protocol=demo_protocol(),
                     cohort=CohortConfig(**({"kind": "synth", "records": 12, "patients": 6} | cohort)),
                     encoders=EncoderConfig(size="demo", batch_size=4, num_gpus=0.5)).validate()


def test_grid_runs_the_packages_stages_in_order(tmp_path):
    assert [s.name for s in pl.STAGES] == ["cohort", "manifest", "encode", "train", "analyze"]
    assert pl.STAGES == [COHORT_STAGE, MANIFEST_STAGE, ENCODE_STAGE, TRAIN_STAGE, ANALYZE_STAGE]
    for stage in pl.STAGES:
        assert isinstance(stage, Stage) and isinstance(stage.inputs, tuple)
    assert not hasattr(Stage, "resources"), "workers size their shares at start (raybench.infra.resources)"
    assert analyze_stage(allow_incomplete=True).name == "analyze"


def test_no_stage_is_complete_on_an_empty_run_dir(tmp_path):
    cfg = _config(tmp_path / "empty")
    RunLayout.at(cfg.run_dir).root.mkdir()
    for stage in pl.STAGES:
        assert stage.is_complete(cfg) is False, stage.name


def test_run_pipeline_raises_a_user_error_for_a_missing_cohort_root(tmp_path, monkeypatch):
    import raybench.infra.ray_session

    started = []
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: started.append(1))
    cfg = _config(tmp_path / "run", kind="ptbxl", root=str(tmp_path / "no_ptbxl"))
    with pytest.raises(RaybenchError, match="no_ptbxl") as err:
        pl.run_pipeline(cfg, echo=lambda line: None)
    assert isinstance(err.value, CohortError) and not isinstance(err.value, click.ClickException)
    assert not started and not (tmp_path / "run").exists(), "refused before Ray starts or anything is written"

    (tmp_path / "no_ptbxl").mkdir()  # a folder, but not PTB-XL
    with pytest.raises(CohortError, match="ptbxl_database.csv"):
        pl.run_pipeline(cfg, echo=lambda line: None)


def test_grid_command_prints_one_error_line_for_a_missing_cohort_root(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text(f"preset: demo\nrun_dir: {tmp_path / 'run'}\ncohort: {{kind: ptbxl, root: {tmp_path / 'gone'}}}\n")
    res = CliRunner().invoke(main, ["grid", "--config", str(path)])
    assert res.exit_code == USER_EXIT_CODE, res.output
    assert "Traceback" not in res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error: ")]
    assert len(errors) == 1 and "gone" in errors[0] and "cohort.root" in errors[0]


def test_a_run_folder_of_another_config_is_a_pipeline_error(tmp_path):
    cfg = _config(tmp_path / "run")
    RunLayout.at(cfg.run_dir).root.mkdir()
    (RunLayout.at(cfg.run_dir).root / rs.STAMP).write_text('{"config_hash": "0123"}')
    with pytest.raises(rs.PipelineError, match="another config"):
        rs.write_run_yaml(cfg)
    with pytest.raises(rs.PipelineError, match="config hash"):
        rs.stamp_run(cfg)
