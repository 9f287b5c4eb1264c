"""Concept-level patient-bootstrap intervals: brute force per draw, and the profiles' accessibility draws."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.analysis.atlas.concept_bootstrap import concept_auc_chunk, concept_bootstrap, concept_intervals
from raybench.analysis.inference.bootstrap import patient_bootstrap
from raybench.analysis.inference.packed_stats import pack_patient_stats
from raybench.core.sufficient_stats import patient_stats, pearson_from_sums

P, C, CELLS, M = 30, 4, 7, 2
CONCEPTS = ["qrs_duration", "hr_ventricular", "t_amp_global", "st_amp_global_mv"]


def cells_and_weights(seed: int = 0) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
    rng = np.random.default_rng(seed)
    codes = np.repeat(np.arange(P), rng.integers(1, 4, size=P))
    y = rng.normal(size=(len(codes), C))
    y[:, 3] = 1.0  # a constant concept: r = 0 under the zero-variance rule, in every draw
    raw = []
    for i in range(CELLS):
        a = (0.2 + 0.1 * i) * y + rng.normal(size=y.shape)
        err = rng.gamma(2.0, 0.1, size=len(codes))
        raw.append(patient_stats(codes, P, a, y, err, err + rng.gamma(2.0, 1.0, size=len(codes))))
    w = np.abs(rng.normal(size=(CELLS, M)))
    return raw, w / w.sum(axis=0)


def _pack(raw, cells_per_block: int = 3):
    return pack_patient_stats(((f"cell{i}", r) for i, r in enumerate(raw)), [f"c{i}" for i in range(CELLS)], C,
                              0.2, cells_per_block=cells_per_block)


def test_one_chunk_against_brute_force_per_draw():
    raw, w = cells_and_weights()
    stats = _pack(raw, cells_per_block=CELLS)
    counts = np.random.default_rng(1).multinomial(P, np.ones(P) / P, size=5).astype(np.float64)
    got = concept_auc_chunk(counts, stats.y_matrix, stats.cell_blocks[0], stats.cell_group, C, w)
    want = np.zeros((5, C, M))
    for d in range(5):
        for i, r in enumerate(raw):
            tot = np.einsum("p,pcj->cj", counts[d], r["corr"])
            n = counts[d] @ r["n"]
            absr = np.abs(pearson_from_sums(n, *(tot[:, j] for j in range(5))))
            want[d] += absr[:, None] * w[i][None, :]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert np.all(got[:, 3] == 0.0)


def test_draws_are_the_profiles_and_intervals_hold_the_point(ray_cluster):
    raw, w = cells_and_weights()
    stats = _pack(raw)  # three blocks
    draws = concept_bootstrap(stats, w, 40, 7, 16, num_workers=1, stream="published")
    # paired with the profiles: the mean over concepts of a draw is the accessibility draw under the same weights
    prof = patient_bootstrap(stats, 40, 7, 16, num_workers=2, stream="published")[:, :, 1] @ w
    np.testing.assert_allclose(draws.mean(axis=1), prof, atol=1e-12)
    np.testing.assert_array_equal(draws, concept_bootstrap(stats, w, 40, 7, 16, num_workers=3, stream="published"))
    assert not np.allclose(draws, concept_bootstrap(stats, w, 40, 8, 16, stream="published"))  # the seed matters
    out = concept_intervals(draws, stats.point_r, w, ["csfm", "st_mem"], CONCEPTS, 2.5, 97.5)
    assert list(out.columns) == ["model", "concept", "family", "auc", "ci_low", "ci_high"] and len(out) == M * C
    np.testing.assert_allclose(out.auc.to_numpy().reshape(M, C), (np.abs(stats.point_r).T @ w).T, atol=1e-15)
    live = out[out.concept != "st_amp_global_mv"]
    assert (live.ci_low <= live.auc).all() and (live.auc <= live.ci_high).all() and (live.ci_low < live.ci_high).all()
    lo, hi = np.percentile(draws[:, 0, 1], [2.5, 97.5])
    row = out[(out.model == "st_mem") & (out.concept == "qrs_duration")].iloc[0]
    assert (row.ci_low, row.ci_high) == pytest.approx((lo, hi), abs=1e-15)
