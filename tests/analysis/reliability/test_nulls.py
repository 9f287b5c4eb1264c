"""The audit's statistics and Monte-Carlo nulls against the paper's figures (Appendix Q, S.1-S.3) and scipy."""

from __future__ import annotations

from dataclasses import astuple

import numpy as np
import pytest
from scipy import stats

from raybench.analysis.reliability import nulls


def test_share_null_of_the_papers_design_reproduces_its_figures():
    null = nulls.share_null((4, 1, 3, 9))  # 4 variants x 3 seeds x 9 snapshots (Appendix S.1)
    assert (null > 0.20).mean() < 1e-3
    assert (null > 0.10).mean() == pytest.approx(0.02, abs=0.006)
    assert (null > 0.05).mean() == pytest.approx(0.21, abs=0.025)
    weak, strong = nulls.null_points(null)
    assert 0.08 < weak < strong < 0.20


def test_shares_against_a_hand_case_and_scipy_one_way_anova():
    y = np.array([1.0, 3.0, 4.0, 6.0, 10.0, 14.0]).reshape(3, 1, 2, 1)  # variant means 2, 5, 12; seed sd^2 2, 2, 8
    sh = nulls.variance_shares(y)
    v, s = np.var([2.0, 5.0, 12.0], ddof=1), np.mean([2.0, 2.0, 8.0])
    assert sh.variant == pytest.approx(v / (v + s)) and sh.seed == pytest.approx(s / (v + s)) and sh.snapshot == 0
    rng = np.random.default_rng(0)
    y = rng.normal(size=(5, 1, 4, 1)) + np.arange(5)[:, None, None, None] * 0.3
    sh = nulls.variance_shares(y)
    f = stats.f_oneway(*y[:, 0, :, 0]).statistic  # F = S * V_variant / V_seed on a balanced one-way design
    assert 4 * sh.variant / sh.seed == pytest.approx(f)


def test_block_means_never_count_as_signal():
    rng = np.random.default_rng(1)
    y = rng.normal(size=(6, 5, 3, 1))
    shifted = y + 100.0 * np.arange(5)[None, :, None, None]
    assert astuple(nulls.variance_shares(shifted)) == pytest.approx(astuple(nulls.variance_shares(y)))


def test_monte_carlo_p_values_are_calibrated_under_noise():
    rng = np.random.default_rng(2)
    null = nulls.share_null((6, 2, 3, 1))
    ps = [nulls.p_upper(null, nulls.variance_shares(rng.normal(size=(6, 2, 3, 1))).variant) for _ in range(400)]
    assert np.mean(np.array(ps) < 0.05) == pytest.approx(0.05, abs=0.03)


def test_snr_of_between_model_sd_2_and_jitter_1_is_2_and_ignores_a_shared_trend():
    rng = np.random.default_rng(3)
    eff = rng.normal(size=6)
    eff = (eff - eff.mean()) / eff.std(ddof=1) * 2.0
    steps = np.arange(60.0)
    y = eff[:, None, None, None] + rng.normal(size=(6, 1, 3, 60))
    got = nulls.snr(y, steps)
    assert got == pytest.approx(2.0, abs=0.3)
    assert nulls.snr(y + 0.02 * (steps - 25.0) ** 2 - 0.5 * steps, steps) == pytest.approx(got, rel=1e-9)
    assert np.quantile(nulls.snr_null((6, 1, 3, 8)), 0.999) < 1.0  # pure noise never reads as informative here


def test_winner_null_is_exact_and_matches_the_paper():
    pmf = nulls.winners_null_pmf(4, 3)
    assert pmf.sum() == pytest.approx(1.0) and pmf[3] == pytest.approx(24 / 64)  # ~0.38 (Appendix S.2)
    assert pmf[1] == pytest.approx(4 / 64)
    assert nulls.distinct_winners(np.array([[1.0, 0.0, 5.0], [2.0, 3.0, 0.0]])) == 2


def test_rank_agreement_and_its_null_match_the_paper():
    null = nulls.rank_agreement_null(4, 3)  # 4 variants, 3 seed pairs (Appendix S.3)
    assert (null < 0).mean() == pytest.approx(0.55, abs=0.02)
    assert (null < -0.33).mean() == pytest.approx(0.27, abs=0.02)
    m = np.array([[1.0, 2.0, 1.5], [2.0, 1.0, 2.5], [3.0, 3.0, 3.5], [4.0, 4.0, 4.5]])
    want = np.mean([stats.spearmanr(m[:, a], m[:, b]).statistic for a, b in ((0, 1), (0, 2), (1, 2))])
    assert nulls.rank_agreement(m) == pytest.approx(want)


def test_trend_sees_a_decline_and_its_null_is_centred():
    rng = np.random.default_rng(4)
    falling = [np.linspace(1, 0, 9) + 0.05 * rng.normal(size=9) for _ in range(6)]
    null = nulls.trend_null(6, 9)
    assert nulls.trend(falling) < -0.8 and nulls.p_lower(null, nulls.trend(falling)) < 1e-3
    assert abs(np.median(null)) < 0.02
    assert nulls.trend([np.ones(5), np.ones(5)]) == 0.0  # a constant series neither rises nor falls


@pytest.mark.parametrize("rho", [0.9, 0.3, -0.4])
def test_one_sided_spearman_p_matches_scipy(rho):
    rng = np.random.default_rng(5)
    x = rng.normal(size=24)
    y = rho * x + np.sqrt(1 - rho ** 2) * rng.normal(size=24)
    ref = stats.spearmanr(x, y, alternative="greater")
    assert nulls.spearman_p_one_sided(ref.statistic, 24) == pytest.approx(ref.pvalue, rel=1e-6)


def test_designs_too_small_are_refused():
    with pytest.raises(ValueError, match="design"):
        nulls.variance_shares(np.zeros((1, 1, 3, 1)))
    with pytest.raises(ValueError, match="snapshots"):
        nulls.snr(np.zeros((2, 1, 3, 3)), np.arange(3.0))
