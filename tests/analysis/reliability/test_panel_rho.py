"""Ground-truth rho over trained members only, and the control flags, on hand-built panels."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raybench.analysis.reliability.panel_rho import control_flags, ground_truth_rho


def _panel() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    gt = np.linspace(0.3, 0.9, 20)
    rows = [{"variant": "base", "member": f"m{i}", "kind": "trained", "gt_mcc": g, "gt_f1": 0.5 + 0.01 * rng.normal(),
             "reconstruction": 0.5 + g / 2, "accessibility": 0.6 + 0.01 * rng.normal(), "accessibility_task_sd": 0.02,
             "accessibility_out": g + 0.01 * rng.normal(), "accessibility_out_task_sd": 0.02,
             "dead_fraction": 1 - g} for i, g in enumerate(gt)]
    rows += [{"variant": "base", "member": "permuted_decoder", "kind": "control", "gt_mcc": 0.9, "gt_f1": 0.1,
              "reconstruction": 0.2, "accessibility": 0.61, "accessibility_task_sd": 0.02, "accessibility_out": 0.9,
              "accessibility_out_task_sd": 0.02, "dead_fraction": 0.1},
             {"variant": "base", "member": "oracle", "kind": "control", "gt_mcc": 1.0, "gt_f1": 1.0,
              "reconstruction": 0.9996, "accessibility": 0.8, "accessibility_task_sd": 0.0, "accessibility_out": 0.9,
              "accessibility_out_task_sd": 0.0, "dead_fraction": 0.0},
             {"variant": "base", "member": "random_init", "kind": "control", "gt_mcc": 0.0, "gt_f1": 0.0,
              "reconstruction": 1.0, "accessibility": 0.0, "accessibility_task_sd": 0.0, "accessibility_out": 0.0,
              "accessibility_out_task_sd": 0.0, "dead_fraction": 1.0}]
    return pd.DataFrame(rows)


def test_rho_uses_trained_members_only_with_one_sided_p():
    panel = _panel()
    rho = ground_truth_rho(panel, ("reconstruction", "accessibility", "dead_fraction")).set_index("metric")
    trained = panel[panel.kind == "trained"]
    ref = stats.spearmanr(trained.accessibility, trained.gt_mcc, alternative="greater")
    assert rho.rho_gt_mcc["accessibility"] == pytest.approx(ref.statistic)
    assert rho.p_gt_mcc["accessibility"] == pytest.approx(ref.pvalue)
    assert rho.rho_gt_mcc["reconstruction"] == pytest.approx(1.0) and (rho.n_gt == 20).all()
    assert rho.rho_gt_mcc["dead_fraction"] == pytest.approx(1.0)  # negated: fewer dead latents, better


def test_flags_encoder_only_saturation_and_the_out_of_sae_control():
    panel = _panel()
    panel.loc[panel.member == "m19", "reconstruction"] = 0.9995  # best member at the ceiling, as the oracle
    rho = ground_truth_rho(panel, ("reconstruction", "accessibility", "accessibility_out"))
    flags = control_flags(panel, rho, "m19").set_index("metric")
    # accessibility: permuted 0.61 vs source ~0.6, |D|*_1 = t(0.975, 40) 0.02 sqrt(2) = 0.057: within noise
    assert flags.mrd_1_task["accessibility"] == pytest.approx(stats.t.ppf(0.975, 40) * 0.02 * np.sqrt(2))
    assert flags.encoder_only["accessibility"] and not flags.encoder_only["reconstruction"]
    assert flags.saturated["reconstruction"] and not flags.saturated["accessibility"]
    assert flags.out_tracks["accessibility_out"]  # the negative control tracks GT-MCC here: flagged


def test_validity_is_controlled_for_the_training_step():
    """A metric that follows only the step: ground truth rises with the step and varies within a step, the metric
    rises with the step alone. Its raw rho is high, its partial rho given the step near 0, and the ground-truth
    criterion is held at weak; a metric that tracks ground truth within steps keeps its pass."""
    from raybench.analysis.reliability.criteria import assess

    rng = np.random.default_rng(3)
    steps = np.repeat([15.0, 40, 100, 250], 5)
    gt = np.log(steps) + 0.3 * rng.normal(size=20)
    rows = [{"variant": "base", "member": f"m{i}", "kind": "trained", "steps": s, "gt_mcc": g, "gt_f1": g,
             "reconstruction": np.log(s) + 0.01 * rng.normal(), "accessibility": g + 0.01 * rng.normal()}
            for i, (s, g) in enumerate(zip(steps, gt, strict=True))]
    rho = ground_truth_rho(pd.DataFrame(rows), ("reconstruction", "accessibility")).set_index("metric")
    assert rho.rho_step_gt_mcc.iloc[0] > 0.8  # ground truth itself mostly follows the step
    assert rho.rho_gt_mcc["reconstruction"] > 0.7 and abs(rho.rho_gt_mcc_step["reconstruction"]) < 0.5
    assert rho.rho_gt_mcc_step["accessibility"] > 0.9
    # the partial rho is the correlation of the rank residuals after regressing out the step's ranks
    ranks = [stats.rankdata(a) for a in (pd.DataFrame(rows).reconstruction, gt, steps)]
    res = [a - np.polyval(np.polyfit(ranks[2], a, 1), ranks[2]) for a in ranks[:2]]
    assert rho.rho_gt_mcc_step["reconstruction"] == pytest.approx(np.corrcoef(*res)[0, 1])
    states = {m: assess(r.to_dict())["ground_truth"].state for m, r in rho.iterrows()}
    assert states == {"reconstruction": "weak", "accessibility": "pass"}
