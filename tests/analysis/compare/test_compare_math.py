"""The comparison's math on hand-checkable profiles: a preserved and a swapped leader, ties, tau and rho against
scipy, AUC differences and their intervals, the protocol check."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import kendalltau, spearmanr

from raybench.analysis.compare.run import (
    COLUMNS,
    CompareConfig,
    CompareError,
    RunProfiles,
    check_comparable,
    check_metrics,
    compute,
    kendall_tau_b,
    protocol_differences,
    run_seed,
    spearman_rho,
    top_mask,
)
from raybench.core.config import demo_protocol

MODELS = ("csfm", "ecg_fm", "st_mem")
# rows: reconstruction, accessibility, coverage
POINT_A = np.array([[0.90, 0.95, 0.80], [0.30, 0.20, 0.10], [0.50, 0.50, 0.25]])
POINT_B = np.array([[0.91, 0.96, 0.70], [0.10, 0.20, 0.30], [0.40, 0.60, 0.60]])


def _run(name: str, point: np.ndarray, draws: np.ndarray, models=MODELS, protocol=None) -> RunProfiles:
    protocol = protocol or dataclasses.replace(demo_protocol(), grid=dataclasses.replace(demo_protocol().grid,
                                                                                           models=MODELS))
    return RunProfiles(name=name, protocol=protocol, cohort_kind="synth", models=tuple(models), point=point,
                       draws=draws, n_cells=10, n_patients=20, n_concepts=5, seed=1)


def _constant_draws(point: np.ndarray, n: int = 4) -> np.ndarray:
    return np.repeat(point[:, None, :], n, axis=1)


def test_preserved_and_swapped_leaders_by_hand():
    out = compute(_run("ptbxl", POINT_A, _constant_draws(POINT_A)), _run("mimic", POINT_B, _constant_draws(POINT_B)))
    assert {k: list(v.columns) for k, v in out.items()} == COLUMNS
    lead = out["leaders"].set_index("metric")
    rec, acc, cov = lead.loc["reconstruction"], lead.loc["accessibility"], lead.loc["coverage"]
    assert (rec.leader_a, rec.leader_b, bool(rec.leader_preserved)) == ("ecg_fm", "ecg_fm", True)
    assert rec.rank_in_b_of_leader_a == 1.0 and rec.preserved_prob == 1.0
    assert (acc.leader_a, acc.leader_b, bool(acc.leader_preserved)) == ("csfm", "st_mem", False)
    assert acc.rank_in_b_of_leader_a == 3.0 and acc.rank_in_a_of_leader_b == 3.0 and acc.preserved_prob == 0.0
    # a tie at the top of A (csfm = ecg_fm) and of B (ecg_fm = st_mem): the shared ecg_fm preserves the leader
    assert (cov.leader_a, cov.leader_b, bool(cov.leader_preserved)) == ("csfm|ecg_fm", "ecg_fm|st_mem", True)
    assert cov.auc_a == 0.5 and cov.auc_b == 0.6
    assert cov.rank_in_b_of_leader_a == 1.5 and cov.rank_in_a_of_leader_b == 1.5

    agree = out["rank_agreement"].set_index("metric")
    assert agree.loc["reconstruction", "kendall_tau"] == pytest.approx(1.0)
    assert agree.loc["accessibility", "kendall_tau"] == pytest.approx(-1.0)
    assert agree.loc["accessibility", "spearman"] == pytest.approx(-1.0)
    # coverage: A = (.5, .5, .25), B = (.4, .6, .6): scipy's tau-b and rho
    assert agree.loc["coverage", "kendall_tau"] == pytest.approx(kendalltau(POINT_A[2], POINT_B[2]).statistic)
    assert agree.loc["coverage", "spearman"] == pytest.approx(spearmanr(POINT_A[2], POINT_B[2]).statistic)
    # constant draws: every interval collapses onto its point
    assert (agree.kendall_ci_low == agree.kendall_tau).all() and (agree.kendall_ci_high == agree.kendall_tau).all()

    diff = out["auc_differences"].set_index(["metric", "model"])
    row = diff.loc[("accessibility", "st_mem")]
    assert row["diff"] == pytest.approx(0.2) and row.ci_low == pytest.approx(0.2) and row.ci_high == pytest.approx(0.2)
    assert (row.rank_a, row.rank_b) == (3.0, 1.0)
    assert diff.loc[("accessibility", "ecg_fm"), "diff"] == 0.0 and diff.loc[("accessibility", "ecg_fm"), "p"] == 1.0
    runs = out["runs"].set_index("role")
    assert list(runs.run) == ["ptbxl", "mimic"] and (runs.draws == 4).all()


def test_models_align_by_name_and_draws_pair_independently():
    """Run B lists its models in another order; draw i of each run forms draw i of a between-run statistic."""
    rng = np.random.default_rng(0)
    da, db = rng.normal(size=(3, 200, 3)) * 0.05 + POINT_A[:, None], rng.normal(size=(3, 200, 3)) * 0.05 + POINT_B[
        :, None]
    perm = [2, 0, 1]
    a = _run("a", POINT_A, da)
    b = _run("b", POINT_B[:, perm], db[:, :, perm], models=tuple(MODELS[i] for i in perm))
    out = compute(a, b, CompareConfig(ci_low=5, ci_high=95))
    diff = out["auc_differences"]
    acc = diff[diff.metric == "accessibility"].set_index("model")
    d = db[1, :, 2] - da[1, :, 2]  # st_mem
    assert acc.loc["st_mem", "diff"] == pytest.approx(POINT_B[1, 2] - POINT_A[1, 2])
    assert acc.loc["st_mem", "ci_low"] == pytest.approx(np.percentile(d, 5))
    assert acc.loc["st_mem", "ci_high"] == pytest.approx(np.percentile(d, 95))
    assert acc.loc["st_mem", "ci_low_b"] == pytest.approx(np.percentile(db[1, :, 2], 5))
    tau = kendall_tau_b(da[1], db[1])
    agree = out["rank_agreement"].set_index("metric")
    assert agree.loc["accessibility", "kendall_ci_low"] == pytest.approx(np.percentile(tau, 5))
    lead = out["leaders"].set_index("metric")
    expect = np.mean(np.argmax(da[0], axis=1) == np.argmax(db[0], axis=1))
    assert lead.loc["reconstruction", "preserved_prob"] == pytest.approx(expect)


def test_tau_and_rho_equal_scipy_with_ties():
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, size=(300, 6)).astype(float)  # many ties
    y = rng.integers(0, 4, size=(300, 6)).astype(float)
    tau, rho = kendall_tau_b(x, y), spearman_rho(x, y)
    for i in range(300):
        want_tau, want_rho = kendalltau(x[i], y[i]).statistic, spearmanr(x[i], y[i]).statistic
        assert (np.isnan(tau[i]) and np.isnan(want_tau)) or tau[i] == pytest.approx(want_tau, abs=1e-12)
        assert (np.isnan(rho[i]) and np.isnan(want_rho)) or rho[i] == pytest.approx(want_rho, abs=1e-12)


def test_rounding_level_differences_are_ties():
    v = np.array([[0.3, 0.3 + 1e-17 + 5e-17, 0.1]])
    assert top_mask(v).tolist() == [[True, True, False]]
    assert kendall_tau_b(v, np.array([[0.2, 0.1, 0.0]]))[0] == pytest.approx(
        kendalltau([0.3, 0.3, 0.1], [0.2, 0.1, 0.0]).statistic)


def test_protocol_mismatch_names_the_fields_and_the_fix():
    p = demo_protocol()
    other = dataclasses.replace(p, grid=dataclasses.replace(p.grid, models=p.grid.models[:2], expansions=(1, 8)),
                                sae=dataclasses.replace(p.sae, steps=p.sae.steps + 1))
    diffs = protocol_differences(p, other)
    assert set(diffs.field) == {"grid.models", "grid.expansions", "sae.steps"}
    assert set(diffs[diffs.blocking].field) == {"grid.models", "grid.expansions"}
    with pytest.raises(CompareError, match=r"grid\.expansions: \[1, 4, 8, 16, 32\] in A, \[1, 8\] in B.*rerun B"):
        check_comparable(diffs, "A", "B")
    reordered = dataclasses.replace(p, grid=dataclasses.replace(p.grid, models=tuple(reversed(p.grid.models))))
    assert protocol_differences(p, reordered).empty  # the order of the models is not a difference
    with pytest.raises(CompareError, match="only in a"):
        compute(_run("a", POINT_A, _constant_draws(POINT_A)),
                _run("b", POINT_B, _constant_draws(POINT_B), models=("csfm", "ecg_fm", "hubert_ecg")))


def test_run_seeds_are_distinct_and_fixed():
    assert run_seed(20260801, 0) != run_seed(20260801, 1)
    assert run_seed(20260801, 0) == run_seed(20260801, 0)


def test_figure_and_report_from_the_tables_alone(tmp_path):
    from raybench.analysis.compare.figures import draw
    from raybench.analysis.compare.section import write_report

    tables = compute(_run("ptbxl", POINT_A, _constant_draws(POINT_A)), _run("<b>", POINT_B, _constant_draws(POINT_B)))
    first, second = draw(tables, tmp_path / "one"), draw(tables, tmp_path / "two")
    assert [p.name for p in first] == ["compare.png", "compare.svg"]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]
    assert draw({**tables, "leaders": tables["leaders"].iloc[:0]}, tmp_path / "none") == []
    html = write_report(tables, tmp_path, first).read_text()
    assert "&lt;b&gt;" in html and "<b>" not in html.split("<main>")[1].split("</h1>")[0]  # run names escaped
    assert "Metric-specific leader preserved in 2 of 3 metrics" in html


def test_profiles_with_other_metrics_are_refused():
    import pandas as pd

    full = pd.DataFrame({"metric": ["reconstruction", "accessibility", "coverage"], "model": "csfm"})
    check_metrics("a", full, "b", full)
    with pytest.raises(CompareError, match=r"in a, \['accessibility', 'reconstruction'\] in b"):
        check_metrics("a", full, "b", full[full.metric != "coverage"])
