"""The variance decomposition against a hand ANOVA on a balanced design, and the verdict of a pure-noise metric."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.reliability.variance import FACTORS, decompose
from raybench.analysis.reliability.verdicts import verdict


def _frame(effect: float, noise: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for m, q, e, s in itertools.product(range(6), (0.0, 0.5, 1.0), (1, 4, 8), (1, 2, 3)):
        rows.append((f"m{m}", q, e, s, effect * m + 0.1 * effect * np.log2(e) + noise * rng.normal()))
    return pd.DataFrame(rows, columns=["model", "q", "expansion", "seed", "value"])


def test_shares_partition_and_match_a_hand_anova():
    df = _frame(effect=1.0, noise=0.3)
    rows, s_seed, dof = decompose(df, "value")
    assert list(rows.factor) == list(FACTORS)
    assert rows.share.sum() == pytest.approx(1.0)
    grand = df.value.mean()
    per = len(df) / 6
    ss_model = per * ((df.groupby("model").value.mean() - grand) ** 2).sum()  # balanced: the textbook SS
    assert rows.set_index("factor").sum_sq["model"] == pytest.approx(ss_model)
    assert dof == len(df) - 6 * 3 * 3 - 2  # cells minus configurations minus seed offsets
    assert 0.2 < s_seed < 0.4  # the noise sd
    assert rows.set_index("factor").share["model"] > 0.9


def test_a_pure_noise_metric_is_unreliable():
    rows, _, _ = decompose(_frame(effect=0.0, noise=1.0), "value")
    share = rows.set_index("factor").share
    assert share["residual"] > share["model"]
    got, rule = verdict({"share_model": share["model"], "share_residual": share["residual"],
                         "discriminability": 0.8, "rho_gt_mcc": 0.05, "rho_gt_f1": -0.1})
    assert got == "unreliable" and "residual" in rule


def test_verdict_rules():
    good = {"discriminability": 12.0, "share_model": 0.8, "share_residual": 0.05, "rho_gt_mcc": 0.8,
            "rho_gt_f1": 0.7, "tau_seeds": 0.95, "rises_fraction": 0.9, "n_outside": 0, "cv_eval": 0.01}
    assert verdict(good) == ("reliable", "every criterion met")
    assert verdict({**good, "n_outside": 2})[0] == "caution"
    assert verdict({**good, "rho_gt_mcc": -0.2, "rho_gt_f1": -0.1})[0] == "unreliable"
    assert verdict({"discriminability": float("nan")}) == ("reliable", "every criterion met")  # missing: skipped
