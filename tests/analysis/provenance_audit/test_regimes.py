"""Stress regimes by odds ratio with both marginals fixed (IPF), and the cell-stratified patient bootstrap."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from raybench.analysis.provenance_audit import regimes as rg

EXPONENTS = (1.0, 0.5, 0.0, -0.5, -1.0)


def closed_form_joint(r: float, c: float, theta: float) -> np.ndarray:
    """The 2 x 2 joint with P(y=1) = r, P(u=1) = c and odds ratio theta, by root-finding on p11 (independent of
    IPF: the odds ratio is monotone in p11 on the feasible range)."""
    f = lambda x: x * (1 - r - c + x) / ((r - x) * (c - x)) - theta  # noqa: E731
    x = brentq(f, max(0.0, r + c - 1) + 1e-15, min(r, c) - 1e-15, xtol=1e-15)
    return np.array([[1 - r - c + x, c - x], [r - x, x]])


def test_regimes_hit_the_odds_ratio_and_keep_both_marginals_at_ptb_like_margins():
    # PTB-like: 42% of records carry the target, 21% come from the device; natural odds ratio 7.09
    kappa = 7.09
    p = closed_form_joint(0.42, 0.21, kappa)
    assert rg.odds_ratio(p) == pytest.approx(kappa, rel=1e-9)
    for e in EXPONENTS:
        q = rg.regime_joint(p, p, e)
        assert rg.odds_ratio(q) == pytest.approx(kappa ** e, abs=1e-6)
        np.testing.assert_allclose(q.sum(1), p.sum(1), atol=1e-9)
        np.testing.assert_allclose(q.sum(0), p.sum(0), atol=1e-9)
        np.testing.assert_allclose(q, closed_form_joint(0.42, 0.21, kappa ** e), atol=1e-9)
    assert rg.odds_ratio(rg.regime_joint(p, p, -1.0)) == pytest.approx(1 / 7.09, abs=1e-6)
    assert rg.odds_ratio(rg.regime_joint(p, p, 0.5)) == pytest.approx(2.6627, abs=1e-4)
    # the linear interpolation of probabilities this replaces reversed to 1/15.0 at the same margins
    ind = np.outer(p.sum(1), p.sum(0))
    assert 1 / rg.odds_ratio(ind - (p - ind)) == pytest.approx(15.0, abs=0.01)


def test_regimes_move_a_natural_odds_ratio_onto_other_margins_and_generalize_to_k_groups():
    natural = closed_form_joint(0.5, 0.4, 11.0)
    held_out = closed_form_joint(0.3, 0.25, 2.0)  # other margins, other association
    q = rg.regime_joint(natural, held_out, -0.5)
    assert rg.odds_ratio(q) == pytest.approx(11.0 ** -0.5, rel=1e-9)
    np.testing.assert_allclose(q.sum(0), held_out.sum(0), atol=1e-12)
    p3 = np.array([[0.10, 0.20, 0.15], [0.25, 0.05, 0.25]])
    for e in (1.0, 0.0, -1.0):
        q3 = rg.regime_joint(p3, p3, e)
        for j in (1, 2):  # every local odds ratio against group 0 is raised to the power e
            assert rg.odds_ratio(q3, j) == pytest.approx(rg.odds_ratio(p3, j) ** e, rel=1e-9)
    np.testing.assert_allclose(rg.regime_joint(p3, p3, 1.0), p3, atol=1e-12)
    np.testing.assert_allclose(rg.regime_joint(p3, p3, 0.0), np.outer(p3.sum(1), p3.sum(0)), atol=1e-12)


def test_record_weights_turn_the_sample_into_the_regime():
    rng = np.random.default_rng(0)
    u = rng.integers(0, 2, 4000)
    y = (rng.random(4000) < np.where(u == 1, 0.8, 0.3)).astype(int)
    p = rg.joint(y, u, 2)
    w = rg.record_weights(rg.regime_ratios(p, p, EXPONENTS), y, u)
    for e, we in zip(EXPONENTS, w, strict=True):
        assert rg.odds_ratio(rg.joint(y, u, 2, we)) == pytest.approx(rg.odds_ratio(p) ** e, rel=1e-9)
        assert we.sum() == pytest.approx(len(y))


def test_an_empty_cell_is_refused_with_a_reason():
    with pytest.raises(rg.RegimeError, match="empty"):
        rg.regime_joint(np.array([[0.5, 0.0], [0.25, 0.25]]), np.full((2, 2), 0.25), -1.0)
    with pytest.raises(rg.RegimeError, match="empty"):
        rg.regime_ratios(np.full((2, 2), 0.25), np.array([[0.5, 0.0], [0.25, 0.25]]), (1.0,))


def test_a_bootstrap_draw_keeps_both_marginals():
    rng = np.random.default_rng(1)
    n = 900
    patients = rng.integers(0, 300, n)  # about three records a patient, some in several cells
    u = rng.integers(0, 3, n)
    y = (rng.random(n) < 0.2 + 0.2 * u).astype(int)
    y[:6], u[:6] = 1, 0  # a small cell: 6 records
    base = rg.cell_bootstrap(patients, y, u, 3, 50, rng)
    p = rg.joint(y, u, 3)
    for b in base:
        q = rg.joint(y, u, 3, b)
        np.testing.assert_allclose(q.sum(0), p.sum(0), atol=1e-9)
        np.testing.assert_allclose(q.sum(1), p.sum(1), atol=1e-9)
        np.testing.assert_allclose(q, p, atol=1e-9)
    # a patient's records in one cell move together; draws differ
    same = (patients == patients[10]) & (y == y[10]) & (u == u[10])
    assert np.all(base[:, same] == base[:, [10]])
    assert base.std(0).max() > 0
