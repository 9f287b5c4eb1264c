"""Figures of the paper analyses (paper_analyses.py): reproducibility AUC, sparsity-arm agreement, dead fraction.

Listed in figures.FIGURES, so `make_figures` draws them with the same deterministic settings (plotting.py).
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from raybench.analysis.report import plotting

MEASURES = {"excess": "Matched cosine above random floor", "subspace_overlap": "Subspace overlap"}
ARM_METRICS = ("reconstruction", "accessibility", "coverage", "dead_fraction")


def fig_reproducibility_auc(t: plotting.Tables) -> Figure | None:
    rep = t["reproducibility_auc"]
    measures = [m for m in MEASURES if (rep.measure == m).any()]
    if not measures:
        return None
    n = rep.model.nunique()
    fig = Figure(figsize=(4.0 * len(measures), 0.42 * n + 1.8), layout="constrained")
    axes = fig.subplots(1, len(measures), squeeze=False)[0]
    for ax, measure in zip(axes, measures, strict=True):
        plotting.forest_panel(ax, rep[rep.measure == measure], f"{MEASURES[measure]}: AUC over log E",
                     "crossed bootstrap 95% CI (depth units × seed pairs)", fmt="s", color="0.3", ms=4,
                     mark_short=True)
    plotting.legend_below(fig, axes[0], 2)
    fig.suptitle("Seed reproducibility, common-scale summary (* short denominator)")
    return fig


def fig_arm_agreement(t: plotting.Tables) -> Figure | None:
    ranks, aucs = t["arm_rank_agreement"], t["arm_auc_differences"]
    metrics = [m for m in ARM_METRICS if (ranks.metric == m).any()]
    if not metrics:
        return None
    fig = Figure(figsize=(4.2 + 2.6 * len(metrics), 3.6), layout="constrained")
    axes = fig.subplots(1, 1 + len(metrics), squeeze=False)[0]
    ax = axes[0]
    for i, metric in enumerate(metrics):
        sub = ranks[ranks.metric == metric].sort_values("expansion")
        ax.plot(sub.expansion, sub.kendall_tau, marker="o", ms=4, color=f"C{i}", label=plotting.metric_label(metric))
    ax.set_xscale("log", base=2)
    es = sorted(ranks.expansion.unique())
    ax.set_xticks(es, [str(int(e)) for e in es])
    ax.minorticks_off()
    ax.set_ylim(-1.05, 1.05)
    ax.axhline(0, color="0.4", lw=0.8)
    ax.set_xlabel("Expansion E")
    ax.set_ylabel("Kendall τ, fixed k/d vs fixed k/N order")
    ax.legend(frameon=False, fontsize=7)
    ax.set_title("Model order agreement per E")
    models = sorted(aucs.model.unique())
    colors = plotting.palette(models)
    for ax, metric in zip(axes[1:], metrics, strict=True):
        sub = aucs[aucs.metric == metric].set_index("model").reindex(models)
        y = np.arange(len(models))
        for j, m in enumerate(models):
            bars = plotting.error_bars([sub["diff"].iloc[j]], [sub.ci_low.iloc[j]], [sub.ci_high.iloc[j]])
            ax.errorbar(sub["diff"].iloc[j], y[j], xerr=bars, fmt="o", color=colors[m], ms=4, capsize=2.5)
        ax.axvline(0, color="0.4", lw=0.8)
        ax.set_yticks(y, [plotting.model_label(m) for m in models])
        ax.set_title(f"{plotting.metric_label(metric)}: Δ AUC (k/N − k/d)", fontsize=9)
    fig.suptitle("Sparsity arms at the sensitivity depth (paired-seed bootstrap 95% CIs)")
    return fig


def fig_dead_fraction(t: plotting.Tables) -> Figure | None:
    curve, rs = t["dead_fraction"], t["dead_fraction_rank_stability"]
    models = plotting.models_in(curve)
    colors = plotting.palette(models)
    split = str(curve.split.iloc[0]) if "split" in curve and len(curve) else ""
    fig = Figure(figsize=(8.0, 3.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for model in models:
        g = curve[curve.model == model].sort_values("expansion")
        axes[0].plot(g.expansion, g.value, marker="o", ms=3.5, color=colors[model], label=plotting.model_label(model))
    plotting.expansion_axis(axes[0], sorted(curve.expansion.unique()))
    axes[0].set_ylabel(f"Dead fraction ({split})" if split else "Dead fraction")
    axes[0].set_title("Dead-latent fraction (mean over depths and seeds)")
    rs = rs.sort_values(["expansion_a", "expansion_b"])
    pairs = [(int(a), int(b)) for a, b in zip(rs.expansion_a, rs.expansion_b, strict=True)]
    axes[1].plot(range(len(pairs)), rs.kendall_tau, marker="o", ms=4, color="0.25")
    plotting.expansion_pairs_axis(axes[1], pairs)
    axes[1].set_title("Rank stability of the dead fraction")
    plotting.legend_below(fig, axes[0], len(models))
    return fig


PAPER_FIGURES = (
    plotting.FigureSpec(
        "reproducibility_auc", ("reproducibility_auc",), fig_reproducibility_auc,
        "Common-scale AUC over log E of seed reproducibility (matched cosine above the permutation floor, subspace "
        "overlap) with crossed-bootstrap 95% CIs; x: published PTB-XL values."),
    plotting.FigureSpec(
        "arm_agreement", ("arm_rank_agreement", "arm_auc_differences"), fig_arm_agreement,
        "Kendall τ between the model orders of the fixed k/d and fixed k/N arms per E, and the arm difference of "
        "each model's common-scale AUC with paired-seed bootstrap 95% CIs."),
    plotting.FigureSpec(
        "dead_fraction_profile", ("dead_fraction", "dead_fraction_rank_stability"), fig_dead_fraction,
        "Dead-latent fraction across E per model, and Kendall τ between the model orders at every pair of E."),
)
