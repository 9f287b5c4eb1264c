"""Report sections of the atlas' base tables: model profiles, pairwise contrasts, matched-scale curves, depth x
scale, concept families, rank stability, reproducibility and the validation atlas (docs/protocol.md §8)."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.report.html import df_html, table_block
from raybench.analysis.report.plotting import METRICS, metric_label, model_label
from raybench.core.run_state import run_section


def _profiles_body(ctx: Context) -> str:
    prof = ctx.tables["profiles"]
    crossed = ctx.tables.get("crossed")
    show_published = ctx.cohort_kind == "ptbxl" or ("published" in prof and prof.published.notna().any())
    out = []
    inference = (run_section(ctx.run, "protocol") or {}).get("inference") or {}
    if inference:
        out.append(f"<p class='note'>Bootstrap draws: {int(inference.get('patient_draws', 0)):,} paired patient "
                   f"draws, {int(inference.get('crossed_draws', 0)):,} crossed draws.</p>")
    for metric in sorted(prof.metric.unique(), key=lambda m: (METRICS.index(m) if m in METRICS else 9, m)):
        sub = prof[prof.metric == metric].sort_values(["auc", "model"], ascending=[False, True])
        df = pd.DataFrame({"model": sub.model.map(model_label), "AUC": sub.auc,
                           "95% CI": [f"{a:.3f}–{b:.3f}" for a, b in zip(sub.ci_low, sub.ci_high, strict=True)]})
        for col, name in (("rank1_prob", "P(rank 1)"), ("mean_rank", "mean rank")):
            if col in sub:
                df[name] = sub[col].to_numpy()
        if crossed is not None and (crossed.metric == metric).any():
            c = crossed[crossed.metric == metric].set_index("model").reindex(sub.model)
            df["crossed AUC"] = c.auc.to_numpy()
            df["crossed 95% CI"] = [f"{a:.3f}–{b:.3f}" if pd.notna(a) else "–"
                                    for a, b in zip(c.ci_low, c.ci_high, strict=True)]
        if show_published and "published" in sub:
            df["published (paper)"] = sub.published.to_numpy()
        out.append(f"<h3>{html.escape(metric_label(metric))}</h3>{df_html(df)}")
    if show_published:
        out.append("<p class='note'>Published: ECG-InterpBench PTB-XL reference AUCs.</p>")
    return "\n".join(out)


def _contrasts_body(ctx: Context) -> str:
    con = ctx.tables["contrasts"].copy()
    if "p_bh" in con:
        con["significant (BH < .05)"] = np.where(con.p_bh < 0.05, "yes", "")
    return table_block("contrasts", con, f"Paired contrasts ({len(con)} pairs)")


def _concepts_body(ctx: Context) -> str:
    con = ctx.tables["concepts"]
    table = con.pivot_table(index="family", columns="model", values="auc", aggfunc="mean")
    table = table.rename(columns=model_label).reset_index()
    table.columns.name = None
    return (table_block("concept_families", table, "Mean concept AUC by family")
            + table_block("concepts", con, f"Per-concept AUC ({len(con)} rows)"))


def _cells_body(ctx: Context) -> str:
    cells = ctx.tables["cells"]
    cols = [c for c in ("cell_id", "model", "layer", "q", "arm", "expansion", "k", "seed", "status", "val_r2",
                        "val_dead_fraction", "gate_pass", "test_accessibility", "test_coverage", "train_seconds")
            if c in cells]
    counts = cells.groupby(["arm", "status"], sort=True).size().rename("cells").reset_index()
    return (table_block("cell_status", counts, "Cells by arm and status")
            + table_block("cells", cells[cols], f"All cells ({len(cells)} rows)"))


BASE_SECTIONS = {s.id: s for s in (
    Section("profiles", "Model profiles",
            "Common-scale summaries: AUC over log E, averaged over depths and seeds, with patient-bootstrap and "
            "crossed (depth × seed) bootstrap 95% CIs.",
            figures=("forest_auc",), body=_profiles_body, claims=("profiles", "crossed"), needs=("profiles",)),
    Section("contrasts", "Pairwise contrasts",
            "Paired bootstrap differences (model_a − model_b); p-values Benjamini–Hochberg adjusted within each "
            "metric family.", body=_contrasts_body, claims=("contrasts",), needs=("contrasts",)),
    Section("ranks", "Rank probabilities",
            "Per metric, over the patient-bootstrap draws of the common-scale AUC and of each E: mean and median "
            "rank, probability of rank 1 and of the top 2 (the published summary's rank table).",
            tables=("rank_probabilities",)),
    Section("curves", "Matched-scale curves", figures=("matched_scale_curves",), tables=("curves",)),
    Section("depth", "Depth × scale",
            "Seed means per model × depth × E; `surface` adds each one's patient-bootstrap 95% interval.",
            figures=("heatmap_*",), tables=("depth_scale", "surface")),
    Section("concepts", "Concept families", figures=("concept_families",), body=_concepts_body,
            claims=("concepts",), needs=("concepts",)),
    Section("stability", "Rank stability and sensitivity",
            "Kendall τ between model orders at every pair of expansions; the fixed k/N sparsity arm against the "
            "primary fixed k/d arm; how the summaries move with depth, scale and arm.",
            figures=("rank_stability", "sensitivity_arm"), tables=("rank_stability", "arm", "sensitivity")),
    Section("reproducibility", "Reproducibility", figures=("reproducibility",), tables=("reproducibility",)),
    Section("atlas", "Validation atlas",
            "Validation R² and dead fraction of every primary cell (mean over seeds); the fidelity gate is "
            "R² ≥ .90 and dead fraction < .20.", figures=("atlas_*",), body=_cells_body, claims=("cells",),
            needs=("cells",)),
)}
