"""The provenance audit's math against hand-checkable cases and independent formulas (scikit-learn, scipy)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.metrics import log_loss, roc_auc_score

from raybench.analysis.provenance_audit import features as ft
from raybench.analysis.provenance_audit import intervene as iv
from raybench.analysis.provenance_audit import probes as pr
from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit import stress as st

# ---------------------------------------------------------------- Recover

def test_lpi_is_the_cross_entropy_gain_over_the_prevalence_in_bits():
    rng = np.random.default_rng(0)
    u = rng.integers(0, 3, 400)
    logits = rng.standard_normal((400, 3)) + 2.0 * np.eye(3)[u]
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    prior = np.log(np.array([0.5, 0.3, 0.2]))
    terms = pr.lpi_terms(logp, prior, u)
    expected = (log_loss(u, np.tile(np.exp(prior), (400, 1)), labels=[0, 1, 2])
                - log_loss(u, np.exp(logp), labels=[0, 1, 2])) / np.log(2)
    assert terms.mean() == pytest.approx(expected, rel=1e-9)


def test_a_perfect_balanced_binary_probe_recovers_one_bit_and_the_prior_none():
    u = np.array([0, 1] * 50)
    perfect = np.log(np.clip(np.eye(2)[u], 1e-300, None))
    prior = np.log(np.array([0.5, 0.5]))
    assert pr.lpi_terms(perfect, prior, u).mean() == pytest.approx(1.0)
    assert pr.lpi_terms(np.tile(prior, (100, 1)), prior, u).mean() == pytest.approx(0.0)
    assert pr.entropy_bits(prior, u) == pytest.approx(1.0)


def test_temperature_scaling_undoes_an_overconfident_scale():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((20000, 3)) * 1.5
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    y = np.array([rng.choice(3, p=row) for row in p])
    assert pr.fit_temperature(3.0 * logits, y) == pytest.approx(3.0, rel=0.06)


def test_calibrated_probe_recovers_a_decodable_label():
    rng = np.random.default_rng(2)
    u = rng.integers(0, 2, 600)
    x = rng.standard_normal((600, 5)) + 3.0 * u[:, None] * np.array([1, 0, 0, 0, 0])
    probe = pr.calibrated_probe(x[:400], u[:400], x[400:500], u[400:500], (0.1, 1.0))
    prior = pr.prior_log_proba(u[:400], probe.classes)
    lpi = pr.lpi_terms(probe.log_proba(x[500:]), prior, pr.class_index(probe.classes, u[500:])).mean()
    assert 0.6 < lpi < 1.0  # most of the one bit; Bayes error of a 3-sd split costs a little


def test_patient_bootstrap_mean_matches_an_explicit_resample():
    codes = np.array([0, 0, 1, 2, 2, 2])
    values = np.array([1.0, 3.0, 10.0, 0.0, 0.0, 6.0])
    counts = np.array([[2.0, 0.0, 1.0], [0.0, 3.0, 0.0]])
    got = pr.bootstrap_mean(values, codes, counts)
    first = np.concatenate([values[:2], values[:2], values[3:]]).mean()
    assert got == pytest.approx([first, 10.0])
    draws = pr.patient_draws(5, 7, np.random.default_rng(0))
    assert draws.shape == (7, 5) and np.all(draws.sum(1) == 5)


# ---------------------------------------------------------------- Stress

@pytest.mark.parametrize("decimals", [1, None], ids=["many-ties", "no-ties"])  # the tie-group path and the direct one
def test_weighted_auroc_equals_scikit_learn_with_weights_and_ties(decimals):
    rng = np.random.default_rng(3)
    scores = rng.standard_normal(300)
    scores = scores if decimals is None else np.round(scores, decimals)
    assert (len(np.unique(scores)) < 300) == (decimals is not None)
    y = rng.integers(0, 2, 300)
    w = rng.random((4, 300)) * (rng.random((4, 300)) > 0.2)
    got = st.weighted_auroc(scores, y, w)
    for b in range(4):
        assert got[b] == pytest.approx(roc_auc_score(y, scores, sample_weight=w[b]), abs=1e-12)


def test_g_is_zero_for_identical_heads_and_positive_for_a_shortcut_head():
    rng = np.random.default_rng(5)
    u = rng.integers(0, 2, 4000)
    y = (rng.random(4000) < np.where(u == 1, 0.8, 0.2)).astype(int)
    reg = st.Regimes.build(y, u, y, u, 2, (1.0, 0.0, -1.0))
    assert reg.kappa == pytest.approx(16.0, rel=0.15)
    clean = y + rng.standard_normal(4000)
    assert st.stress_aurocs((clean, clean), y, u, reg).g[0] == pytest.approx(0.0, abs=1e-12)
    shortcut = st.stress_aurocs((clean + 2.0 * u, clean), y, u, reg)
    assert shortcut.g[0] > 0.1
    # G by its definition from scikit-learn AUROCs under the aligned and reversed weights
    w_al, w_rev = reg.weights(y, u, 1.0), reg.weights(y, u, -1.0)
    drop = [roc_auc_score(y, s, sample_weight=w_al) - roc_auc_score(y, s, sample_weight=w_rev)
            for s in (clean + 2.0 * u, clean)]
    assert shortcut.g[0] == pytest.approx(drop[0] - drop[1], abs=1e-12)


def test_control_head_weights_make_y_independent_of_u():
    rng = np.random.default_rng(4)
    u = rng.integers(0, 3, 3000)
    y = (rng.random(3000) < np.array([0.2, 0.5, 0.7])[u]).astype(int)
    w = st.independence_weights(y, u, 3)
    q = np.zeros((2, 3))
    np.add.at(q, (y, u), w / w.sum())
    np.testing.assert_allclose(q, np.outer(q.sum(1), q.sum(0)), atol=1e-12)
    assert w.mean() == pytest.approx(1.0)


# ---------------------------------------------------------------- Intervene

def test_whitening_and_removal():
    rng = np.random.default_rng(6)
    y = rng.integers(0, 2, 2000)
    x = rng.standard_normal((2000, 4)) @ rng.standard_normal((4, 4)) + 2.0 * y[:, None]
    wh = iv.Whitener.fit(x, y)
    z = wh(x)
    resid = np.vstack([z[y == g] - z[y == g].mean(0) for g in (0, 1)])
    np.testing.assert_allclose(resid.T @ resid / len(z), np.eye(4), atol=1e-8)
    np.testing.assert_allclose(wh.w @ wh.w_inv, np.eye(4), atol=1e-8)
    basis = np.linalg.qr(rng.standard_normal((4, 2)))[0]
    x2 = iv.remove(x, wh, basis)
    np.testing.assert_allclose(wh(x2) @ basis, 0.0, atol=1e-8)  # nothing left along U in whitened space
    other = np.linalg.qr(np.hstack([basis, rng.standard_normal((4, 2))]))[0][:, 2:]
    np.testing.assert_allclose(wh(x2) @ other, z @ other, atol=1e-8)  # the rest untouched


def test_provenance_subspace_finds_the_within_class_device_direction():
    rng = np.random.default_rng(7)
    y = rng.integers(0, 2, 3000)
    u = (rng.random(3000) < np.where(y == 1, 0.8, 0.2)).astype(int)
    x = rng.standard_normal((3000, 6))
    x[:, 0] += 2.0 * y
    x[:, 3] += 2.0 * u
    wh = iv.Whitener.fit(x, y)
    basis = iv.provenance_subspace(wh(x), y, u, 1, 1.0)
    read = wh.w @ basis[:, 0]  # the raw-space direction the whitened component reads
    assert abs(read[3]) / np.linalg.norm(read) > 0.98


def _raw_removed_variance(x: np.ndarray, y: np.ndarray, wh: iv.Whitener, q: np.ndarray) -> float:
    """Measured, not derived: the mean squared norm of what the removal takes from each train record, each
    y-class mean of the removed part out."""
    r = x - iv.remove(x, wh, q)
    for g in np.unique(y):
        r[y == g] -= r[y == g].mean(0)
    return float(np.mean(np.sum(r ** 2, axis=1)))


def test_random_controls_remove_the_raw_variance_the_targeted_removal_removes():
    """An anisotropic embedding whose device direction carries more within-class variance than a random one: in
    whitened coordinates every direction removes the same energy, in raw coordinates U removes more. Each control
    must remove U's raw variance within 5% (measured on the removal itself)."""
    rng = np.random.default_rng(8)
    n, d = 1500, 10
    y, u = rng.integers(0, 2, n), rng.integers(0, 2, n)
    x = rng.standard_normal((n, d)) * np.linspace(0.5, 2.0, d)
    x[:, 0] += 1.5 * y
    x[:, 4] += 2.0 * u  # the device: within-class variance 1.2^2 + 1 along axis 4
    x = x @ np.linalg.qr(rng.standard_normal((d, d)))[0]
    wh = iv.Whitener.fit(x, y)
    z = wh(x)
    for p in (1, 2):
        u_basis = iv.provenance_subspace(z, y, u, 1, 1.0)
        if p == 2:  # a second, random direction beside it
            u_basis = np.linalg.qr(np.hstack([u_basis, rng.standard_normal((d, 1))]))[0]
        target = _raw_removed_variance(x, y, wh, u_basis)
        form = iv.RemovedVariance.fit(z, y, wh.w_inv)
        assert form(u_basis) == pytest.approx(target, rel=1e-9)  # the closed form is the measured variance
        ctl = iv.matched_random_subspaces(form, u_basis, 10, rng)
        for q in ctl.bases:
            np.testing.assert_allclose(q.T @ q, np.eye(p), atol=1e-10)
            assert _raw_removed_variance(x, y, wh, q) == pytest.approx(target, rel=0.05)
        assert np.all(ctl.errors < 2e-3) and ctl.orthogonal.all() and np.all(ctl.cosines < 1e-8)
        np.testing.assert_allclose(ctl.variance, target, rtol=2e-3)
    assert iv.max_cosine(u_basis, u_basis) == pytest.approx(1.0)


def test_controls_leave_the_complement_only_when_it_cannot_remove_as_much():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((800, 4))
    x[:, 0] *= 5.0  # the only direction with that much variance
    wh = iv.Whitener.fit(x)
    form = iv.RemovedVariance.fit(wh(x), None, wh.w_inv)
    u_basis = np.linalg.qr(wh.w @ np.eye(4)[:, [0]])[0]  # U reads raw axis 0
    ctl = iv.matched_random_subspaces(form, u_basis, 5, rng)
    assert not ctl.orthogonal.any() and np.all(ctl.errors < 0.05)  # drawn in the whole space, still matched
    assert np.all(ctl.cosines > 0.5)  # and then they lean on U (reported, not offered as evidence)


# ---------------------------------------------------------------- features

def test_univariate_lpi_of_latents():
    rng = np.random.default_rng(9)
    u_tr, u_te = rng.integers(0, 2, 2000), rng.integers(0, 2, 1000)
    dense = lambda u: np.stack([u * rng.uniform(1, 2, len(u)), np.zeros(len(u)),  # noqa: E731
                                rng.random(len(u)) * (rng.random(len(u)) > 0.5)], axis=1)
    lpi = ft.univariate_lpi(sp.csr_matrix(dense(u_tr)), u_tr, sp.csr_matrix(dense(u_te)), u_te, 2)
    assert lpi[0] > 0.95  # fires exactly on one device: about all of its 1 bit
    assert lpi[1] == 0.0  # never active
    assert abs(lpi[2]) < 0.02  # unrelated to the device


def test_concept_bits_and_flags():
    assert ft.concept_bits(np.array([0.6]))[0] == pytest.approx(-0.5 * np.log2(1 - 0.36))
    rows = ft.feature_rows(np.array([0.5, 0.01, 0.2]), 2, np.array([0, 1]), np.array([0.3, 0.9]), ("qrs", "hr"))
    top = [r for r in rows if r["kind"] == "top"]
    assert [r["latent"] for r in top] == [0, 2]
    flags = {r["concept"]: r["flagged"] for r in rows if r["kind"] == "concept"}
    assert flags == {"qrs": True, "hr": False}  # 0.5 bits of device > 0.07 bits of concept
    rows = ft.feature_rows(np.array([0.03, 0.0]), 1, np.array([0]), np.array([0.05]), ("qrs",), min_bits=0.05)
    assert not rows[-1]["flagged"]  # 0.03 bits beat 0.002 bits of concept, but are below the floor


def test_removed_variance_takes_the_diagnosis_class_means_out():
    rng = np.random.default_rng(10)
    y = rng.integers(0, 2, 4000)
    z = rng.standard_normal((4000, 3))
    z[:, 0] += 3.0 * y
    axis = np.eye(3)[:, [0]]
    within = np.mean([z[y == g, 0].var() * (y == g).mean() for g in (0, 1)]) * 2
    assert iv.RemovedVariance.fit(z, y, np.eye(3))(axis) == pytest.approx(within, rel=1e-9)
    assert iv.RemovedVariance.fit(z, None, np.eye(3))(axis) == pytest.approx(np.mean(z[:, 0] ** 2), rel=1e-9)
    assert iv.RemovedVariance.fit(z, y, 2 * np.eye(3))(axis) == pytest.approx(4 * within, rel=1e-9)  # raw scale


def test_stratified_regimes_change_the_device_association_within_each_site_only():
    """Groups 0, 1 in site 0 and 2, 3 in site 1; the diagnosis is tied to the site. Each regime keeps every site's
    share, its held-out marginals and so the y-site association, and raises each site's own odds ratio to e."""
    rng = np.random.default_rng(12)
    gs = np.array([0, 0, 1, 1])
    u_tr, u_te = rng.integers(0, 4, 6000), rng.integers(0, 4, 2000)
    p_y = lambda u: np.array([0.15, 0.35, 0.7, 0.8])[u]  # noqa: E731
    y_tr, y_te = (rng.random(6000) < p_y(u_tr)).astype(int), (rng.random(2000) < p_y(u_te)).astype(int)
    reg = st.Regimes.build(y_tr, u_tr, y_te, u_te, 4, (1.0, 0.0, -1.0), gs)
    nat = rg.joint(y_tr, u_tr, 4)
    assert set(reg.odds) == {(1, 0), (3, 2)}  # one pair per site, each against its site's first group
    assert reg.odds[(1, 0)] == pytest.approx(rg.odds_ratio(nat, 1, 0))
    assert reg.kappa == reg.odds[(1, 0)]  # the one furthest from 1 (0.35 vs 0.15 beats 0.8 vs 0.7)
    obs = rg.joint(y_te, u_te, 4)
    for e in (1.0, 0.0, -1.0):
        q = rg.joint(y_te, u_te, 4, reg.weights(y_te, u_te, e))
        for cols in ([0, 1], [2, 3]):
            np.testing.assert_allclose(q[:, cols].sum(0), obs[:, cols].sum(0), atol=1e-12)  # group shares
            np.testing.assert_allclose(q[:, cols].sum(1), obs[:, cols].sum(1), atol=1e-12)  # y within the site
            a, b = cols
            assert rg.odds_ratio(q, b, a) == pytest.approx(rg.odds_ratio(nat, b, a) ** e, rel=1e-9)
    w = st.independence_weights(y_tr, u_tr, 4, gs)
    q = rg.joint(y_tr, u_tr, 4, w)
    for cols in ([0, 1], [2, 3]):  # independent within each site, the site's own prevalence kept
        assert rg.odds_ratio(q, cols[1], cols[0]) == pytest.approx(1.0, rel=1e-9)
        np.testing.assert_allclose(q[:, cols].sum(1), nat[:, cols].sum(1), atol=1e-12)
