"""The Table-16 gates: conditional recoverability against scikit-learn, a weakened control head failing its gate,
the metadata comparator, the reduction gate."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit import stress as st
from raybench.analysis.provenance_audit.verdict import NOT_ATTRIBUTABLE, decide


def test_conditional_auroc_is_the_mean_within_stratum_auroc():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 600)
    for k in (2, 3):
        u = rng.integers(0, k, 600)
        scores = rng.standard_normal((600, k)) + 1.5 * np.eye(k)[u] + 0.5 * y[:, None]
        got = gt.conditional_auroc(scores, u, y, k, np.ones((1, 600)))[0]
        groups = [1] if k == 2 else range(k)
        want = np.mean([roc_auc_score(u[y == s] == j, scores[y == s, j]) for s in (0, 1) for j in groups])
        assert got == pytest.approx(want, abs=1e-12)


def _scenario(control_strength: float, seed: int = 1):
    rng = np.random.default_rng(seed)
    n = 6000
    u = rng.integers(0, 2, n)
    y = (rng.random(n) < np.where(u == 1, 0.75, 0.25)).astype(int)
    signal = 1.2 * y + rng.standard_normal(n)
    exposed = signal + 1.0 * u  # leans on the device
    control = control_strength * signal + rng.standard_normal(n) * (1 - control_strength)
    reg = st.Regimes.build(y, u, y, u, 2, (1.0, 0.0, -1.0))
    base = rg.cell_bootstrap(np.arange(n), y, u, 2, 100, rng)
    scores = (exposed, control)
    return st.stress_aurocs(scores, y, u, reg), st.stress_aurocs(scores, y, u, reg, base)


def test_a_weakened_control_head_fails_its_gate_and_the_row_is_not_attributable():
    pt, b = _scenario(1.0)
    good = {g.name: g for g in gt.validity_gates(pt, b, 0.9, np.full(100, 0.9), None, None, 0.01, 0.01)}
    assert good[gt.G_GATE].passed and good[gt.CONTROL_GATE].passed
    assert good[gt.METADATA_GATE].passed is None and "no metadata" in good[gt.METADATA_GATE].note
    pt, b = _scenario(0.3)  # G is as large as before, but the control head is worse than the exposed one even reversed
    weak = {g.name: g for g in gt.validity_gates(pt, b, 0.9, np.full(100, 0.9), None, None, 0.01, 0.01)}
    assert weak[gt.G_GATE].passed
    assert weak[gt.CONTROL_GATE].passed is False and weak[gt.CONTROL_GATE].estimate < 0.01
    assert weak[gt.ALIGNED_GATE].passed  # the exposed head is not the weaker one
    verdict, reason = decide(weak, None, 0.01, 0.01)
    assert verdict == NOT_ATTRIBUTABLE and gt.CONTROL_GATE in reason


def test_metadata_and_recoverability_gates():
    pt, b = _scenario(1.0)
    draws = np.linspace(0.8, 0.9, 100)
    gates = {g.name: g for g in gt.validity_gates(pt, b, 0.85, draws, 0.86, draws + 0.01, 0.01, 0.01)}
    assert gates[gt.RECOVER_GATE].passed
    meta = gates[gt.METADATA_GATE]  # paired draws: the embedding is never above the metadata
    assert meta.passed is False and meta.estimate == pytest.approx(-0.01)
    assert meta.ci_low == pytest.approx(-0.01) and meta.ci_high == pytest.approx(-0.01)
    gates = {g.name: g for g in gt.validity_gates(pt, b, 0.52, np.linspace(0.45, 0.6, 100), None, None, 0.01, 0.01)}
    assert gates[gt.RECOVER_GATE].passed is False  # the lower bound does not clear 0.5


def test_reduction_gate_reads_paired_draws():
    pt, b = _scenario(1.0)
    same = gt.reduction_gate(pt, b, pt, b)
    assert same.estimate == 0.0 and same.passed is False
    after_pt = st.StressAUROCs(*(np.zeros(1) for _ in range(6)))
    after_b = st.StressAUROCs(*(np.zeros(100) for _ in range(6)))
    gone = gt.reduction_gate(pt, b, after_pt, after_b)
    assert gone.estimate == pytest.approx(pt.g[0]) and gone.passed
