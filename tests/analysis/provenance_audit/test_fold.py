"""Patient-disjoint outer folds and the fold means the verdict reads (estimates, draws, fold-averaged controls)."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.analysis.provenance_audit.audit import SPLITS, fold_splits, outer_folds
from raybench.analysis.provenance_audit.fold import FoldStats, combine, meta_features


def _patients(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {s: rng.integers(0, 200, n).astype(str) for s, n in zip(SPLITS, (500, 150, 150), strict=True)}


def test_outer_folds_are_patient_disjoint_balanced_and_fixed_by_the_seed():
    pat = _patients()
    fid = outer_folds(pat, 5, 7)
    every = np.concatenate([pat[s] for s in SPLITS])
    folds = np.concatenate([fid[s] for s in SPLITS])
    for p in np.unique(every):
        assert np.unique(folds[every == p]).size == 1  # all of a patient's records in one fold
    per_fold = [np.unique(every[folds == f]).size for f in range(5)]
    assert max(per_fold) - min(per_fold) <= 1
    again = outer_folds(pat, 5, 7)
    assert all(np.array_equal(fid[s], again[s]) for s in SPLITS)
    assert not all(np.array_equal(fid[s], outer_folds(pat, 5, 8)[s]) for s in SPLITS)


def test_fold_splits_rotate_test_and_validation_and_keep_every_record_once():
    pat = _patients(1)
    rec = {s: np.arange(len(pat[s])) + 1000 * i for i, s in enumerate(SPLITS)}
    splits = fold_splits({"rec": rec, "pat": pat, "meta": None}, pat, 4, 3)
    assert len(splits) == 4 and all(f["meta"] is None for f in splits)
    tests = [set(f["rec"]["test"]) for f in splits]
    assert set().union(*tests) == set(np.concatenate(list(rec.values())))  # each record is held out once
    assert sum(len(t) for t in tests) == sum(len(r) for r in rec.values())
    for f, fold in enumerate(splits):
        parts = [set(fold["pat"][s]) for s in SPLITS]
        assert not (parts[0] & parts[1]) and not (parts[0] & parts[2]) and not (parts[1] & parts[2])
        assert set(fold["rec"]["val"]) == tests[(f + 1) % 4]
    one = fold_splits({"rec": rec, "pat": pat}, pat, 1, 3)
    assert one == [{"rec": rec, "pat": pat}]  # one fold: the run's own split


def test_combine_takes_fold_means_of_points_draws_and_controls():
    def stats(shift: float, with_meta: bool) -> FoldStats:
        st = FoldStats()
        st.est = {"g": (0.1 + shift, np.array([0.1, 0.2]) + shift)}
        if with_meta:
            st.est["g_meta"] = (0.0, np.zeros(2))
        st.info = {"kappa": 10 + shift, "n_test": 100}
        st.curves = [{"stage": "before", "rank": 0, "level": 1.0, "odds_ratio": 10.0, "auroc_exposed": 0.9 + shift,
                      "auroc_control": 0.8}]
        st.controls = {1: [{"rank": 1, "control": 0, "g_after": shift, "g_reduction": 0.1 - shift,
                            "removed_variance": 1.0 + shift, "variance_rel_error": shift, "cos_u": 0.0,
                            "orthogonal": shift == 0}]}
        return st

    c = combine([stats(0.0, True), stats(0.2, False)])
    assert c.est["g"][0] == pytest.approx(0.2)
    np.testing.assert_allclose(c.est["g"][1], [0.2, 0.3])
    assert "g_meta" not in c.est  # only estimates every fold has
    assert c.info == {"kappa": pytest.approx(10.1), "n_test": 200}  # counts add up, the rest is averaged
    assert c.curves[0]["auroc_exposed"] == pytest.approx(1.0) and c.curves[0]["auroc_control"] == pytest.approx(0.8)
    ctl = c.controls[1][0]
    assert ctl["g_reduction"] == pytest.approx(0.0) and ctl["variance_rel_error"] == 0.2 and ctl["folds"] == 2
    assert ctl["removed_variance"] == pytest.approx(1.1) and ctl["orthogonal"] is False  # orthogonal in every fold


def test_metadata_features_are_standardized_on_train_and_missing_values_take_its_mean():
    meta = {"train": np.array([[60.0, 1.0], [40.0, np.nan], [50.0, 0.0]]), "test": np.array([[np.nan, 1.0]])}
    f = meta_features(meta)
    np.testing.assert_allclose(f["train"][:, 0], [1.224744871, -1.224744871, 0.0], atol=1e-8)
    assert f["train"][1, 1] == 0.0 and f["test"][0, 0] == 0.0 and f["test"][0, 1] == pytest.approx(1.0)
