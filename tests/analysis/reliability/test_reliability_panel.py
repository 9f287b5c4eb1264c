"""The ground-truth panel through raybench's trainer and evaluator: the oracle best, the controls worst, and
R^2 and accessibility tracking GT-MCC."""

from __future__ import annotations

import pytest

from raybench.analysis.reliability.panel import PanelSpec, ground_truth_rho, run_panel
from raybench.config import demo_protocol


@pytest.fixture(scope="module")
def panel(ray_cluster):
    p = demo_protocol()
    return run_panel(PanelSpec(steps=(20, 300), expansions=(1, 2), ks=(12,)), p.sae, p.eval)


@pytest.mark.slow
def test_oracle_best_and_controls_worst(panel):
    by = panel.set_index("member")
    assert by.gt_mcc["oracle"] == pytest.approx(1.0) and by.gt_mcc.idxmax() == "oracle"
    trained_e2 = panel[(panel.kind == "trained") & (panel.expansion == 2)]
    for control in ("random_init", "random_dictionary"):
        assert by.gt_mcc[control] < 0.3
        assert by.gt_mcc[control] < trained_e2.gt_mcc.min()
        assert by.gt_f1[control] < panel[panel.kind == "trained"].gt_f1.max()
    source = by.loc["s300-E2-k12"]  # the permuted decoder's trained source: same decoder set, broken pairing
    assert by.gt_mcc["permuted_decoder"] == pytest.approx(source.gt_mcc)
    assert by.gt_f1["permuted_decoder"] < source.gt_f1 and by.reconstruction["permuted_decoder"] < source.reconstruction


@pytest.mark.slow
def test_r2_and_accessibility_track_gt_mcc(panel):
    rho = ground_truth_rho(panel).set_index("metric")
    assert rho.rho_gt_mcc["reconstruction"] > 0
    assert rho.rho_gt_mcc["accessibility"] > 0
