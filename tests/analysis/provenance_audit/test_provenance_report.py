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


def test_verdict_view_shows_both_heads_kappa_pair_removed_variance_and_the_groups_left_out():
    ver = pd.DataFrame({"model": ["ecg_fm"], "q": [0.0], "variable": ["device"], "verdict": ["no reliance"],
                        "reason": ["r"], "g": [0.001], "g_ci_low": [-0.002], "g_ci_high": [0.004], "kappa": [3.5],
                        "kappa_pair": ["C vs A"], "auroc_exposed_aligned": [0.9], "auroc_exposed_reversed": [0.75],
                        "auroc_control_aligned": [0.88], "auroc_control_reversed": [0.74], "verdict_rank": [1],
                        "removed_variance_p1": [1.52], "control_removed_variance_p1": [1.51],
                        "dropped": ["BIG: 0 non-NORM records in test fold 3 (minimum 75)"]})
    view = verdict_view(ver)
    row = view.iloc[0]
    assert row["exposed AUROC aligned → reversed"] == "0.900 → 0.750"
    assert row["control AUROC aligned → reversed"] == "0.880 → 0.740"
    assert row["κ (pair)"] == "3.50 (C vs A)"
    assert row["removed variance: U / controls (median)"] == "1.520 / 1.510"
    assert row["groups left out"].startswith("BIG: 0 non-NORM")  # the column the section's note points to


def test_every_verdict_has_its_one_sentence():
    from raybench.analysis.provenance_audit.section import meanings
    from raybench.analysis.provenance_audit.verdict import CONFOUNDED, MEANINGS, TASK_SENSITIVE, VERDICTS

    extra = {f"{CONFOUNDED} site", f"no reliance; {TASK_SENSITIVE} u (both heads degrade)"}
    assert set(VERDICTS) | extra == set(MEANINGS)
    text = meanings()
    assert all(v in text for v in MEANINGS) and text.count("<li>") == len(MEANINGS)


def test_empty_tables_are_written_with_their_columns(tmp_path):
    from raybench.analysis.provenance_audit.run import COLUMNS, write_tables

    rows = {"provenance_verdicts": [{"model": "m", "q": 0.0, "layer": 0, "variable": "device",
                                     "verdict": "not audited", "reason": "too small to audit"}]}
    tables = write_tables(tmp_path, rows)  # nothing was estimated: every other table is empty
    for name in ("provenance_stress", "provenance_controls", "provenance_gates", "provenance_odds"):
        back = pd.read_parquet(tmp_path / f"{name}.parquet")
        assert back.empty and list(back.columns) == list(tables[name].columns)
        assert {"model", "variable", *COLUMNS[name]} <= set(back.columns), name
    assert len(pd.read_parquet(tmp_path / "provenance_verdicts.parquet")) == 1
