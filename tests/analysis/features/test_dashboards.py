"""Feature dashboards as data: the cell choice, the records drawn, latent-concept r, unexplained latents."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.features.dashboards import (
    Choice,
    FeaturesError,
    choose_cell,
    latent_concept_r,
    pick_records,
    unexplained_latents,
)
from raybench.core.config import FeaturesConfig, demo_protocol


def test_choice_defaults_to_the_calibration_cell_and_takes_overrides():
    protocol = demo_protocol()
    choice = Choice.resolve(FeaturesConfig(), protocol)
    assert (choice.expansion, choice.depth, choice.seed) == (protocol.eval.calibration_expansion, 1.0, None)
    assert Choice.resolve(FeaturesConfig(expansion=4), protocol, seed=7, depth=None).seed == 7
    assert Choice.resolve(FeaturesConfig(expansion=4), protocol).expansion == 4


def cells() -> pd.DataFrame:
    rows = []
    for model in ("a", "b"):
        for q in (0.0, 1.0):
            for e in (1, 8):
                for seed in (4312, 4311):
                    rows.append({"model": model, "arm": "primary", "status": "ok", "q": q, "expansion": e,
                                 "seed": seed, "cell_id": f"{model}-{q}-{e}-{seed}"})
    rows.append({"model": "a", "arm": "sensitivity", "status": "ok", "q": 1.0, "expansion": 8, "seed": 1,
                 "cell_id": "sens"})
    return pd.DataFrame(rows)


def test_choose_cell_takes_the_lowest_seed_or_the_asked_one():
    c = cells()
    assert choose_cell(c, "a", Choice(8, 1.0, None)).cell_id == "a-1.0-8-4311"
    assert choose_cell(c, "b", Choice(1, 0.0, 4312)).cell_id == "b-0.0-1-4312"
    failed = c.copy()
    failed.loc[failed.cell_id == "a-1.0-8-4311", "status"] = "failed"
    assert choose_cell(failed, "a", Choice(8, 1.0, None)).cell_id == "a-1.0-8-4312"
    with pytest.raises(FeaturesError, match="no ok primary cell at E = 16.*--expansion"):
        choose_cell(c, "a", Choice(16, 1.0, None))


def test_pick_records_top_median_zero_once_each_with_ties_to_the_lower_id():
    a = np.array([0.0, 5.0, 1.0, 2.0, 0.0, 3.0, 5.0, 0.0, 2.5])
    ids = np.array([10, 11, 12, 13, 14, 15, 16, 17, 18])
    picks = pick_records(a, ids, top=2, contrast=2)
    # top: the two 5.0s (ids 11 < 16); firing rest 1, 2, 3, 2.5 around the firing median 2.75 (of all 6 firing):
    # |3 - 2.75| = |2.5 - 2.75| = .25 -> ids 15, 18 (by id); zero: ids 10, 14
    assert picks == [("top", 1), ("top", 6), ("median", 5), ("median", 8), ("zero", 0), ("zero", 4)]
    assert pick_records(np.zeros(3), np.arange(3), 1, 1) == [("top", 0), ("zero", 1)]  # nothing fires


def dense(rows, cols, vals, n, n_lat):
    z = np.zeros((n, n_lat))
    z[rows, cols] = vals
    return z


def test_latent_concept_r_matches_corrcoef():
    rng = np.random.default_rng(0)
    n, n_lat = 40, 6
    z = np.where(rng.random((n, n_lat)) < 0.4, rng.random((n, n_lat)) * 3, 0.0)
    z[:, 5] = 0.0  # a dead latent: r = 0 by the zero-variance rule
    y = rng.normal(size=(n, 3))
    rows, cols = np.nonzero(z)
    r = latent_concept_r(rows, cols, z[rows, cols], n, n_lat, y)
    for j in range(5):
        for c in range(3):
            assert r[j, c] == pytest.approx(np.corrcoef(z[:, j], y[:, c])[0, 1], abs=1e-12)
    assert np.all(r[5] == 0.0)


def test_unexplained_latents_are_frequent_unselected_and_below_threshold():
    n = 8
    y = np.arange(n, dtype=float)[:, None]  # one concept
    z = np.zeros((n, 4))
    z[:, 0] = y[:, 0] + 1  # fires everywhere, r = 1: explained
    z[[0, 2, 4, 6, 7], 1] = [1.0, 5.0, 1.0, 5.0, 0.5]  # frequent, weakly related
    z[[1, 3], 2] = [2.0, 2.0]  # rarer
    z[[5], 3] = [1.0]  # selected for the concept
    rows, cols = np.nonzero(z)
    ids = np.arange(100, 100 + n)
    out = unexplained_latents(rows, cols, z[rows, cols], n, 4, y, ("c",), np.array([3]), ids, 0.5, limit=5)
    assert out.latent.tolist() == [1, 2]
    assert out.firing_rate.tolist() == [5 / 8, 2 / 8]
    assert out.ecg_id.tolist() == [102, 101]  # strongest record; ties to the lower id
    assert out.best_r.iloc[1] == pytest.approx(np.corrcoef(z[:, 2], y[:, 0])[0, 1])
    assert all(abs(out.best_r) < 0.5) and out.best_concept.tolist() == ["c", "c"]


def test_weak_r_note_only_below_the_coverage_threshold():
    from raybench.analysis.features.dashboards import weak_r_note

    assert weak_r_note(-0.09, 0.2).startswith("weak: |r| = 0.09 is below the coverage threshold 0.20")
    assert weak_r_note(0.2, 0.2) is None and weak_r_note(-0.5, 0.2) is None
