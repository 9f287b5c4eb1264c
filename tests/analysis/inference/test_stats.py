"""Statistics on draws: hand cases and scipy references."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import false_discovery_control, kendalltau

from raybench.analysis.inference import stats as st


def test_percentile_ci_matches_numpy():
    d = np.random.default_rng(0).normal(size=(2000, 3))
    lo, hi = st.percentile_ci(d, 2.5, 97.5)
    np.testing.assert_allclose(lo, np.percentile(d, 2.5, axis=0))
    np.testing.assert_allclose(hi, np.percentile(d, 97.5, axis=0))


def test_ranks_rank1_mean_rank_hand():
    d = np.array([[3.0, 1.0, 2.0], [1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(st.ranks(d), [[1, 3, 2], [3, 2, 1]])
    np.testing.assert_allclose(st.rank1_prob(d), [0.5, 0.0, 0.5])
    np.testing.assert_allclose(st.mean_rank(d), [2.0, 2.5, 1.5])
    ties = np.array([[2.0, 2.0, 1.0], [0.5, 0.7, 0.7], [1.0, 1.0, 1.0]])
    np.testing.assert_allclose(st.ranks(ties), [[1.5, 1.5, 3], [3, 1.5, 1.5], [2, 2, 2]])
    np.testing.assert_allclose(st.rank1_prob(ties), [(0.5 + 1 / 3) / 3, (0.5 + 0.5 + 1 / 3) / 3, (0.5 + 1 / 3) / 3])
    assert st.rank1_prob(ties).sum() == pytest.approx(1.0)
    with_nan = np.vstack([d, [[np.nan, 5.0, 0.0]]])  # an incomplete draw is left out
    np.testing.assert_allclose(st.rank1_prob(with_nan), st.rank1_prob(d))
    np.testing.assert_allclose(st.mean_rank(with_nan), st.mean_rank(d))


def test_published_ranks_argsort_in_the_published_model_order():
    d = np.array([[3.0, 1.0, 2.0], [1.0, 2.0, 3.0], [np.nan, 1.0, 1.0]])
    models = ["st_mem", "csfm", "cardiac_fm"]  # published order: cardiac_fm, csfm, st_mem
    r = st.published_ranks(d, models)
    np.testing.assert_array_equal(r, [[1, 3, 2], [3, 2, 1]])  # no tie: the plain ranks; the NaN draw left out
    tied = st.published_ranks(np.array([[1.0, 1.0, 0.0]] * 4), models)
    assert sorted(tied[0]) == [1, 2, 3] and tied[0, 2] == 3  # the tie (st_mem, csfm) still gets ranks 1 and 2
    assert st.rank1_prob(np.array([[1.0, 1.0, 0.0]]), models, "published").sum() == 1.0
    assert st.rank1_prob(np.array([[1.0, 1.0, 0.0]])).tolist() == [0.5, 0.5, 0.0]  # shared
    with pytest.raises(ValueError, match="name of every column"):
        st.mean_rank(d, None, "published")


def test_published_scale_draws_round_to_float32_and_need_a_complete_block():
    cells = pd.DataFrame([{"arm": "primary", "model": m, "q": q, "expansion": e, "seed": s}
                          for m in ("a", "b") for e in (1, 4) for s in (2, 1) for q in (0.5, 0.0)])
    draws = np.random.default_rng(3).uniform(size=(5, len(cells)))
    out = st.published_scale_draws(draws, cells, ["a", "b"], [1, 4])
    sel = ((cells.model == "b") & (cells.expansion == 4)).to_numpy()
    want = draws[:, sel].astype(np.float32).astype(np.float64).mean(axis=1)
    np.testing.assert_allclose(out[:, 1, 1], want, rtol=1e-15)
    assert not np.array_equal(out[:, 1, 1], draws[:, sel].mean(axis=1))  # float32 storage shows
    assert st.published_scale_draws(draws[:, 1:], cells.iloc[1:], ["a", "b"], [1, 4]) is None  # a cell missing


def test_paired_p_hand():
    assert st.paired_p(np.ones(99)) == pytest.approx(2 * 1 / 100)
    assert st.paired_p(np.array([-1.0, 1.0, 2.0, 3.0])) == pytest.approx(2 * 2 / 5)
    assert st.paired_p(np.zeros(10)) == 1.0  # capped
    assert st.paired_p(-np.ones(9)) == pytest.approx(0.2)


def test_bh_hand_and_scipy():
    p = [0.01, 0.04, 0.03, 0.5]
    np.testing.assert_allclose(st.benjamini_hochberg(p), [0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])
    rng = np.random.default_rng(1)
    p = rng.uniform(size=15) ** 3
    np.testing.assert_allclose(st.benjamini_hochberg(p), false_discovery_control(p, method="bh"))
    out = st.benjamini_hochberg([0.01, np.nan, 0.02])
    assert np.isnan(out[1]) and out[0] == pytest.approx(0.02) and out[2] == pytest.approx(0.02)


def test_kendall_tau_matches_scipy_with_ties():
    rng = np.random.default_rng(2)
    for _ in range(20):
        x = rng.integers(0, 4, size=6).astype(float)
        y = rng.integers(0, 4, size=6).astype(float)
        want = kendalltau(x, y).statistic
        got = st.kendall_tau(x, y)
        if np.isnan(want):
            assert np.isnan(got)
        else:
            assert got == pytest.approx(want, abs=1e-12)
    assert st.kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)


def test_rank_stability_all_pairs():
    rows = []
    vals = {1: [0.1, 0.2, 0.3], 4: [0.1, 0.3, 0.2], 8: [0.3, 0.2, 0.1]}
    for e, v in vals.items():
        rows += [{"metric": "accessibility", "model": m, "expansion": e, "value": x}
                 for m, x in zip("abc", v, strict=True)]
    out = st.rank_stability(pd.DataFrame(rows))
    assert list(zip(out.expansion_a, out.expansion_b, strict=True)) == [(1, 4), (1, 8), (4, 8)]
    want = [kendalltau(vals[a], vals[b]).statistic for a, b in [(1, 4), (1, 8), (4, 8)]]
    np.testing.assert_allclose(out.kendall_tau, want)  # no ties: ranks and values agree
    assert out.order_a.tolist() == ["c>b>a", "c>b>a", "b>c>a"] and (out.n_models == 3).all()


def test_rank_stability_ranks_ties_before_tau():
    """Tied values get distinct ranks (cardiac_fm before csfm, the published order): tau of the rank vectors,
    not tau-b of the values, which would count the tie as neither concordant nor discordant."""
    vals = {1: {"csfm": 0.5, "cardiac_fm": 0.5, "st_mem": 0.1}, 4: {"csfm": 0.6, "cardiac_fm": 0.4, "st_mem": 0.1}}
    rows = [{"metric": "coverage", "model": m, "expansion": e, "value": v} for e, d in vals.items()
            for m, v in d.items()]
    out = st.rank_stability(pd.DataFrame(rows)).iloc[0]
    assert (out.order_a, out.order_b) == ("cardiac_fm>csfm>st_mem", "csfm>cardiac_fm>st_mem")
    assert out.kendall_tau == pytest.approx(1 / 3)  # ranks (1, 2, 3) vs (2, 1, 3): 2 concordant, 1 discordant
    assert kendalltau([0.5, 0.5, 0.1], [0.4, 0.6, 0.1]).statistic == pytest.approx(2 / np.sqrt(6))  # tau-b: 0.816
    low = st.rank_stability(pd.DataFrame(rows), higher_better={"coverage": False}).iloc[0]
    assert (low.order_a, low.order_b) == ("st_mem>cardiac_fm>csfm", "st_mem>cardiac_fm>csfm")
    assert low.kendall_tau == pytest.approx(1.0)


def test_arm_comparison():
    df = pd.DataFrame({"model": ["a"] * 4, "expansion": [1, 1, 4, 4], "metric": ["coverage"] * 4,
                       "arm": ["primary", "sensitivity"] * 2, "value": [0.5, 0.6, 0.7, 0.65]})
    out = st.arm_comparison(df)
    assert list(out.columns) == ["model", "expansion", "metric", "primary", "sensitivity", "diff"]
    np.testing.assert_allclose(out["diff"], [0.1, -0.05])
    # an E present in one arm only has no comparison
    assert len(st.arm_comparison(df.iloc[:3])) == 1
