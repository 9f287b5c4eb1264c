"""`raybench reliability` end to end on a small finished run: tables, figures, report section, contrast flags;
and the cheap part inside analyze."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from click.testing import CliRunner

from raybench.config import ReliabilityConfig
from raybench.paths import RunLayout
from tests.small_run import small_config

SMALL = ReliabilityConfig(reseeds=2, sample_points=1, fractions=(0.0, 0.5, 1.0), panel_steps=(10, 60),
                          panel_expansions=(1,), panel_ks=(8,))


@pytest.fixture(scope="module")
def finished(tmp_path_factory, ray_cluster):
    from raybench.pipeline import run_pipeline

    cfg = small_config(tmp_path_factory.mktemp("reliability") / "run")
    proto = replace(cfg.protocol, eval=replace(cfg.protocol.eval, selection_records=40))  # a drawn subset
    cfg = replace(cfg, protocol=proto, resources=replace(cfg.resources, trial_unit="model"), reliability=SMALL)
    run_pipeline(cfg, echo=lambda _line: None)
    return cfg


@pytest.mark.slow
def test_analyze_runs_the_cheap_part(finished):
    layout = RunLayout.at(finished.run_dir)
    rel = pd.read_parquet(layout.tables_dir / "reliability.parquet")
    assert set(rel.metric) >= {"reconstruction", "accessibility", "coverage", "dead_fraction"}
    assert rel.verdict.isin(["reliable", "caution", "unreliable"]).all() and rel.rule.str.len().gt(0).all()
    assert not (layout.tables_dir / "reliability_panel.parquet").exists()  # heavy parts only when asked
    assert 'id="reliability"' in layout.report.read_text()


@pytest.mark.slow
def test_command_writes_tables_figures_and_report(finished):
    from raybench.cli import main

    layout = RunLayout.at(finished.run_dir)
    res = CliRunner().invoke(main, ["reliability", "--run-dir", str(layout.root)])
    assert res.exit_code == 0, res.output
    for name in ("reliability", "reliability_variance", "reliability_contrasts", "reliability_reseed",
                 "reliability_training", "reliability_training_summary", "reliability_panel",
                 "reliability_panel_rho", "reliability_profile_intervals"):
        assert (layout.tables_dir / f"{name}.parquet").exists(), name
    for stem in ("reliability_variance", "reliability_ground_truth", "reliability_training"):
        assert (layout.figures_dir / f"{stem}.png").exists() and (layout.figures_dir / f"{stem}.svg").exists()
    rel = pd.read_parquet(layout.tables_dir / "reliability.parquet").set_index("metric")
    assert rel.cv_eval["reconstruction"] == 0.0 and rel.s_eval["accessibility"] > 0  # no draw vs a drawn subset
    assert rel.rho_gt_mcc[["reconstruction", "accessibility", "coverage"]].notna().all()
    con = pd.read_parquet(layout.tables_dir / "reliability_contrasts.parquet")
    main_pairs = pd.read_parquet(layout.tables_dir / "contrasts.parquet")
    assert len(con[con.table == "contrasts"]) == len(main_pairs)
    assert ((con["diff"].abs() < con.mrd_3) == con.below_mrd_3).all()
    training = pd.read_parquet(layout.tables_dir / "reliability_training_summary.parquet")
    assert training.max_abs_diff_final.max() < 1e-5  # retraining reproduces the stored SAEs
    html = layout.report.read_text()
    assert "How far to trust each metric" in html and 'id="fig-reliability_ground_truth"' in html
    again = CliRunner().invoke(main, ["reliability", "--run-dir", str(layout.root), "--cheap-only"])
    assert again.exit_code == 0, again.output
    assert (layout.tables_dir / "reliability_panel.parquet").exists()  # kept: same cells table
