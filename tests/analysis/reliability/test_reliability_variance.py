"""The descriptive variance decomposition (type I ANOVA) against a hand ANOVA on a balanced design (verdicts:
test_verdicts.py)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.reliability.variance import FACTORS, decompose


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
