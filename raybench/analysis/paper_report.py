"""Report sections of the paper analyses (paper_analyses.py) and of the grid's denominators (completeness.py).

PAPER_SECTIONS pairs each section with the section it goes in front of; report.py registers them.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from raybench.analysis.plotting import metric_label, model_label
from raybench.analysis.report_html import table_block
from raybench.analysis.report_sections import Context, Section

SIG = 0.05


def _esc(text: object) -> str:
    return html.escape(str(text))


def _flag_short(df: pd.DataFrame) -> pd.DataFrame:
    """Readable copy: model labels, and 'short' instead of the boolean flag."""
    out = df.copy()
    for col in ("model", "model_a", "model_b"):
        if col in out:
            out[col] = out[col].map(model_label)
    if "short_denominator" in out:
        out["short_denominator"] = np.where(out.short_denominator.astype(bool), "short", "")
    return out


# ---------------------------------------------------------------- bodies


def denominators_body(ctx: Context) -> str:
    flagged = {n: df for n, df in sorted(ctx.tables.items()) if "short_denominator" in df}
    if not flagged:
        return ("<p class='note'>No table of this run records its denominators (tables written before "
                "n_expected / n_present / short_denominator existed).</p>")
    short = {n: int(df.short_denominator.astype(bool).sum()) for n, df in flagged.items()}
    short = {n: k for n, k in short.items() if k}
    if not short:
        return (f"<p class='badge ok'>Every denominator is full: each of the {len(flagged)} analysis tables rests "
                "on every cell the protocol expects.</p>")
    rows = pd.DataFrame({"table": list(short), "short rows": list(short.values()),
                         "rows": [len(flagged[n]) for n in short]})
    return ("<p class='badge warn'>Incomplete grid analyzed with --allow-incomplete: some estimates rest on fewer "
            "cells than the protocol's fixed denominator (n_present below n_expected). A common-scale AUC also "
            "leaves out any depth with a missing E.</p>" + table_block("short", rows, "Tables with short rows"))


def gate_summary(tables: dict[str, pd.DataFrame]) -> str:
    """One sentence: configurations passing the gate on seed means (published), and the per-cell count."""
    gm = tables.get("fidelity_gate_models")
    if gm is None or gm.empty:
        return ""
    p = gm[gm.arm == "primary"] if (gm.arm == "primary").any() else gm
    n_cfg, n_pass = int(p.n_configs.sum()), int(p.n_configs_pass.sum())
    cells, cells_pass = int(p.n_expected.sum()), int(p.n_cells_pass.sum())
    return (f"<p>Fidelity gate, published aggregation (seed means per model × depth × E, primary arm): {n_pass} of "
            f"{n_cfg} configurations pass; per cell: {cells_pass} of {cells} expected cells.</p>")


def gate_body(ctx: Context) -> str:
    gm = ctx.tables["fidelity_gate_models"]
    view = pd.DataFrame({"arm": gm.arm, "model": gm.model.map(model_label),
                         "configurations passing": [f"{a}/{b}" for a, b in zip(gm.n_configs_pass, gm.n_configs,
                                                                               strict=True)],
                         "pass fraction (seed means)": gm.pass_fraction,
                         "cells passing (per cell)": [f"{a}/{b}" for a, b in zip(gm.n_cells_pass, gm.n_expected,
                                                                                 strict=True)],
                         "cell pass fraction": gm.cell_pass_fraction,
                         "short denominator": np.where(gm.short_denominator.astype(bool), "short", "")})
    out = [gate_summary(ctx.tables), table_block("fidelity_gate_models", view, "Gate by model")]
    if "fidelity_gate" in ctx.tables:
        gate = ctx.tables["fidelity_gate"]
        out.append(table_block("fidelity_gate", _flag_short(gate),
                                f"Gate per model × depth × E on seed means ({len(gate)} rows)"))
    return "\n".join(out)


def crossed_contrasts_body(ctx: Context) -> str:
    con = _flag_short(ctx.tables["crossed_contrasts"])
    con["significant (BH < .05)"] = np.where(ctx.tables["crossed_contrasts"].p_bh < SIG, "yes", "")
    counts = []
    for metric, g in ctx.tables["crossed_contrasts"].groupby("metric", sort=False):
        counts.append(f"{_esc(metric_label(metric))}: {int((g.p_bh < SIG).sum())} of {len(g)}")
    return (f"<p>Contrasts surviving BH at .05 — {'; '.join(counts)}.</p>"
            + table_block("crossed_contrasts", con, f"Crossed-bootstrap contrasts ({len(con)} pairs)"))


def arm_body(ctx: Context) -> str:
    ranks = ctx.tables["arm_rank_agreement"]
    summ = ranks.groupby("metric", sort=False).kendall_tau.agg(["median", "min"]).reset_index()
    summ["metric"] = summ.metric.map(metric_label)
    summ.columns = ["metric", "median Kendall τ", "minimum Kendall τ"]
    out = [table_block("arm_tau_summary", summ, "Model-order agreement between the arms (over E)")]
    for name, title in (("arm_rank_agreement", "Kendall τ per E"),
                        ("arm_auc_differences", "Common-scale AUC, fixed k/N − fixed k/d (paired-seed bootstrap)"),
                        ("arm_differences", "Per-cell arm differences (paired-seed bootstrap)")):
        if name in ctx.tables:
            df = _flag_short(ctx.tables[name])
            out.append(table_block(name, df, f"{title} ({len(df)} rows)"))
    return "\n".join(out)


def harmonization_concepts_body(ctx: Context) -> str:
    con = ctx.tables["harmonization_concept_contrasts"]
    summ = con.groupby(["model", "protocol"], sort=True).agg(
        concepts=("concept", "size"), significant=("q_value_bh", lambda q: int((q < SIG).sum())),
        largest_abs_delta=("delta", lambda d: float(np.abs(d).max()))).reset_index()
    summ["model"] = summ.model.map(model_label)
    summ.columns = ["model", "protocol", "concepts", "BH-significant (q < .05)", "largest |Δ|r||"]
    return table_block("harmonization_concept_summary", summ, "Concept-level tests per model and protocol")


# ---------------------------------------------------------------- the sections

PAPER_SECTIONS: tuple[tuple[Section, str], ...] = (
    (Section("denominators", "Grid completeness and denominators",
             "Every analysis table carries n_expected (grid cells of the row's scope in the protocol: the fixed "
             "denominator), n_present (those that are ok) and short_denominator. An incomplete grid is analyzed "
             "only with --allow-incomplete.", body=denominators_body), "profiles"),
    (Section("crossed_contrasts", "Crossed-bootstrap contrasts",
             "Pairwise model differences of the common-scale AUC under the crossed bootstrap over depth units × "
             "SAE seeds (model_a − model_b, pairs in the published model order); p-values Benjamini–Hochberg "
             "adjusted within each metric, as the published inference does.", body=crossed_contrasts_body,
             claims=("crossed_contrasts",),
             needs=("crossed_contrasts",)), "curves"),
    (Section("arm_sensitivity", "Sparsity-arm sensitivity",
             "Fixed k/d (primary) against fixed k/N (sensitivity) at the sensitivity depth, as the published "
             "sensitivity analysis: Kendall τ between the two arms' model orders at every E, and paired-seed "
             "bootstrap differences per cell and per common-scale AUC, BH within each metric.",
             figures=("arm_agreement",), body=arm_body,
             claims=("arm_rank_agreement", "arm_auc_differences", "arm_differences"),
             needs=("arm_rank_agreement",)), "reproducibility"),
    (Section("reproducibility_auc", "Reproducibility: common-scale AUC",
             "AUC over log E of matched decoder cosine above the permutation floor and of subspace overlap, "
             "averaged over depths and seed pairs, with a crossed bootstrap over depth units × seed pairs. A "
             "patient bootstrap does not apply: decoders and their validation-ranked columns do not depend on the "
             "test patients.", figures=("reproducibility_auc",),
             tables=("reproducibility_auc", "reproducibility_pairs")), "atlas"),
    (Section("fidelity_gate", "Fidelity gate",
             "The validation gate (R² ≥ .90 and dead fraction below .20) applied as the published code does: to the "
             "seed mean of each model × depth × E. Pass fractions use the fixed denominator (a configuration "
             "with no ok seed fails); the per-cell count is kept beside it.", body=gate_body,
             claims=("fidelity_gate", "fidelity_gate_models"), needs=("fidelity_gate_models",)), "atlas"),
    (Section("dead_fraction", "Dead-fraction profile",
             "Dead-latent fraction across E (mean over depths and seeds; the split is in the tables), its "
             "common-scale AUC with a crossed-bootstrap CI, and Kendall τ between the model orders at every pair "
             "of E (lower dead fraction ranks first).", figures=("dead_fraction_profile",),
             tables=("dead_fraction_auc", "dead_fraction_rank_stability", "dead_fraction")), "calibration"),
    (Section("harmonization_concepts", "Input harmonization: concept-level tests",
             "Per concept, |r| under each harmonized protocol minus native (patient bootstrap), Benjamini–Hochberg "
             "adjusted across every concept-level comparison, separately from the model-level family.",
             body=harmonization_concepts_body, tables=("harmonization_concept_contrasts",), optional=True,
             claims=("harmonization_concept_contrasts",), needs=("harmonization_concept_contrasts",)),
     "intervention"),
)
