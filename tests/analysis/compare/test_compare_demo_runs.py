"""`raybench compare` on two real demo-protocol runs: the session's finished run (synthetic cohort, seed 5) and a
second one through every stage of `raybench grid` on another synthetic cohort (seed 6; its feature dashboards,
secondary analyses and reliability audit, which `compare` does not read, off)."""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from click.testing import CliRunner

from raybench.app.cli import main


@pytest.fixture(scope="module")
def second_cohort(finished_small_run, tmp_path_factory):
    from raybench.app.pipeline import run_pipeline
    from raybench.core.config import FeaturesConfig
    from tests.small_run import small_config

    cfg = small_config(tmp_path_factory.mktemp("cohort6") / "synth6")
    # another cohort (seed 6), 4/5 the size (its training split still holds one SAE batch): cohort size is not
    # protocol, so the protocol tables still differ only in eval.selection_records
    cfg = dataclasses.replace(cfg, cohort=dataclasses.replace(cfg.cohort, seed=6, records=96, patients=38),
                              # the comparison reads profiles and cells: dashboards, secondary analyses and the
                              # reliability audit's cheap part are off
                              features=FeaturesConfig(enabled=False),
                              secondary=dataclasses.replace(cfg.secondary_settings(), analyses=()),
                              reliability=dataclasses.replace(cfg.reliability, cheap=False),
                              # speed only (outside config_hash): 4 trials one after another in 1 reused process
                              # (CPU-seconds, not wall, count on the test machine), 1 encoder batch
                              resources=dataclasses.replace(cfg.resources, trial_unit="model",
                                                            reuse_trial_processes=True, max_concurrent_trials=1),
                              encoders=dataclasses.replace(cfg.encoders, batch_size=128))
    run_pipeline(cfg, echo=lambda _: None)
    return finished_small_run[0], cfg


@pytest.mark.slow
def test_compare_two_demo_runs_of_other_cohorts(second_cohort, tmp_path):
    a, b = second_cohort
    out = tmp_path / "cmp"
    res = CliRunner().invoke(main, ["compare", a.run_dir, b.run_dir, "--out", str(out)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert (out / "report.html").exists() and (out / "figures" / "compare.svg").exists()
    runs = pd.read_parquet(out / "tables" / "runs.parquet")
    assert runs.draws.tolist() == [a.protocol.inference.patient_draws] * 2 and runs.seed.nunique() == 2
    # the finished run draws its selection subset; the second does not: listed, not refused
    proto = pd.read_parquet(out / "tables" / "protocol.parquet")
    assert list(proto.field) == ["eval.selection_records"] and not proto.blocking.any()
    lead = pd.read_parquet(out / "tables" / "leaders.parquet")
    assert list(lead.metric) == ["reconstruction", "accessibility", "coverage"]
    diff = pd.read_parquet(out / "tables" / "auc_differences.parquet").set_index(["metric", "model"])
    prof = pd.read_parquet(f"{b.run_dir}/tables/profiles.parquet").set_index(["metric", "model"]).auc
    assert (diff.auc_b - prof.loc[diff.index]).abs().max() < 1e-9  # run B's own profiles, its tables not stale
