"""Verdicts from criterion states: missing evidence is never a pass, the paper's success rule for ground truth, a
decline is a failure, and pure noise is read as noise."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.reliability.criteria import NOT_ASSESSED, assess
from raybench.analysis.reliability.evidence import cell_evidence, design, snapshot_evidence, trend_evidence
from raybench.analysis.reliability.verdicts import verdict


def test_no_evidence_is_not_assessed():
    assert verdict({}) == ("not assessed", "no criterion has evidence")
    assert all(c.state == NOT_ASSESSED for c in assess({}).values())
    # winners alone never decide, and a reseed sd without a spread to compare is no evidence
    assert verdict({"winners": 1, "winners_p": 0.03, "n_seeds": 3, "reseed_mrd_1": 0.01})[0] == "not assessed"


def test_a_significant_decline_is_unreliable():
    got, rule = verdict({"rho_step": -0.7, "p_rise": 0.999, "p_decline": 0.0004, "share_cells": 0.4,
                         "share_cells_p": 1e-4})
    assert got == "unreliable" and "training" in rule


def test_ground_truth_success_is_tracking_either_metric():
    assert verdict({"rho_gt_mcc": -0.6, "rho_gt_f1": 0.05, "n_gt": 24})[0] == "unreliable"
    assert verdict({"rho_gt_mcc": 0.05, "rho_gt_f1": 0.9, "n_gt": 24})[0] == "reliable"
    assert verdict({"rho_gt_mcc": 0.9, "rho_gt_f1": -0.3, "n_gt": 24})[0] == "reliable"
    assert assess({"rho_gt_mcc": 0.5, "rho_gt_f1": 0.1, "n_gt": 24})["ground_truth"].state == "weak"  # p ~ 0.006


def test_states_follow_the_null_and_the_snr_cut_points():
    c = assess({"share_cells": 0.3, "share_cells_p": 0.01, "snr": 1.5, "snr_p": 1e-4, "rank_rho": 0.9,
                "rank_p": 1e-4, "reseed_mrd_1": 0.02, "reseed_mrd_3": 0.01, "sd_variant": 0.015})
    assert (c["share_cells"].state, c["snr"].state, c["rank_agreement"].state, c["reseed"].state) == (
        "weak", "weak", "pass", "weak")
    assert assess({"snr": 2.5, "snr_p": 0.5})["snr"].state == "fail"  # beyond 2 but within its null
    got, rule = verdict({"share_cells": 0.3, "share_cells_p": 1e-4, "rank_rho": 0.2, "rank_p": 0.3})
    assert got == "weak" and "rank_agreement fail" in rule
    assert verdict({"share_cells": 0.01, "share_cells_p": 0.6, "rank_rho": 0.9, "rank_p": 1e-4})[0] == "no signal"


def _grid(rng: np.random.Generator, model_step: float, e_effect: float, noise: float) -> pd.DataFrame:
    rows = [(f"m{m}", q, e, s, model_step * m + e_effect * i + noise * rng.normal())
            for m, q, (i, e), s in itertools.product(range(6), (0.0, 0.25, 0.5, 0.75, 1.0),
                                                     enumerate((1, 4, 8, 16, 32)), (1, 2, 3))]
    return pd.DataFrame(rows, columns=["model", "q", "expansion", "seed", "value"])


@pytest.mark.parametrize("seed", range(5))
def test_the_issues_simulated_grid_is_not_unreliable(seed):
    y, models = design(_grid(np.random.default_rng(seed), 0.01, 0.3, 0.05))
    assert y.shape == (6, 25, 3, 1) and models[0] == "m0"
    ev = cell_evidence(y)
    assert ev["share_cells_p"] < 0.02
    assert verdict(ev)[0] in ("reliable", "weak")


def test_pure_noise_reads_as_noise_in_at_least_93_percent_of_200_simulations():
    rng = np.random.default_rng(6)
    better = 0
    for _ in range(200):
        m = cell_evidence(rng.normal(size=(6, 25, 3, 1)))
        m.update(snapshot_evidence(rng.normal(size=(6, 2, 3, 7)), np.arange(7.0)))
        m.update(trend_evidence(list(rng.normal(size=(36, 9)))))
        gt = rng.normal(size=(3, 24))
        m.update(rho_gt_mcc=float(pd.Series(gt[0]).corr(pd.Series(gt[2]), method="spearman")),
                 rho_gt_f1=float(pd.Series(gt[1]).corr(pd.Series(gt[2]), method="spearman")), n_gt=24)
        better += verdict(m)[0] not in ("no signal", "unreliable")
    assert better <= 14
