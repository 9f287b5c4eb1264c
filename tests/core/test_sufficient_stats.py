"""raybench.core.sufficient_stats: Pearson r from sums against scipy.stats.pearsonr, the one zero-variance rule, and
per-patient sums against brute-force loops; evaluation, bootstrap and secondary analyses all use this one copy."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy.stats import pearsonr

from raybench.core import sufficient_stats as ss


def _sums(a: np.ndarray, y: np.ndarray):
    a, y = np.asarray(a, dtype=np.float64), np.asarray(y, dtype=np.float64)
    return len(a), a.sum(), y.sum(), (a * a).sum(), (y * y).sum(), (a * y).sum()


def test_pearson_hand_cases():
    a = np.array([1.0, 2.0, 3.0])
    assert ss.pearson_from_sums(*_sums(a, 2 * a)) == pytest.approx(1.0)
    assert ss.pearson_from_sums(*_sums(a, a[::-1].copy())) == pytest.approx(-1.0)
    # a = (0, 1, 0, 1), y = (0, 0, 1, 1): uncorrelated by construction
    assert ss.pearson_from_sums(*_sums([0, 1, 0, 1], [0, 0, 1, 1])) == pytest.approx(0.0)
    # hand: a = (1, 2, 4), y = (1, 3, 2): deviations (-4/3, -1/3, 5/3), (-1, 1, 0)
    # -> sxy = 1, sxx = 14/3, syy = 2, r = 1 / sqrt(28/3)
    assert ss.pearson_from_sums(*_sums([1, 2, 4], [1, 3, 2])) == pytest.approx(1 / np.sqrt(28 / 3), rel=1e-12)


@pytest.mark.parametrize("n", [2, 3, 5, 17])
def test_pearson_matches_scipy_on_small_cases(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        a = rng.normal(rng.uniform(-5, 5), rng.uniform(0.1, 3), size=n)
        y = rng.uniform(-1, 1) * a + rng.normal(size=n) + 40.0  # an offset: the sums must stay well conditioned
        assert ss.pearson_from_sums(*_sums(a, y)) == pytest.approx(pearsonr(a, y).statistic, abs=1e-10)


def test_pearson_broadcasts_and_parts_agree():
    rng = np.random.default_rng(0)
    a = rng.normal(3.0, 2.0, size=(200, 4))
    y = 0.4 * a + rng.normal(size=(200, 4))
    want = [pearsonr(a[:, i], y[:, i]).statistic for i in range(4)]
    np.testing.assert_allclose(ss.paired_corr(a, y), want, rtol=1e-12, atol=1e-12)
    parts = ss.corr_parts(a, y).sum(axis=0)  # [4, 5]
    np.testing.assert_allclose(ss.pearson_from_parts(200, parts), want, rtol=1e-12, atol=1e-12)
    grid = ss.pearson_from_sums(200, a.sum(0)[:, None], y.sum(0)[None, :], (a * a).sum(0)[:, None],
                                (y * y).sum(0)[None, :], a.T @ y)  # [4, 4]: every a with every y
    np.testing.assert_allclose(grid, np.corrcoef(a.T, y.T)[:4, 4:], atol=1e-12)


def test_degenerate_cases_score_zero_where_scipy_has_no_value():
    y = np.random.default_rng(1).normal(size=50)
    constant = np.full(50, 0.3)  # constant but not exactly representable: rounding must not invent a correlation
    assert np.ptp(constant) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns that r is undefined
        assert np.isnan(pearsonr(constant, y).statistic)
    assert ss.pearson_from_sums(*_sums(constant, y)) == 0.0
    assert ss.pearson_from_sums(*_sums(y, constant)) == 0.0
    assert ss.pearson_from_sums(*_sums(np.zeros(5), np.arange(5.0))) == 0.0  # a dead latent
    assert ss.pearson_from_sums(*_sums(np.ones(4), np.ones(4))) == 0.0
    assert ss.pearson_from_sums(*_sums([2.0], [3.0])) == 0.0  # one record
    assert ss.pearson_from_sums(0, 0, 0, 0, 0, 0) == 0.0  # no record (a bootstrap draw may give a concept none)
    # a tiny but real spread is not "constant": r is scipy's
    tiny = 1.0 + 1e-5 * np.random.default_rng(2).normal(size=50)
    assert ss.pearson_from_sums(*_sums(tiny, y)) == pytest.approx(pearsonr(tiny, y).statistic, abs=1e-6)


def test_the_zero_variance_rule_threshold():
    """r = 0 exactly when n*sum(x^2) - (sum x)^2 <= rtol * n*sum(x^2) for either side."""
    a = np.array([1.0, 1.001])
    var, scale = 2 * (a * a).sum() - a.sum() ** 2, 2 * (a * a).sum()  # ~1e-6 and ~4.004
    ratio = var / scale
    assert ss.centered_sum_of_squares(2, a.sum(), (a * a).sum(), rtol=ratio * 0.99) == pytest.approx(var)
    assert ss.centered_sum_of_squares(2, a.sum(), (a * a).sum(), rtol=ratio * 1.01) == 0.0
    y = np.array([0.0, 1.0])
    assert ss.pearson_from_sums(*_sums(a, y), rtol=ratio * 0.99) == pytest.approx(1.0)
    assert ss.pearson_from_sums(*_sums(a, y), rtol=ratio * 1.01) == 0.0
    assert ss.CONSTANT_RTOL == 1e-12


def test_evaluation_bootstrap_and_secondary_use_this_one_implementation():
    from raybench.analysis.inference import packed_stats
    from raybench.analysis.secondary import estimators
    from raybench.sae import evaluate

    for module in (evaluate, packed_stats, estimators):
        assert module.pearson_from_sums is ss.pearson_from_sums, module.__name__
    assert evaluate.patient_stats is ss.patient_stats and estimators.paired_corr is ss.paired_corr


def _brute_patient_sums(codes, n_patients, values):
    out = np.zeros((n_patients, *values.shape[1:]))
    for i, p in enumerate(codes):
        out[p] += values[i]
    return out


def test_per_patient_sums_match_a_loop_in_any_record_order():
    rng = np.random.default_rng(7)
    codes = np.sort(rng.integers(0, 6, size=30))
    values = rng.normal(size=(30, 3, 2))
    want = _brute_patient_sums(codes, 7, values)  # patient 6 has no record: zeros
    np.testing.assert_allclose(ss.per_patient_sums(codes, 7, values), want, atol=1e-12)
    perm = rng.permutation(30)
    np.testing.assert_allclose(ss.per_patient_sums(codes[perm], 7, values[perm]), want, atol=1e-12)
    np.testing.assert_allclose(ss.per_patient_sums(codes, 7, values[:, 0, 0]), want[:, 0, 0], atol=1e-12)
    with pytest.raises(ValueError, match=r"0\.\.5"):
        ss.per_patient_sums(np.array([0, 6]), 6, np.ones(2))  # code 6 with patients 0..5
    with pytest.raises(ValueError, match="do not fit"):
        ss.per_patient_sums(codes[:5], 7, values)


def test_patient_stats_is_the_patient_stats_npz_content():
    rng = np.random.default_rng(8)
    codes = np.repeat(np.arange(6), [1, 3, 2, 1, 4, 2])
    a, y = rng.normal(size=(13, 3)), rng.normal(size=(13, 3))
    sse, sst = rng.uniform(size=13), rng.uniform(size=13)
    got = ss.patient_stats(codes, 6, a, y, sse, sst)
    assert list(got) == ["n", "sse", "sst", "corr"] and got["n"].dtype == np.int64
    assert got["corr"].shape == (6, 3, 5)
    p4 = codes == 4
    np.testing.assert_array_equal(got["n"], [1, 3, 2, 1, 4, 2])
    np.testing.assert_allclose(got["corr"][4, 1], [a[p4, 1].sum(), y[p4, 1].sum(), (a[p4, 1] ** 2).sum(),
                                                   (y[p4, 1] ** 2).sum(), (a[p4, 1] * y[p4, 1]).sum()])
    np.testing.assert_allclose(got["sse"][4], sse[p4].sum())
    # summed over patients, the parts give the full-sample r (what the bootstrap's point value uses)
    r = ss.pearson_from_parts(got["n"].sum(), got["corr"].sum(axis=0))
    np.testing.assert_allclose(r, ss.paired_corr(a, y), atol=1e-12)
    assert list(ss.patient_stats(codes, 6, a, y)) == ["n", "corr"]
