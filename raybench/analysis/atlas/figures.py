"""Figures of a finished run, drawn from its tables (PNG + SVG, byte-identical on rerun).

The settings, writer, labels and shared panels are plotting.py's. A figure whose tables are missing or
empty is skipped with a logged note; every figure takes any number of models. FIGURES lists the base
tables' figures here and the paper analyses' (paper_figures.py).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from raybench.analysis.atlas.paper_figures import PAPER_FIGURES
from raybench.analysis.report.figures import draw_figures
from raybench.analysis.report.plotting import (
    METRICS,
    FigureSpec,
    Tables,
    error_bars,
    expansion_axis,
    expansion_pairs_axis,
    forest_panel,
    legend_below,
    metric_label,
    metric_order,
    model_label,
    models_in,
    palette,
    panel_grid,
)

log = logging.getLogger(__name__)


def make_figures(root: str | Path, parallel: bool | None = None) -> list[Path]:
    """Draw every atlas figure whose tables exist under `root`/tables (raybench.analysis.report.figures)."""
    return draw_figures(root, FIGURES, parallel)


# ---------------------------------------------------------------- helpers

def _depth_scale(tables: Tables, metric: str) -> pd.DataFrame:
    """model, q, expansion, value for one metric: the depth_scale table, else the mean over ok primary cells."""
    ds = tables.get("depth_scale")
    if ds is not None and (ds.metric == metric).any():
        return ds[ds.metric == metric][["model", "q", "expansion", "value"]]
    cells = tables.get("cells")
    col = {"val_r2": "val_r2", "val_dead_fraction": "val_dead_fraction", "accessibility": "test_accessibility",
           "coverage": "test_coverage", "reconstruction": "test_r2"}.get(metric)
    if cells is None or col not in cells:
        return pd.DataFrame(columns=["model", "q", "expansion", "value"])
    ok = cells[(cells.arm == "primary") & (cells.status == "ok")]
    return ok.groupby(["model", "q", "expansion"], sort=True)[col].mean().rename("value").reset_index()


def _heatmaps(df: pd.DataFrame, metric: str, mark_peak: bool, cmap: str) -> Figure | None:
    """One depth x E panel per model on a shared colour scale; optionally box each model's peak cell."""
    if df.empty:
        return None
    models = models_in(df)
    qs = sorted(df.q.unique())
    es = sorted(df.expansion.unique())
    vmin, vmax = float(np.nanmin(df.value)), float(np.nanmax(df.value))
    nrows, ncols = panel_grid(len(models))
    fig = Figure(figsize=(3.2 * ncols + 0.8, 2.8 * nrows + 0.4), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    image = None
    for ax, model in zip(axes.flat, models, strict=False):
        grid = (df[df.model == model].pivot_table(index="q", columns="expansion", values="value", aggfunc="mean")
                .reindex(index=qs, columns=es))
        image = ax.imshow(grid.to_numpy(), origin="lower", aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax)
        ax.set_xticks(range(len(es)), [str(int(e)) for e in es])
        ax.set_yticks(range(len(qs)), [f"{q:g}" for q in qs])
        ax.set_xlabel("Expansion E")
        ax.set_ylabel("Relative depth q")
        ax.set_title(model_label(model))
        ax.grid(False)
        vals = grid.to_numpy()
        mid = (vmin + vmax) / 2
        for (i, j), v in np.ndenumerate(vals):
            if np.isfinite(v):
                dark = (v < mid) != cmap.endswith("_r")
                ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=6.5,
                        color="white" if dark else "black")
        if mark_peak and np.isfinite(vals).any():
            i, j = np.unravel_index(np.nanargmax(vals), vals.shape)
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.2))
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, shrink=0.8, label=metric_label(metric))
    title = f"{metric_label(metric)} by depth and scale"
    fig.suptitle(title + (" (red box: peak cell)" if mark_peak else ""))
    return fig


# ---------------------------------------------------------------- builders

def fig_accessibility_heatmaps(t: Tables) -> Figure | None:
    return _heatmaps(_depth_scale(t, "accessibility"), "accessibility", mark_peak=True, cmap="viridis")


def fig_val_r2_atlas(t: Tables) -> Figure | None:
    return _heatmaps(_depth_scale(t, "val_r2"), "val_r2", mark_peak=False, cmap="cividis")


def fig_dead_fraction_atlas(t: Tables) -> Figure | None:
    return _heatmaps(_depth_scale(t, "val_dead_fraction"), "val_dead_fraction", mark_peak=False, cmap="magma_r")


def fig_matched_scale_curves(t: Tables) -> Figure | None:
    curves = t["curves"]
    metrics = [m for m in METRICS if (curves.metric == m).any()]
    if not metrics:
        return None
    models = models_in(curves)
    colors = palette(models)
    fig = Figure(figsize=(3.6 * len(metrics), 3.4), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        sub = curves[curves.metric == metric]
        for model in models:
            g = sub[sub.model == model].sort_values("expansion")
            if g.empty:
                continue
            ax.plot(g.expansion, g.value, marker="o", ms=3.5, lw=1.4, color=colors[model], label=model_label(model))
            if {"ci_low", "ci_high"} <= set(g) and g[["ci_low", "ci_high"]].notna().all().all():
                ax.fill_between(g.expansion, g.ci_low, g.ci_high, color=colors[model], alpha=0.18, lw=0)
        expansion_axis(ax, sorted(sub.expansion.unique()))
        ax.set_title(metric_label(metric))
    legend_below(fig, axes[0], len(models))
    fig.suptitle("Matched-scale curves (bands: 95% patient-bootstrap CI)")
    return fig


def fig_forest_auc(t: Tables) -> Figure | None:
    prof = t["profiles"]
    crossed = t.get("crossed")
    metrics = [m for m in METRICS if (prof.metric == m).any()]
    if not metrics:
        return None
    n_models = prof.model.nunique()
    fig = Figure(figsize=(3.8 * len(metrics), 0.42 * n_models + 1.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        sub = forest_panel(ax, prof[prof.metric == metric], f"{metric_label(metric)}: AUC over log E",
                           "patient bootstrap 95% CI")
        if crossed is not None and (crossed.metric == metric).any():
            c = crossed[crossed.metric == metric].set_index("model").reindex(sub.model)
            ax.errorbar(c.auc, np.arange(len(sub)) - 0.25, xerr=error_bars(c.auc, c.ci_low, c.ci_high), fmt="s",
                        color="0.45", ms=3, capsize=2, label="crossed bootstrap 95% CI")
    legend_below(fig, axes[0], 3)
    fig.suptitle("Common-scale summary (AUC_E), best model on top")
    return fig


def fig_concept_families(t: Tables) -> Figure | None:
    con = t["concepts"]
    table = con.pivot_table(index="model", columns="family", values="auc", aggfunc="mean").sort_index()
    if table.empty:
        return None
    fams = list(table.columns)
    fig = Figure(figsize=(1.2 * len(fams) + 2.6, 0.45 * len(table) + 1.6), layout="constrained")
    ax = fig.subplots()
    im = ax.imshow(table.to_numpy(), aspect="auto", cmap="viridis")
    ax.set_xticks(range(len(fams)), fams, rotation=20, ha="right")
    ax.set_yticks(range(len(table)), [model_label(m) for m in table.index])
    ax.grid(False)
    vals = table.to_numpy()
    mid = (np.nanmin(vals) + np.nanmax(vals)) / 2
    for (i, j), v in np.ndenumerate(vals):
        if np.isfinite(v):
            ax.text(j, i, f"{v:.3f}", ha="center", va="center", fontsize=7, color="white" if v < mid else "black")
    counts = con.drop_duplicates(["concept", "family"]).family.value_counts()
    ax.set_xlabel("Concept family (" + ", ".join(f"{f}: {counts.get(f, 0)}" for f in fams) + " concepts)")
    fig.colorbar(im, ax=ax, label="Mean concept AUC over log E")
    ax.set_title("Concept-family profile")
    return fig


def fig_rank_stability(t: Tables) -> Figure | None:
    rs = t["rank_stability"].sort_values(["expansion_a", "expansion_b"])
    pairs = list(dict.fromkeys(zip(rs.expansion_a.astype(int), rs.expansion_b.astype(int), strict=True)))
    if not pairs:
        return None
    x = {p: i for i, p in enumerate(pairs)}
    fig = Figure(figsize=(max(4.5, 0.55 * len(pairs) + 2), 3.4), layout="constrained")
    ax = fig.subplots()
    for i, metric in enumerate(sorted(rs.metric.unique(), key=metric_order)):
        sub = rs[rs.metric == metric]
        xs = [x[(int(a), int(b))] for a, b in zip(sub.expansion_a, sub.expansion_b, strict=True)]
        ax.plot(xs, sub.kendall_tau, marker="o", ms=4, color=f"C{i}", label=metric_label(metric))
    expansion_pairs_axis(ax, pairs)
    ax.set_title("Rank stability across scale")
    ax.legend(frameon=False, fontsize=8)
    return fig


ARM_PANELS = ("reconstruction", "accessibility", "coverage")  # the published figure's panels (c)-(e)


def fig_sensitivity_arm(t: Tables) -> Figure | None:
    """One point per model: its common-scale AUC at the sensitivity depth under fixed k/d (x) and fixed k/N (y),
    the seed mean of per-seed AUCs (arm_auc_differences), on square axes padded as published with the diagonal
    of unchanged profiles (docs/protocol.md §9.2)."""
    aucs = t["arm_auc_differences"]
    metrics = [m for m in ARM_PANELS if (aucs.metric == m).any()]
    if not metrics:
        return None
    models = models_in(aucs)
    colors = palette(models)
    fig = Figure(figsize=(3.3 * len(metrics), 3.6), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics, strict=True):
        sub = aucs[aucs.metric == metric].set_index("model").reindex(models)
        x, y = sub.primary_auc.to_numpy(float), sub.sensitivity_auc.to_numpy(float)
        both = np.concatenate([x, y])
        both = both[np.isfinite(both)]
        if both.size == 0:
            ax.set_visible(False)
            continue
        lo, hi = float(both.min()), float(both.max())
        pad = max((hi - lo) * 0.08, 1e-4)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.4", ls="--", lw=0.9)
        for j, model in enumerate(models):
            if np.isfinite(x[j]) and np.isfinite(y[j]):
                ax.scatter(x[j], y[j], s=26, color=colors[model], label=model_label(model), zorder=3)
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_xlabel("Fixed k/d (primary)")
        ax.set_ylabel("Fixed k/N (sensitivity)")
        ax.set_title(f"{metric_label(metric)} AUC")
    legend_below(fig, axes[0], len(models))
    fig.suptitle("Common-scale AUC at the sensitivity depth under each sparsity arm (diagonal: unchanged)")
    return fig


def fig_reproducibility(t: Tables) -> Figure | None:
    rep = t["reproducibility"]
    models = models_in(rep)
    colors = palette(models)
    fig = Figure(figsize=(7.4, 3.4), layout="constrained")
    axes = fig.subplots(1, 2)
    for ax, col, title in ((axes[0], "excess", "Matched cosine above random floor"),
                           (axes[1], "subspace_overlap", "Subspace overlap")):
        g = rep.groupby(["model", "expansion"], sort=True)[col].mean().reset_index()
        for model in models:
            s = g[g.model == model]
            ax.plot(s.expansion, s[col], marker="o", ms=3.5, color=colors[model], label=model_label(model))
        expansion_axis(ax, sorted(rep.expansion.unique()))
        ax.set_title(title + " (mean over depths)")
    legend_below(fig, axes[0], len(models))
    fig.suptitle("Seed reproducibility of decoder dictionaries")
    return fig


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec("forest_auc", ("profiles",), fig_forest_auc,
               "Common-scale AUCs per model with patient-bootstrap (and crossed-bootstrap) 95% CIs."),
    FigureSpec("matched_scale_curves", ("curves",), fig_matched_scale_curves,
               "Each metric against expansion E, with bootstrap bands."),
    FigureSpec("heatmap_accessibility", ("depth_scale",), fig_accessibility_heatmaps,
               "Accessibility over relative depth x expansion per model; the red box marks the peak cell."),
    FigureSpec("concept_families", ("concepts",), fig_concept_families,
               "Mean accessibility AUC per concept family."),
    FigureSpec("rank_stability", ("rank_stability",), fig_rank_stability,
               "Kendall tau between model orders at every pair of expansions."),
    FigureSpec("sensitivity_arm", ("arm_auc_differences",), fig_sensitivity_arm,
               "Each model's common-scale AUC at the sensitivity depth under fixed k/d (x) and fixed k/N (y), one "
               "point per model (seed mean); the diagonal marks an unchanged profile."),
    FigureSpec("reproducibility", ("reproducibility",), fig_reproducibility,
               "Across-seed matched decoder cosine above the permutation floor, and subspace overlap."),
    FigureSpec("atlas_val_r2", ("cells",), fig_val_r2_atlas, "Validation R² atlas (depth x E per model)."),
    FigureSpec("atlas_dead_fraction", ("cells",), fig_dead_fraction_atlas,
               "Validation dead-latent fraction atlas (depth x E per model)."),
    *PAPER_FIGURES,
)
