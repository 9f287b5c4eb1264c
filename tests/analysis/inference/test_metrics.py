"""Summary math against hand-computed cases and independent formulas (brute force, numpy.trapezoid)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raybench.analysis.inference import metrics as mt


def test_auc_matches_numpy_trapezoid():
    es = [1, 4, 8, 16, 32]
    x = np.log(es)
    rng = np.random.default_rng(2)
    v = rng.uniform(size=(3, 5))
    want = np.trapezoid(v, x, axis=-1) / (x[-1] - x[0])
    np.testing.assert_allclose(v @ mt.auc_weights(es), want, rtol=1e-14)
    np.testing.assert_allclose(mt.trapezoid_auc(v.T, es, axis=0), want, rtol=1e-14)
    assert np.full(5, 0.7) @ mt.auc_weights(es) == pytest.approx(0.7)  # a constant curve has AUC = value
    assert np.array([0.0, 1.0]) @ mt.auc_weights([1, 4]) == pytest.approx(0.5)
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
