"""Reseed noise per SAE: s, CV, |D|*_1 and |D|*_3 by hand; cells without a random draw are not evidence."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raybench.analysis.reliability.reseed import per_cell, reseed_summary


def _long(values: dict[tuple[str, str, int], list[float]]) -> pd.DataFrame:
    rows = [(src, metric, "m", 0.5, 4, seed, r, v) for (src, metric, seed), vs in values.items()
            for r, v in enumerate(vs)]
    return pd.DataFrame(rows, columns=["source", "metric", "model", "q", "expansion", "seed", "reseed", "value"])


def test_five_values_with_sd_s_give_mrd_1_of_3_926_s():
    v = [0.50, 0.52, 0.47, 0.51, 0.49]
    cells = per_cell(_long({("selection_subset", "accessibility", 1): v}), selection_drawn=True)
    s = np.std(v, ddof=1)
    row = cells.iloc[0]
    assert row.n == 5 and row.s == pytest.approx(s) and row.cv == pytest.approx(s / np.mean(v))
    assert row.mrd_1 == pytest.approx(3.926 * s, rel=1e-3)  # t(0.975, 4) sqrt(2)
    assert row.mrd_3 == pytest.approx(stats.t.ppf(0.975, 4) * s * np.sqrt(2 / 3))


def test_cells_without_a_draw_are_not_evidence_and_the_spread_of_s_is_kept():
    long = _long({("selection_subset", "accessibility", 1): [0.3] * 5,  # the whole split: no draw
                  ("selection_subset", "reconstruction", 1): [0.9] * 5,
                  ("permutation_floor", "reproducibility", -1): [0.1, 0.12, 0.11, 0.1, 0.13],
                  ("permutation_floor", "reproducibility", -2): [0.1, 0.2, 0.15, 0.1, 0.3]})
    cells = per_cell(long, selection_drawn=False).set_index(["metric", "seed"])
    assert not cells.drawn[("accessibility", 1)] and not cells.drawn[("reconstruction", 1)]
    assert cells.s[("accessibility", 1)] == 0.0
    summ = reseed_summary(per_cell(long, selection_drawn=False)).set_index("metric")
    assert list(summ.index) == ["reproducibility"] and summ.n_cells["reproducibility"] == 2
    assert summ.s_max["reproducibility"] > 4 * summ.s_min["reproducibility"]
    assert "accessibility" in reseed_summary(per_cell(long, selection_drawn=True)).metric.values
