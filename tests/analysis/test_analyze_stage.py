"""`raybench analyze` and `raybench grid` run the one analyze stage (raybench.analysis.stage.run_analyze_stage).

The byte-for-byte comparison of what both write on a run `grid` finished is in test_pipeline.py (it reuses
that module's finished run).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from click.testing import CliRunner
from fake_run import small_protocol, write_fake_run

import raybench.analysis.stage as stage
from raybench.app.cli import main
from raybench.core.paths import RunLayout


def _record_stage(monkeypatch) -> list[tuple[str, bool]]:
    """Replace the analyze stage by a recorder: (run_dir, allow_incomplete) per call."""
    calls: list[tuple[str, bool]] = []

    def run_analyze_stage(cfg, num_workers=None, allow_incomplete=False, only=None):
        calls.append((str(Path(cfg.run_dir).resolve()), allow_incomplete))
        report = RunLayout.at(cfg.run_dir).report
        tables = {"atlas": {"profiles": pd.DataFrame()}, "secondary": {"calibration": pd.DataFrame()}}
        return stage.AnalyzeResult(tables, stage.Rendered([], None, report))

    monkeypatch.setattr(stage, "run_analyze_stage", run_analyze_stage)
    return calls


def test_analyze_and_grid_both_run_the_one_analyze_stage(tmp_path, monkeypatch):
    import raybench.app.pipeline as pl
    import raybench.infra.ray_session

    calls = _record_stage(monkeypatch)
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)

    # raybench analyze: the config comes from the run's run.yaml (no --config)
    ran = write_fake_run(tmp_path / "ran", small_protocol(), tables=("cells",))
    res = CliRunner().invoke(main, ["analyze", "--run-dir", str(ran), "--allow-incomplete"])
    assert res.exit_code == 0, res.output
    assert "atlas tables: profiles" in res.output and "secondary tables: calibration" in res.output
    assert calls == [(str(ran.resolve()), True)]

    # raybench grid: only its analyze stage, on a fresh folder (the other stages are not this test's)
    monkeypatch.setattr(pl, "STAGES", [s for s in pl.STAGES if s.name == "analyze"])
    fresh = tmp_path / "fresh"
    for flags in ([], ["--allow-incomplete"]):
        res = CliRunner().invoke(main, ["grid", "--run-dir", str(fresh), *flags])
        assert res.exit_code == 0, res.output
        assert "2 tables, 0 figures; audit: not run" in res.output
    assert calls[1:] == [(str(fresh.resolve()), False), (str(fresh.resolve()), True)]


def test_report_redraws_through_the_stage_without_recomputing(tmp_path, monkeypatch):
    """`raybench report` renders through the stage's render_outputs and never runs the analysis."""
    calls = _record_stage(monkeypatch)
    root = write_fake_run(tmp_path / "run", small_protocol())
    res = CliRunner().invoke(main, ["report", "--run-dir", str(root)])
    assert res.exit_code == 0, res.output
    assert calls == [] and "release audit: 54/54 cells" in res.output
    assert RunLayout.at(root).report.exists()
