"""`raybench reliability` end to end on a small finished run: tables, figures, report section, contrast flags;
and the cheap part inside analyze."""

from __future__ import annotations

import pandas as pd
import pytest
from click.testing import CliRunner

from raybench.analysis.reliability.verdicts import VERDICTS
from raybench.core.paths import RunLayout
from tests.small_run import copy_run


@pytest.fixture(scope="module")
def finished(finished_small_run, tmp_path_factory):
    """A copy of the session's finished run (a drawn 40-record selection subset; the small reliability audit)."""
    return copy_run(finished_small_run[0], tmp_path_factory.mktemp("reliability") / "run")


@pytest.mark.slow
def test_analyze_runs_the_cheap_part(finished):
    layout = RunLayout.at(finished.run_dir)
    rel = pd.read_parquet(layout.tables_dir / "reliability.parquet")
    assert set(rel.metric) >= {"reconstruction", "accessibility", "coverage", "dead_fraction"}
    assert rel.verdict.isin(VERDICTS).all() and rel.rule.str.len().gt(0).all()
    assert (rel.state_training == "not assessed").all()  # no snapshots without the heavy parts: no pass
    assert not (layout.tables_dir / "reliability_panel.parquet").exists()  # heavy parts only when asked
    assert 'id="reliability"' in layout.report.read_text()


@pytest.mark.slow
def test_command_writes_tables_figures_and_report(finished):
    from raybench.app.cli import main

    layout = RunLayout.at(finished.run_dir)
    atlas_fig = layout.figures_dir / "atlas_val_r2.png"
    atlas_mtime = atlas_fig.stat().st_mtime_ns
    res = CliRunner().invoke(main, ["reliability", "--run-dir", str(layout.root)])
    assert res.exit_code == 0, res.output
    for name in ("reliability", "reliability_variance", "reliability_contrasts", "reliability_reseed",
                 "reliability_training", "reliability_training_summary", "reliability_panel",
                 "reliability_panel_rho", "reliability_profile_intervals"):
        assert (layout.tables_dir / f"{name}.parquet").exists(), name
    for stem in ("reliability_variance", "reliability_ground_truth", "reliability_training"):
        assert (layout.figures_dir / f"{stem}.png").exists() and (layout.figures_dir / f"{stem}.svg").exists()
    rel = pd.read_parquet(layout.tables_dir / "reliability.parquet").set_index("metric")
    assert rel.state_reseed["reconstruction"] == "not assessed" and rel.reseed_s["accessibility"] > 0  # no draw
    assert (rel.n_gt == 2).all() and (rel.state_ground_truth == "not assessed").all()  # 2 trained members: no rho
    con = pd.read_parquet(layout.tables_dir / "reliability_contrasts.parquet")
    main_pairs = pd.read_parquet(layout.tables_dir / "contrasts.parquet")
    assert len(con[con.table == "contrasts"]) == len(main_pairs)
    assert ((con["diff"].abs() < con.mrd_3) == con.below_mrd_3).all()
    training = pd.read_parquet(layout.tables_dir / "reliability_training_summary.parquet")
    assert training.max_abs_diff_final.max() < 1e-5  # retraining reproduces the stored SAEs
    html = layout.report.read_text()
    assert "How far to trust each metric" in html and 'id="fig-reliability_ground_truth"' in html
    assert atlas_fig.stat().st_mtime_ns == atlas_mtime  # only the reliability figures are drawn again
    again = CliRunner().invoke(main, ["reliability", "--run-dir", str(layout.root), "--cheap-only"])
    assert again.exit_code == 0, again.output
    assert (layout.tables_dir / "reliability_panel.parquet").exists()  # kept: same cells table
