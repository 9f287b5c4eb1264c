"""This run beside the paper: every printed number (raybench.analysis.published) next to the run's own value.

`comparison_table` maps each published row to the table and row of a run that computes the same quantity
(docs/protocol.md §10.3) and says whether the run agrees at the paper's printed precision. `SECTION` is the
report's "This run vs the paper": a summary, the rows that differ highlighted, and the paper-number tables
of paper_numbers.py. A run of another cohort (the synthetic demo) is compared with the PTB-XL numbers for
orientation only, and the section says so.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.completeness import DENOM_COLUMNS, finish
from raybench.analysis.published import agrees, bound, paper_values
from raybench.analysis.report.plotting import load_tables
from raybench.core.atomic import write_table
from raybench.core.paths import RunLayout

COMPARISON_COLUMNS = ["source", "cohort", "quantity", "metric", "model", "axis", "setting", "paper", "ours",
                      "difference", "status", "note"]
STATUSES = ("agrees", "differs", "not in this run")
Tables = dict[str, pd.DataFrame]
Found = tuple[float, str]  # (the run's value or NaN, a note)


def reference_cohort(cohort_kind: str | None) -> str:
    """The paper cohort a run is compared with: its own when the paper reports it, else PTB-XL."""
    return cohort_kind if cohort_kind in ("ptbxl", "mimic") else "ptbxl"


def _one(df: pd.DataFrame | None, col: str, **where: object) -> float:
    """The single value of `col` in the rows matching `where` (NaN when the table or row is absent)."""
    if df is None or df.empty or col not in df:
        return float("nan")
    mask = np.ones(len(df), dtype=bool)
    for key, want in where.items():
        if key not in df:
            return float("nan")
        mask &= (df[key].astype(str) == str(want)).to_numpy()
    vals = df.loc[mask, col]
    return float(vals.iloc[0]) if len(vals) == 1 else float("nan")


def _profiles(t: Tables, r: pd.Series) -> Found:
    if r.metric in ("excess", "subspace_overlap"):
        return _one(t.get("reproducibility_auc"), r.quantity, model=r.model, measure=r.metric), ""
    if r.metric == "dead_fraction":
        return _one(t.get("dead_fraction_summary"), "mean_over_configs", model=r.model), ""
    return _one(t.get("profiles"), r.quantity, model=r.model, metric=r.metric), ""


def _grouped(table: str, axis_col: str, level_col: str) -> Callable[[Tables, pd.Series], Found]:
    def find(t: Tables, r: pd.Series) -> Found:
        return _one(t.get(table), "value", **{axis_col: r.axis, level_col: r.setting, "metric": r.metric}), ""
    return find


def _results(t: Tables, r: pd.Series) -> Found:
    """Results-text numbers: headline_numbers / concept_distribution; a leader's value is read for the model the
    paper names (and the run's own leader noted when it is another)."""
    if r.quantity.startswith("concept_"):
        cd = t.get("concept_distribution")
        value = _one(cd, "value", quantity=r.quantity)
        model = str(cd.model.iloc[0]) if cd is not None and len(cd) else ""
        return value, (f"run's accessibility leader: {model}" if model and model != r.model else "")
    if r.quantity == "rank1_prob":
        value, lead = _one(t.get("profiles"), "rank1_prob", model=r.model, metric=r.metric), _lead(t, r)
        return value, lead
    if r.quantity == "auc":
        return _one(t.get("reproducibility_auc"), "auc", model=r.model, measure=r.metric), _lead(t, r)
    stem, _, end = r.quantity.rpartition("_")
    if stem in RANGES:
        return _one(t.get("calibration_ranges"), "low" if end == "min" else "high", quantity=RANGES[stem]), ""
    return _one(t.get("headline_numbers"), "value", quantity=r.quantity, metric=r.metric), ""


def _lead(t: Tables, r: pd.Series) -> str:
    hn = t.get("headline_numbers")
    if hn is None or hn.empty:
        return ""
    rows = hn[(hn.quantity == r.quantity) & (hn.metric == r.metric)]
    model = str(rows.model.iloc[0]) if len(rows) else ""
    return f"run's leader: {model}" if model and model != r.model else ""


def _harmonization(t: Tables, r: pd.Series) -> Found:
    """Table 1: native mean |r|, deltas from native per protocol, joint coverage and CKA (secondary/harmonization)."""
    if r.quantity == "delta_mean_abs_r":
        return _one(t.get("harmonization_contrasts"), "delta", model=r.model, protocol=r.setting,
                    metric="accessibility"), ""
    col = {"mean_abs_r": "accessibility", "coverage": "coverage", "cka": "cka_to_native"}[r.quantity]
    return _one(t.get("harmonization"), col, model=r.model, protocol=r.setting), ""


def _calibration(t: Tables, r: pd.Series) -> Found:
    """Table S2: the E = 8 ladder's mean |r| (and single-coordinate coverage) per method (secondary/calibration)."""
    col = "accessibility" if r.quantity == "mean_abs_r" else "coverage"
    return _one(t.get("calibration"), col, model=r.model, method=r.setting), ""


def _intervention(t: Tables, r: pd.Series) -> Found:
    """Table S5: eligible concepts, WBI per method and the SAE - dense deltas (secondary/intervention)."""
    if r.quantity == "n_concepts_eligible":
        return _one(t.get("intervention"), "concepts_eligible", model=r.model, method="sae"), ""
    if r.quantity == "wbi":
        return _one(t.get("intervention"), "wbi_cross", model=r.model, method=r.setting), ""
    return _one(t.get("intervention_contrasts"), "delta", model=r.model, comparison="sae_minus_dense",
                metric=r.metric), ""


def _has(df: pd.DataFrame | None, *cols: str) -> bool:
    return df is not None and not df.empty and set(cols) <= set(df.columns)


def _harmonization_text(t: Tables, r: pd.Series) -> Found:
    """Appendix F: the temporal contrasts, the lead bounds, the coverage q-values, the rank agreement and the range
    of ECG-JEPA's and HuBERT-ECG's |differences| (secondary/harmonization)."""
    con, harm = t.get("harmonization_contrasts"), t.get("harmonization")
    if r.quantity in ("delta_mean_abs_r", "ci_low", "ci_high", "q_value"):
        col = {"delta_mean_abs_r": "delta", "q_value": "q_value_bh"}.get(r.quantity, r.quantity)
        return _one(con, col, model=r.model, protocol=r.setting, metric="accessibility"), ""
    if r.quantity in ("spearman_rho", "kendall_tau"):
        return _one(t.get("harmonization_rank"), r.quantity, protocol=r.setting, metric=r.metric), ""
    if r.quantity == "min_cka":
        ok = _has(harm, "protocol", "cka_to_native")
        return (float(harm[harm.protocol == r.setting].cka_to_native.min()) if ok else np.nan), ""
    if not _has(con, "protocol", "metric", "delta", "q_value_bh"):
        return float("nan"), ""
    acc = con[con.metric == "accessibility"]
    if r.quantity == "max_abs_delta_mean_abs_r":
        return float(acc[acc.protocol == r.setting].delta.abs().max()), ""
    if r.quantity == "min_q_value":
        return float(con[con.metric == r.metric].q_value_bh.min()), ""
    pair = acc[acc.model.isin(str(r.setting).split("+"))].delta.abs()
    return (float(pair.min()) if r.quantity.endswith("_min") else float(pair.max())) if len(pair) else np.nan, ""


def _intervention_text(t: Tables, r: pd.Series) -> Found:
    """Appendix G: the SAE - dense tests of the two primary endpoints (matched arm, k = 5; secondary/intervention)."""
    con = t.get("intervention_contrasts")
    if not _has(con, "comparison", "metric", "arm", "k", "p_value", "q_value_bh", "delta"):
        return float("nan"), ""
    tests = con[(con.comparison == r.setting) & con.metric.isin(["off_cross_rms", "wbi_cross"])
                & (con.arm == "matched") & (con.k == 5) & con.p_value.notna()]
    if r.quantity == "max_q_value":
        return (float(tests.q_value_bh.max()) if len(tests) else np.nan), ""
    if r.quantity == "n_tests":
        return float(len(tests)), ""
    return float(((tests.q_value_bh < 0.05) & (tests.delta < 0)).sum()), ""


def _counts(t: Tables, r: pd.Series) -> Found:
    """Cohort counts: the manifest summary's (cohort_counts, which write_comparison adds)."""
    return _one(t.get("cohort_counts"), "value", quantity=r.quantity, split=r.setting), ""


def _appendix_e(t: Tables, r: pd.Series) -> Found:
    return _counts(t, r) if r.quantity.startswith("n_") else _profiles(t, r)


FINDERS: dict[str, Callable[[Tables, pd.Series], Found]] = {
    "table_1": _harmonization,
    "table_s2": _calibration,
    "table_s5": _intervention,
    "table_s1": _profiles,
    "table_2": _profiles,
    "appendix_e": _appendix_e,
    "appendix_f": _harmonization_text,
    "appendix_g": _intervention_text,
    "design": _counts,
    "paper_facts": _profiles,
    "table_s4": _grouped("scale_depth_summary", "axis", "setting"),
    "appendix_d": _grouped("marginal_means", "by", "level"),
    "results": _results,
}
RANGES = {"sae_ridge_over_dense_ridge": "sae_ridge_retention", "sae_single_minus_random_single":
          "sae_minus_random_by_depth", "sae_single_win_fraction": "sae_single_win_rate"}
"""Where a run computes each source's numbers; a number no table of the run holds reads "not in this run". RANGES:
the results text's calibration ranges -> rows of calibration_ranges (its low for _min, high for _max)."""


def comparison_table(tables: Tables, cohort_kind: str | None) -> pd.DataFrame:
    """Every published number of the reference cohort beside the run's value, difference and status."""
    cohort = reference_cohort(cohort_kind)
    pub = paper_values(cohort=cohort)
    rows = []
    for _, r in pub.iterrows():
        finder = FINDERS.get(r.source)
        ours, note = finder(tables, r) if finder is not None else (float("nan"), "")
        if np.isfinite(ours):
            status = "agrees" if agrees(ours, float(r.value), int(r.decimals), bound(r.note)) else "differs"
        else:
            status = "not in this run"
        note = "; ".join(n for n in (r.note, note) if n)
        rows.append((r.source, cohort, r.quantity, r.metric, r.model, r.axis, r.setting, float(r.value), ours,
                     ours - float(r.value), status, note))
    return pd.DataFrame(rows, columns=COMPARISON_COLUMNS)


def write_comparison(root: str | Path, cohort_kind: str | None) -> pd.DataFrame:
    """Rewrite tables/paper_comparison from every table of the run (the analyze stage calls it once the secondary
    analyses have written theirs, so Tables 1, S2 and S5 meet their numbers)."""
    layout = RunLayout.at(root)
    tables = load_tables(layout.tables_dir)
    tables["cohort_counts"] = cohort_counts(layout.manifest_summary, cohort_kind)
    df = comparison_table(tables, cohort_kind)
    before = tables.get("paper_comparison")
    if before is not None and len(before) and set(DENOM_COLUMNS) <= set(before.columns):  # analyze_run's counts
        df = finish(df.assign(n_expected=int(before.n_expected.iloc[0]), n_present=int(before.n_present.iloc[0])))
    write_table(layout.tables_dir / "paper_comparison.parquet", df)
    return df


def cohort_counts(summary_path: Path, cohort_kind: str | None) -> pd.DataFrame:
    """The counts the paper prints per cohort, from the manifest's summary.json (aggregate only): records (all and
    per split), patients, complete-case records and the test patients of the patient bootstrap (complete cases on
    MIMIC-IV-ECG, whose evaluation is complete-case; every test patient elsewhere). Empty without the summary."""
    import json

    if not summary_path.exists():
        return pd.DataFrame(columns=["quantity", "split", "value"])
    s = json.loads(summary_path.read_text())
    splits, complete = s.get("splits", {}), s.get("complete_cases", {})
    rows = [("n_records", "", s.get("records")),
            ("n_patients", "", sum(v.get("patients", 0) for v in splits.values()) if splits else None),
            ("n_complete_records", "", complete.get("records"))]
    rows += [("n_records", split, v.get("records")) for split, v in splits.items()]
    test = (complete.get("splits", {}) if cohort_kind == "mimic" else splits).get("test", {})
    rows.append(("n_test_patients", "", test.get("patients")))
    return pd.DataFrame([(q, sp, float(v)) for q, sp, v in rows if v is not None],
                        columns=["quantity", "split", "value"])
