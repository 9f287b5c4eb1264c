"""Metric math against hand-computed cases and independent formulas (scipy, brute force, numpy.trapezoid)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr

from raybench.analysis import metrics as mt


def _sums(a: np.ndarray, y: np.ndarray):
    return len(a), a.sum(), y.sum(), (a * a).sum(), (y * y).sum(), (a * y).sum()


def test_pearson_hand_cases():
    a = np.array([1.0, 2.0, 3.0])
    assert mt.pearson_from_sums(*_sums(a, 2 * a)) == pytest.approx(1.0)
    assert mt.pearson_from_sums(*_sums(a, a[::-1].copy())) == pytest.approx(-1.0)
    # a = (0, 1, 0, 1), y = (0, 0, 1, 1): uncorrelated by construction
    assert mt.pearson_from_sums(*_sums(np.array([0, 1, 0, 1.0]), np.array([0, 0, 1, 1.0]))) == pytest.approx(0.0)
    # hand: a = (1, 2, 4), y = (1, 3, 2): deviations (-4/3, -1/3, 5/3), (-1, 1, 0)
    # -> sxy = 1, sxx = 14/3, syy = 2, r = 1 / sqrt(28/3)
    r = mt.pearson_from_sums(*_sums(np.array([1, 2, 4.0]), np.array([1, 3, 2.0])))
    assert r == pytest.approx(1 / np.sqrt(28 / 3), rel=1e-12)


def test_pearson_matches_scipy_and_broadcasts():
    rng = np.random.default_rng(0)
    a = rng.normal(3.0, 2.0, size=(4, 200))
    y = 0.4 * a + rng.normal(size=(4, 200))
    sums = [len(a[0]), a.sum(1), y.sum(1), (a * a).sum(1), (y * y).sum(1), (a * y).sum(1)]
    got = mt.pearson_from_sums(*sums)
    want = [pearsonr(a[i], y[i])[0] for i in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_pearson_constant_coordinate_is_zero():
    a = np.full(50, 0.3)  # constant but not exactly representable: rounding must not invent a correlation
    y = np.random.default_rng(1).normal(size=50)
    assert mt.pearson_from_sums(*_sums(a, y)) == 0.0
    assert mt.pearson_from_sums(*_sums(np.zeros(5), np.arange(5.0))) == 0.0


def test_accessibility_coverage_r2_hand():
    r = np.array([[0.1, -0.3, 0.2, 0.0], [0.5, 0.5, -0.5, 0.19]])
    np.testing.assert_allclose(mt.accessibility(r), [0.15, (0.5 * 3 + 0.19) / 4])
    np.testing.assert_allclose(mt.coverage(r, 0.2), [0.5, 0.75])
    np.testing.assert_allclose(mt.r2_from_sums([1.0, 5.0], [10.0, 10.0]), [0.9, 0.5])
    assert np.isnan(mt.r2_from_sums(1.0, 0.0))


def test_auc_matches_numpy_trapezoid():
    es = [1, 4, 8, 16, 32]
    x = np.log(es)
    rng = np.random.default_rng(2)
    v = rng.uniform(size=(3, 5))
    want = np.trapezoid(v, x, axis=-1) / (x[-1] - x[0])
    np.testing.assert_allclose(mt.common_scale_auc(v, es), want, rtol=1e-14)
    np.testing.assert_allclose(mt.common_scale_auc(v.T, es, axis=0), want, rtol=1e-14)
    assert mt.common_scale_auc(np.full(5, 0.7), es) == pytest.approx(0.7)  # a constant curve has AUC = value
    assert mt.common_scale_auc(np.array([0.0, 1.0]), [1, 4]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="increasing"):
        mt.auc_weights([4, 1])


def _brute_matching(a: np.ndarray, b: np.ndarray) -> float:
    an = a / np.linalg.norm(a, axis=0)
    bn = b / np.linalg.norm(b, axis=0)
    cos = an.T @ bn
    m = cos.shape[0]
    perms = list(itertools.permutations(range(m)))
    assert len(perms) == 720
    return max(cos[np.arange(m), list(p)].mean() for p in perms)


def test_matched_cosine_equals_brute_force_over_720_permutations():
    rng = np.random.default_rng(3)
    for _ in range(3):
        a, b = rng.normal(size=(10, 6)), rng.normal(size=(10, 6))
        assert mt.matched_cosine(a, b) == pytest.approx(_brute_matching(a, b), abs=1e-12)


def test_matched_cosine_signed_and_permutation_invariant():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(20, 6))
    perm = rng.permutation(6)
    assert mt.matched_cosine(a, 3.0 * a[:, perm]) == pytest.approx(1.0)
    # signed: a flipped column set matches with cosine -1 on the best assignment only if nothing better exists
    assert mt.matched_cosine(a[:, :1], -a[:, :1]) == pytest.approx(-1.0)


def test_random_floor_is_mean_cosine_in_expectation():
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(12, 8)), rng.normal(size=(12, 8))
    cos = (a / np.linalg.norm(a, axis=0)).T @ (b / np.linalg.norm(b, axis=0))
    floor = mt.random_pairing_floor(a, b, 4000, np.random.default_rng(0))
    assert floor == pytest.approx(cos.mean(), abs=0.01)
    f1 = mt.random_pairing_floor(a, b, 100, np.random.default_rng(9))
    f2 = mt.random_pairing_floor(a, b, 100, np.random.default_rng(9))
    assert f1 == f2


def test_subspace_overlap_hand_cases():
    e = np.eye(4)
    assert mt.subspace_overlap(e[:, :2], e[:, :2] @ np.array([[2.0, 1.0], [0.0, 3.0]])) == pytest.approx(1.0)
    assert mt.subspace_overlap(e[:, :2], e[:, 2:]) == pytest.approx(0.0)
    assert mt.subspace_overlap(e[:, :1], (e[:, :1] + e[:, 1:2]) / np.sqrt(2)) == pytest.approx(0.5)
    # two of three directions shared: ||Qa^T Qb||^2 = 2, rank 3
    assert mt.subspace_overlap(e[:, :3], e[:, [0, 1, 3]]) == pytest.approx(2 / 3)


def test_reproducibility_same_count_and_planted_structure():
    rng = np.random.default_rng(6)
    base = rng.normal(size=(32, 40))
    seeds = [base[:, :40] + 0.05 * rng.normal(size=(32, 40)), base[:, rng.permutation(40)[:30]],
             base[:, :35] + 0.05 * rng.normal(size=(32, 35))]
    res = mt.reproducibility(seeds, top=25, n_permutations=100, seed=1)
    assert res["n_columns"] == 25
    assert res["excess"] == pytest.approx(res["matched_cosine"] - res["random_floor"])
    noise = [rng.normal(size=(32, 25)) for _ in range(3)]
    res0 = mt.reproducibility(noise, top=25, n_permutations=100, seed=1)
    assert res["excess"] > res0["excess"] + 0.2
    assert res["subspace_overlap"] > res0["subspace_overlap"]
    assert mt.reproducibility(noise, 25, 100, 1) == res0  # deterministic given the seed
    with pytest.raises(ValueError, match="two seeds"):
        mt.reproducibility(noise[:1], 25, 100, 1)


def test_seed_and_depth_averaging_and_auc_helper():
    df = pd.DataFrame({"model": ["a"] * 8, "q": [0.0] * 4 + [1.0] * 4, "expansion": [1, 1, 4, 4] * 2,
                       "seed": [1, 2] * 4, "v": [0.2, 0.4, 0.5, 0.7, 0.0, 0.2, 0.1, 0.3]})
    sa = mt.seed_average(df, ["model", "q", "expansion"], ["v"])
    np.testing.assert_allclose(sa.v, [0.3, 0.6, 0.1, 0.2])
    da = mt.depth_average(sa, ["model", "expansion"], ["v"])
    np.testing.assert_allclose(da.v, [0.2, 0.4])
    auc = mt.auc_over_expansions(sa, ["model", "q"], "v", [1, 4])
    np.testing.assert_allclose(auc.auc, [0.45, 0.15])
    # a depth lacking one expansion has no AUC
    auc2 = mt.auc_over_expansions(sa[~((sa.q == 1.0) & (sa.expansion == 4))], ["model", "q"], "v", [1, 4])
    assert list(auc2.q) == [0.0]


def test_patient_sums_sorted_and_unsorted_agree():
    rng = np.random.default_rng(7)
    patient = np.sort(rng.integers(0, 6, size=30))
    patient[:6] = np.arange(6)
    patient = np.sort(patient)
    a, y = rng.normal(size=(30, 3)), rng.normal(size=(30, 3))
    sse, sst = rng.uniform(size=30), rng.uniform(size=30)
    fast = mt.patient_sums(patient, 6, a, y, sse, sst)
    perm = rng.permutation(30)
    slow = mt.patient_sums(patient[perm], 6, a[perm], y[perm], sse[perm], sst[perm])
    for k in ("n", "sse", "sst", "corr"):
        np.testing.assert_allclose(fast[k], slow[k], atol=1e-12)
    assert fast["corr"].shape == (6, 3, 5)
    p2 = patient == 2
    np.testing.assert_allclose(fast["corr"][2, 1], [a[p2, 1].sum(), y[p2, 1].sum(), (a[p2, 1] ** 2).sum(),
                                                    (y[p2, 1] ** 2).sum(), (a[p2, 1] * y[p2, 1]).sum()])
    assert fast["n"][2] == p2.sum()
