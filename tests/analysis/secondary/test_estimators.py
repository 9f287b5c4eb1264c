"""Estimators of the secondary analyses against hand-checkable cases and independent formulas."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.stats import ortho_group
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.estimators import (
    batch_topk_codes,
    draw_corr,
    feature_concept_corr,
    linear_cka,
    random_directions,
    rank_features,
    reconstruct_limb_leads,
    temporal_harmonize,
)
from raybench.analysis.secondary.matched_effect import (
    RECORD_METRICS,
    centroid_intervention,
    common_effect,
    record_metrics,
    wrong_behavior_index,
)
from raybench.analysis.secondary.ridge import (
    gram_stats,
    ridge_fit,
    ridge_predict,
    ridge_readout,
    ridge_solve,
    topm_ridge_test_r,
)
from raybench.cohorts.panel import concept_families
from raybench.cohorts.waveforms import LEADS
from raybench.core.sufficient_stats import paired_corr, patient_stats


def _data(seed: int = 0, n: int = 120, p: int = 7, c: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, p)) * rng.uniform(0.2, 5, size=p) + rng.normal(size=p)
    y = x @ rng.normal(size=(p, c)) + rng.normal(size=(n, c))
    return x, y, rng.normal(size=(40, p)) * 2


# ---------------------------------------------------------------- ridge

def test_ridge_matches_sklearn_on_standardized_features():
    x, y, xt = _data()
    coef, icpt = ridge_fit(x, y, alpha=10.0)
    scaler = StandardScaler().fit(x)
    ref = Ridge(alpha=10.0, fit_intercept=True, solver="cholesky").fit(scaler.transform(x), y)
    np.testing.assert_allclose(ridge_predict(xt, coef, icpt), ref.predict(scaler.transform(xt)), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(coef * scaler.scale_[:, None], ref.coef_.T, rtol=1e-9, atol=1e-10)


def test_ridge_closed_form_by_hand_and_sparse_equals_dense():
    x, y, xt = _data(1)
    x[:, 2] = 3.0  # a constant column gets scale 1 and coefficient 0, as in sklearn
    coef, icpt = ridge_fit(x, y, alpha=2.5)
    xs = (x - x.mean(0)) / np.where(x.std(0) > 1e-9, x.std(0), 1.0)
    w = np.linalg.solve(xs.T @ xs + 2.5 * np.eye(x.shape[1]), xs.T @ (y - y.mean(0)))
    np.testing.assert_allclose(coef[2], 0.0, atol=1e-12)
    np.testing.assert_allclose(ridge_predict(x, coef, icpt), xs @ w + y.mean(0), rtol=1e-10, atol=1e-10)
    xsp = sp.csr_matrix(np.where(np.abs(x) > 1.0, x, 0.0))
    c_sp, i_sp = ridge_fit(xsp, y, 2.5)
    c_de, i_de = ridge_fit(xsp.toarray(), y, 2.5)
    np.testing.assert_allclose(c_sp, c_de, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(ridge_predict(sp.csr_matrix(xt), c_sp, i_sp), ridge_predict(xt, c_de, i_de), rtol=1e-9)


def test_ridge_on_column_subset_equals_refit_and_topm_ridge():
    x, y, xt = _data(2)
    stats = gram_stats(x, y)
    cols = np.array([4, 1, 6])
    coef, icpt = ridge_solve(stats, 10.0, cols, np.array([1]))
    ref_c, ref_i = ridge_fit(x[:, cols], y[:, 1], 10.0)
    np.testing.assert_allclose(coef, ref_c, rtol=1e-10)
    np.testing.assert_allclose(icpt, ref_i, rtol=1e-10)
    yt = xt @ np.ones((x.shape[1], y.shape[1]))
    ranking = rank_features(feature_concept_corr(x, y))
    r = topm_ridge_test_r(stats, ranking, 3, 10.0, xt, yt)
    for c in range(y.shape[1]):
        cc, ic = ridge_fit(x[:, ranking[:3, c]], y[:, c], 10.0)
        pred = ridge_predict(xt[:, ranking[:3, c]], cc, ic)
        assert r[c] == pytest.approx(np.corrcoef(pred[:, 0], yt[:, c])[0, 1], abs=1e-10)


def test_readout_picks_per_target_alpha_on_validation():
    x, y, xv = _data(3)
    rng = np.random.default_rng(9)
    yv = xv @ rng.normal(size=(x.shape[1], y.shape[1])) + rng.normal(size=(len(xv), y.shape[1]))
    alphas = (0.1, 10.0, 1000.0)
    ro = ridge_readout(x, y, xv, yv, alphas)
    for c in range(y.shape[1]):
        scores = []
        for a in alphas:
            coef, icpt = ridge_fit(x, y[:, c], a)
            scores.append(abs(np.corrcoef(ridge_predict(xv, coef, icpt)[:, 0], yv[:, c])[0, 1]))
        best = int(np.argmax(scores))
        assert ro.alpha[c] == alphas[best]
        coef, icpt = ridge_fit(x, y[:, c], alphas[best])
        np.testing.assert_allclose(ro.coef[:, c], coef[:, 0], rtol=1e-7, atol=1e-10)
        assert ro.intercept[c] == pytest.approx(icpt[0], rel=1e-7, abs=1e-9)


def test_ridge_rejects_bad_alpha():
    x, y, _ = _data()
    with pytest.raises(ValueError, match="alpha"):
        ridge_fit(x, y, 0.0)


# ---------------------------------------------------------------- correlations, codes

def test_feature_concept_corr_and_sparse_match_numpy():
    x, y, _ = _data(4)
    ref = np.corrcoef(x.T, y.T)[: x.shape[1], x.shape[1]:]
    np.testing.assert_allclose(feature_concept_corr(x, y), ref, atol=1e-12)
    xz = np.where(x > 0.5, x, 0.0)
    np.testing.assert_allclose(feature_concept_corr(sp.csr_matrix(xz), y), feature_concept_corr(xz, y), atol=1e-12)
    np.testing.assert_allclose(paired_corr(x[:, :3], y), [np.corrcoef(x[:, i], y[:, i])[0, 1] for i in range(3)])


def test_random_directions_unit_and_seeded():
    a, b = random_directions(50, 8, 3), random_directions(50, 8, 3)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-6)
    assert not np.allclose(a, random_directions(50, 8, 4))


def test_batch_topk_codes_keep_the_batch_top_entries():
    rng = np.random.default_rng(5)
    xn = rng.normal(size=(23, 6)).astype(np.float32)
    dirs = random_directions(40, 6, 1)
    z = batch_topk_codes(xn, dirs, k=3, batch=10).toarray()
    pre = np.maximum(xn @ dirs.T, 0)
    for start in (0, 10, 20):
        block, got = pre[start:start + 10], z[start:start + 10]
        m = block.shape[0] * 3
        thr = np.sort(block.ravel())[-m]
        expect = np.where(block >= thr, block, 0.0)
        np.testing.assert_allclose(got, expect, rtol=1e-6)


def test_bootstrap_of_patient_sums_reweights_like_duplicated_records():
    rng = np.random.default_rng(6)
    a, y = rng.normal(size=(30, 2)), rng.normal(size=(30, 2))
    codes = np.repeat(np.arange(10), 3)
    sums = patient_stats(codes, 10, a, y)
    np.testing.assert_allclose(draw_corr(np.ones((1, 10)), sums)[0], paired_corr(a, y), atol=1e-12)
    w = np.array([[2, 0, 1, 0, 0, 3, 1, 1, 1, 1]], dtype=float)
    rows = np.concatenate([np.flatnonzero(codes == p).repeat(1) for p in range(10) for _ in range(int(w[0, p]))])
    np.testing.assert_allclose(draw_corr(w, sums)[0], paired_corr(a[rows], y[rows]), atol=1e-12)


# ---------------------------------------------------------------- CKA

def test_linear_cka_identity_rotation_scaling_and_kernel_form():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(60, 5))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    q = ortho_group.rvs(5, random_state=1)
    assert linear_cka(x, 3.7 * x @ q) == pytest.approx(1.0, abs=1e-12)
    y = rng.normal(size=(60, 4))
    assert linear_cka(x, y @ ortho_group.rvs(4, random_state=2) * 0.1) == pytest.approx(linear_cka(x, y), abs=1e-12)
    h = np.eye(60) - 1 / 60
    k, lk = h @ x @ x.T @ h, h @ y @ y.T @ h
    assert linear_cka(x, y) == pytest.approx(np.sum(k * lk) / (np.linalg.norm(k) * np.linalg.norm(lk)), rel=1e-10)
    assert 0 < linear_cka(x, y) < 0.5


# ---------------------------------------------------------------- harmonization transforms

def test_lead_reconstruction_from_electrode_potentials():
    rng = np.random.default_rng(8)
    t = 500
    ra, la, ll = (np.cumsum(rng.normal(size=t)) for _ in range(3))
    true = {"I": la - ra, "II": ll - ra, "III": ll - la, "aVR": ra - (la + ll) / 2, "aVL": la - (ra + ll) / 2,
            "aVF": ll - (ra + la) / 2}
    sig = rng.normal(size=(12, t)).astype(np.float32)  # dependent limb leads start as noise
    for name in ("I", "II"):
        sig[LEADS.index(name)] = true[name]
    out = reconstruct_limb_leads(sig)
    for name, values in true.items():
        np.testing.assert_allclose(out[LEADS.index(name)], values, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(out[6:], sig[6:])  # V1-V6 untouched
    with pytest.raises(ValueError, match=r"\[12, T\]"):
        reconstruct_limb_leads(sig[:8])


def test_temporal_maps_whole_record_onto_canonical_points():
    fs, secs = 500, 10
    t = np.arange(fs * secs) / fs
    sig = np.tile(np.sin(2 * np.pi * 1.0 * t), (12, 1)).astype(np.float32)
    x, fs_decl = temporal_harmonize(sig, window_seconds=5.0, canonical_samples=2500)
    assert x.shape == (12, 2500) and fs_decl == 500.0
    assert np.argmax(np.abs(np.fft.rfft(x[0]))) == 10  # ten cycles: the whole 10 s is kept
    _, fs10 = temporal_harmonize(sig, window_seconds=10.0)
    assert fs10 == 250.0


# ---------------------------------------------------------------- interventions

def _planted(basis_row: np.ndarray):
    rng = np.random.default_rng(10)
    y_tr = rng.normal(size=200)
    train = (y_tr + 0.1 * rng.normal(size=200))[:, None]
    val, test = rng.uniform(-3, -2, size=(50, 1)), rng.uniform(-3, -2, size=(40, 1))  # all below the centroid
    coef = np.eye(3)  # readout c reads state dimension c; families differ
    return centroid_intervention(train, y_tr, val, test, basis_row[None, :], coef, np.array([0]))


def test_wbi_planted_selective_vs_nonselective_coordinate():
    fams = ["A", "B", "C"]
    sel = _planted(np.array([1.0, 0.0, 0.0]))
    mix = _planted(np.array([1.0, 1.0, 0.0]) / np.sqrt(2))
    m_sel, m_mix = record_metrics(sel, 0, fams, 1.0), record_metrics(mix, 0, fams, 1.0)
    assert np.all(m_sel[:, 1] == 0.0)
    wbi_sel = wrong_behavior_index(m_sel[:, 0].mean(), m_sel[:, 1].mean())
    wbi_mix = wrong_behavior_index(m_mix[:, 0].mean(), m_mix[:, 1].mean())
    assert wbi_sel == 0.0
    assert wbi_mix == pytest.approx(1 / np.sqrt(2), rel=1e-12)  # target delta/sqrt2, cross RMS sqrt(delta^2/2 / 2)
    # L2 is the norm of the dense change; the dose scales every metric linearly
    np.testing.assert_allclose(record_metrics(mix, 0, fams, 0.5), 0.5 * m_mix)
    assert sel.val_effect(0) > 0


def test_record_metrics_carry_the_published_off_max_abs():
    mix = _planted(np.array([1.0, 1.0, 0.0]) / np.sqrt(2))
    m = record_metrics(mix, 0, ["A", "B", "C"], 0.5)
    assert m.shape[1] == len(RECORD_METRICS) == 5 and RECORD_METRICS[3] == "off_max_abs"
    np.testing.assert_allclose(m[:, 3], np.abs(0.5 * mix.test_out[:, 1:]).max(axis=1), rtol=1e-15)
    assert (m[:, 3] >= m[:, 2]).all()  # the largest off-target change bounds their RMS


def test_centroid_uses_top_quartile_and_same_family_is_not_cross():
    y_tr = np.arange(8.0)
    train = np.arange(8.0)[:, None] * 2
    u = centroid_intervention(train, y_tr, np.zeros((1, 1)), np.zeros((1, 1)), np.array([[1.0, 1.0]]),
                              np.eye(2), np.array([0]))
    assert u.test_out[0, 0] == pytest.approx((y_tr >= 5.25).astype(float) @ train[:, 0] / 2)  # q75 = 5.25 -> {6, 7}
    with pytest.raises(ValueError, match="another family"):
        record_metrics(u, 0, ["A", "A"], 1.0)


def test_common_effect_gate():
    assert common_effect({"dense": 0.6, "sae": 0.4}) == (0.25, "eligible")
    assert common_effect({"dense": 0.6, "sae": 0.1}) == (0.1, "eligible")
    assert common_effect({"dense": 0.6, "sae": 0.01})[1] == "below_effect_floor"
    assert common_effect({"dense": -0.2, "sae": 0.4})[1] == "nonpositive_validation_effect"
    assert common_effect({"dense": 2.0, "sae": 0.2}, max_dose=0.5) == (0.1, "eligible")


def test_config_and_families():
    assert SecondaryConfig().validate().random_dictionaries == 20
    with pytest.raises(ValueError, match="unknown secondary"):
        SecondaryConfig(analyses=("nope",)).validate()
    assert concept_families(["qrs_duration", "rr_mean_ms", "st_amp_global_mv", "r_amp_global_mv"]) == [
        "INTERVAL", "RATE_RHYTHM", "ST_T", "AMPLITUDE"]
