"""The SynthSAEBench-like synthetic model, its concept tasks and the ground-truth scores."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats

from raybench.analysis.reliability.ground_truth import (
    FAMILIES,
    PAPER_SPEC,
    SyntheticSpec,
    concept_tasks,
    gt_f1,
    gt_mcc,
    synthetic_data,
    tree_layout,
    tree_size,
    truth_in_normalized_space,
    variant_spec,
)


@pytest.fixture(scope="module")
def data():
    return synthetic_data(SyntheticSpec())


def test_structure_trees_zipf_rectified_magnitudes_and_superposition(data):
    spec = SyntheticSpec()
    fire = data.fires
    assert np.array_equal(data.acts > 0, fire & (data.acts > 0))  # magnitude only where the pattern fires
    assert data.dictionary.shape == (spec.n_features, spec.d) and spec.n_features > spec.d
    assert np.allclose(np.linalg.norm(data.dictionary, axis=1), 1.0)
    kids = np.flatnonzero(data.parent >= 0)
    assert kids.size == spec.n_trees * (tree_size(spec) - 1)  # 6 trees of 1 + 3 + 9 + 27 = 40 nodes
    assert not np.any(fire[:, kids] & ~fire[:, data.parent[kids]])  # a child fires only with its parent
    for p in np.unique(data.parent[kids]):
        assert fire[:, data.parent == p].sum(axis=1).max() <= 1  # siblings exclude each other
    depth = max(_depth(i, data.parent) for i in kids)
    assert depth == spec.depth
    roots = np.array([i for i in range(spec.n_features) if data.parent[i] < 0])
    rates = fire[:, roots].mean(axis=0)
    expected = spec.rate_max * (roots + 1.0) ** -spec.zipf_exponent
    heavy = expected > 0.05  # Zipf in the index: earlier features fire more (the rectified Gaussian trims a little)
    assert stats.spearmanr(rates[heavy], expected[heavy]).statistic > 0.8
    assert np.all(rates <= expected + 0.03)
    fired = data.acts[fire]
    assert 0 < (fired == 0).mean() < 0.1 and fired.min() == 0.0  # ReLU(mu + sigma eps): sometimes rectified to 0
    resid = data.x - data.acts @ data.dictionary - data.bias
    assert np.allclose(resid, data.noise, atol=1e-5)


def _depth(i: int, parent: np.ndarray) -> int:
    d = 0
    while parent[i] >= 0:
        i, d = parent[i], d + 1
    return d


def test_paper_size_matches_synthsaebench_16k():
    assert PAPER_SPEC.n_features == 16384 and PAPER_SPEC.n_trees == 128
    assert PAPER_SPEC.n_trees * tree_size(PAPER_SPEC) == 10880  # the rest, 5,504, outside trees (paper §5.1)
    parent = tree_layout(PAPER_SPEC, np.random.default_rng(0))
    assert (parent >= 0).sum() == 128 * 84 and (parent < 0).sum() == 16384 - 128 * 84


def test_concept_tasks_split_in_out_and_mixed_by_true_firing_rate(data):
    """In-SAE means the 192 most frequent features (paper §5.2), not indices < 192: the hierarchy breaks the Zipf
    order of the index, so the two sets differ."""
    rate = (data.acts > 0).mean(axis=0)
    top = set(np.argsort(-rate, kind="stable")[:192].tolist())
    assert len(top & set(range(192))) < 180  # the index order is not the rate order here
    y, names, fams = concept_tasks(data.acts, 192, task_seed=0)
    assert y.shape == (data.acts.shape[0], 18) and set(fams) == set(FAMILIES)
    for name, fam in zip(names, fams, strict=True):
        feats = [int(v) for v in name.split("_")[2:]]
        if fam == "in":
            assert all(f in top for f in feats)
        elif fam == "out":
            assert all(f not in top for f in feats)
        else:
            assert feats[0] in top and feats[1] not in top
    assert np.allclose(y.mean(axis=0), 0.0, atol=1e-5)
    assert concept_tasks(data.acts, 192, task_seed=1)[1] != names
    spec = variant_spec(SyntheticSpec(), "correlated")
    assert spec.rho == 0.85 and spec.seed != SyntheticSpec().seed
    with pytest.raises(ValueError, match="variant"):
        variant_spec(SyntheticSpec(), "nope")


def test_gt_mcc_is_one_for_the_oracle_and_low_for_a_random_dictionary(data):
    assert gt_mcc(data.dictionary, data.dictionary) == pytest.approx(1.0)
    rng = np.random.default_rng(3)
    for n in (96, 192):  # E = 1 and 2 at d = 96
        assert gt_mcc(rng.normal(size=(n, data.dictionary.shape[1])), data.dictionary) < 0.4  # chance at d = 96
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
    alive = fire.any(axis=0)
    assert gt_f1(fire[:, alive], data.dictionary[alive], data.dictionary, fire) == pytest.approx(1.0)
    assert gt_f1(fire, data.dictionary, data.dictionary, fire) == pytest.approx(alive.mean())  # never firing: 0
    shuffled = fire[:, np.random.default_rng(0).permutation(fire.shape[1])]
    assert gt_f1(shuffled, data.dictionary, data.dictionary, fire) < 0.3
    assert gt_f1(np.zeros_like(fire), data.dictionary, data.dictionary, fire) == 0.0


def test_gt_f1_scores_a_dead_latent_zero(data):
    """Over all latents, as SAELens's calculator: half the latents never firing halve a perfect score."""
    fire = data.acts[:, :100] > 0
    half = fire.copy()
    half[:, 50:] = False
    assert gt_f1(half, data.dictionary[:100], data.dictionary, data.acts > 0) == pytest.approx(0.5)


def test_truth_in_normalized_space_is_unit_and_scaled():
    d = np.array([[1.0, 1.0]]) / np.sqrt(2)
    got = truth_in_normalized_space(d, np.array([1.0, 2.0]))
    assert np.allclose(got, np.array([[2.0, 1.0]]) / np.sqrt(5))
