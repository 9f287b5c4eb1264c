"""The synthetic activation model and the ground-truth scores."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from raybench.analysis.reliability.ground_truth import (
    SyntheticSpec,
    gt_f1,
    gt_mcc,
    synthetic_data,
    truth_in_normalized_space,
)


@pytest.fixture(scope="module")
def data():
    return synthetic_data(SyntheticSpec())


def test_structure_hierarchies_rates_and_superposition(data):
    spec = SyntheticSpec()
    fire = data.acts > 0
    assert data.dictionary.shape == (spec.n_features, spec.d) and spec.n_features > spec.d
    assert np.allclose(np.linalg.norm(data.dictionary, axis=1), 1.0)
    kids = np.flatnonzero(data.parent >= 0)
    assert kids.size == spec.n_parents * spec.children
    assert not np.any(fire[:, kids] & ~fire[:, data.parent[kids]])  # a child fires only with its parent
    for p in np.unique(data.parent[kids]):
        assert fire[:, data.parent == p].sum(axis=1).max() <= 1  # siblings exclude each other
    rates = fire.mean(axis=0)
    assert rates.max() / max(rates.min(), 1e-9) > 3  # per-feature firing rates differ
    assert data.concepts.shape == (spec.n_records, 3 * spec.concepts_per_kind)
    assert np.allclose(data.concepts.mean(axis=0), 0.0, atol=1e-5)


def test_gt_mcc_is_one_for_the_oracle_and_low_for_a_random_dictionary(data):
    assert gt_mcc(data.dictionary, data.dictionary) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for n in (128, 256):  # E = 1 and 2 at d = 128
        assert gt_mcc(rng.normal(size=(n, data.dictionary.shape[1])), data.dictionary) < 0.3
    perm = data.dictionary[np.random.default_rng(0).permutation(len(data.dictionary))]
    assert gt_mcc(-perm, data.dictionary) == pytest.approx(1.0)  # order and sign do not matter


def test_gt_mcc_is_the_best_one_to_one_matching_brute_force():
    rng = np.random.default_rng(1)
    dec, truth = rng.normal(size=(4, 5)), rng.normal(size=(4, 5))
    a = dec / np.linalg.norm(dec, axis=1, keepdims=True)
    b = truth / np.linalg.norm(truth, axis=1, keepdims=True)
    cos = np.abs(a @ b.T)
    best = max(sum(cos[i, p[i]] for i in range(4)) for p in itertools.permutations(range(4)))
    assert gt_mcc(dec, truth) == pytest.approx(best / 4)
    two = max(cos[0, a] + cos[1, b] for a, b in itertools.permutations(range(4), 2))
    assert gt_mcc(dec[:2], truth) == pytest.approx(two / 2)  # the mean over the matched pairs


def test_gt_f1_is_one_when_latents_are_the_features(data):
    fire = data.acts > 0
    assert gt_f1(fire, data.dictionary, data.dictionary, fire) == pytest.approx(1.0)
    shuffled = fire[:, np.random.default_rng(0).permutation(fire.shape[1])]
    assert gt_f1(shuffled, data.dictionary, data.dictionary, fire) < 0.3
    assert gt_f1(np.zeros_like(fire), data.dictionary, data.dictionary, fire) == 0.0


def test_truth_in_normalized_space_is_unit_and_scaled():
    d = np.array([[1.0, 1.0]]) / np.sqrt(2)
    got = truth_in_normalized_space(d, np.array([1.0, 2.0]))
    assert np.allclose(got, np.array([[2.0, 1.0]]) / np.sqrt(5))
