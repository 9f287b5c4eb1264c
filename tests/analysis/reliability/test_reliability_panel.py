"""The ground-truth panel through raybench's trainer and evaluator on Ray: the oracle on top, the controls
reported apart and never in rho."""

from __future__ import annotations

import pytest

from raybench.analysis.reliability.panel import PanelSpec, run_panel
from raybench.analysis.reliability.panel_rho import control_flags, ground_truth_rho
from raybench.core.config import demo_protocol


@pytest.fixture(scope="module")
def panel(ray_cluster):
    p = demo_protocol()
    return run_panel(PanelSpec(steps=(15, 250), ks=(8, 16), task_seeds=(0, 1)), p.sae, p.eval)


@pytest.mark.slow
def test_exact_oracle_on_top_and_controls_apart(panel):
    by = panel.set_index("member")
    trained = panel[panel.kind == "trained"]
    assert len(trained) == 4 and set(panel.variant) == {"base"}
    assert by.gt_mcc["oracle"] == pytest.approx(1.0) and by.gt_f1["oracle"] >= trained.gt_f1.max()
    assert by.expansion["oracle"] == 2  # a member's width (N = 192 of 384 features), as the paper's oracle
    for control in ("random_init", "random_dictionary"):
        assert by.gt_mcc[control] < trained.gt_mcc.max()
    source = by.loc["s250-E2-k16"]  # the permuted decoder's trained source: same decoder set, broken pairing
    assert by.gt_mcc["permuted_decoder"] == pytest.approx(source.gt_mcc)
    assert by.gt_f1["permuted_decoder"] < source.gt_f1 and by.reconstruction["permuted_decoder"] < source.reconstruction
    rho = ground_truth_rho(panel)
    assert (rho.n_gt == 4).all()  # trained members only
    flags = control_flags(panel, rho, "s250-E2-k16").set_index("metric")
    assert not flags.encoder_only["reconstruction"]  # R2 sees the decoder
