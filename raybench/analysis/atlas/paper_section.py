"""Report sections of the paper analyses (paper_analyses.py); atlas/__init__.py orders them among the base
sections."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.report.html import table_block
from raybench.analysis.report.plotting import metric_label, model_label

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


def dead_fraction_body(ctx: Context) -> str:
    """The paper's per-model summary (plain mean over configurations) before raybench's log-E AUC."""
    df = ctx.tables.get("dead_fraction_summary")
    if df is None or df.empty:
        return ""
    view = pd.DataFrame({"model": df.model.map(model_label), "split": df.split,
                         "mean over depth × E (paper)": df.mean_over_configs, "configurations": df.n_configs,
                         "AUC over log E (raybench)": df.auc,
                         "AUC 95% CI": [f"{a:.3f}–{b:.3f}" if np.isfinite(a) else "–"
                                        for a, b in zip(df.ci_low, df.ci_high, strict=True)]})
    if df.paper.notna().any():
        view["published (paper)"] = df.paper.to_numpy()
    return table_block("dead_fraction_summary", view, "Dead fraction per model: the paper's summary, then the AUC")


# ---------------------------------------------------------------- the sections

PAPER_SECTIONS = {s.id: s for s in (
    Section("crossed_contrasts", "Crossed-bootstrap contrasts",
           "Pairwise model differences of the common-scale AUC under the crossed bootstrap over depth units × "
           "SAE seeds (model_a − model_b, pairs in the published model order); p-values Benjamini–Hochberg "
           "adjusted within each metric, as the published inference does.", body=crossed_contrasts_body,
           claims=("crossed_contrasts",), needs=("crossed_contrasts",)),
    Section("arm_sensitivity", "Sparsity-arm sensitivity",
           "Fixed k/d (primary) against fixed k/N (sensitivity) at the sensitivity depth, as the published "
           "sensitivity analysis: Kendall τ between the two arms' model orders at every E, and paired-seed "
           "bootstrap differences per cell and per common-scale AUC, BH within each metric.",
           figures=("arm_agreement",), body=arm_body,
           claims=("arm_rank_agreement", "arm_auc_differences", "arm_differences"),
           needs=("arm_rank_agreement",)),
    Section("reproducibility_auc", "Reproducibility: common-scale AUC",
           "AUC over log E of matched decoder cosine above the permutation floor and of subspace overlap, "
           "averaged over depths and seed pairs, with a crossed bootstrap over depth units × seed pairs. A "
           "patient bootstrap does not apply: decoders and their validation-ranked columns do not depend on the "
           "test patients.", figures=("reproducibility_auc",),
           tables=("reproducibility_auc", "reproducibility_pairs")),
    Section("fidelity_gate", "Fidelity gate",
           "The validation gate (R² ≥ .90 and dead fraction below .20) applied as the published code does: to the "
           "seed mean of each model × depth × E. Pass fractions use the fixed denominator (a configuration "
           "with no ok seed fails); the per-cell count is kept beside it.", body=gate_body,
           claims=("fidelity_gate", "fidelity_gate_models"), needs=("fidelity_gate_models",)),
    Section("dead_fraction", "Dead-fraction profile",
            "Dead-latent fraction per model as the paper summarizes it (plain mean over the depth × E "
            "configurations of the seed means, first), then raybench's common-scale AUC over log E with a "
            "crossed-bootstrap CI; the curve across E (mean over depths and seeds; the split is in the tables), "
            "and Kendall τ between the model orders at every pair of E (lower dead fraction ranks first).",
            figures=("dead_fraction_profile",), body=dead_fraction_body, claims=("dead_fraction_summary",),
            tables=("dead_fraction_auc", "dead_fraction_rank_stability", "dead_fraction")),
)}
