"""The report's gates table: pass / fail / not evaluated survive a Parquet round trip (nullable booleans)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import raybench.analysis.api  # noqa: F401 (registers the sections; the audit's report builds on it)
from raybench.analysis.provenance_audit.section import gates_view, verdict_view


def test_gates_view_after_a_parquet_round_trip(tmp_path):
    g = pd.DataFrame({"model": ["ecg_fm"] * 3, "q": [0.0] * 3, "variable": ["device"] * 3, "gate": ["a", "b", "c"],
                      "criterion": ["x"] * 3, "estimate": [0.1, np.nan, 0.2], "ci_low": [0.0, np.nan, 0.1],
                      "ci_high": [0.2, np.nan, 0.3], "passed": [True, None, False], "note": ["", "why", ""]})
    g.to_parquet(tmp_path / "g.parquet")
    view = gates_view(pd.read_parquet(tmp_path / "g.parquet"))
    assert view.result.tolist() == ["pass", "not evaluated", "fail"]
    assert view["95% CI"].tolist() == ["0.000–0.200", "–", "0.100–0.300"]


def test_verdict_view_shows_the_verdict_rank_columns():
    ver = pd.DataFrame({"model": ["ecg_fm"], "q": [0.0], "variable": ["device"], "verdict": ["no reliance"],
                        "reason": ["r"], "g": [0.001], "g_ci_low": [-0.002], "g_ci_high": [0.004], "lpi_bits": [0.5],
                        "verdict_rank": [1], "g_after_p1": [0.0], "controls_beaten_p1": [100],
                        "utility_change_p1_ci_low": [-0.001], "exposed_natural_change_p1": [-0.03]})
    view = verdict_view(ver)
    assert list(view.columns)[-1] == "reason"
    assert {"G after (p=1)", "controls beaten", "utility 95% LB", "exposed natural change"} <= set(view.columns)
