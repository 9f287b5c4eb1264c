"""Figures of the paper analyses (paper_analyses.py): reproducibility AUC, sparsity-arm agreement, dead fraction.

Registered into figures.FIGURES (at the end of figures.py), so `make_figures` draws them with the same
deterministic settings. The helpers of figures.py are imported inside the builders, so this module never
imports figures.py at load time (either module may be imported first).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

Tables = dict[str, pd.DataFrame]
MEASURES = {"excess": "Matched cosine above random floor", "subspace_overlap": "Subspace overlap"}
ARM_METRICS = ("reconstruction", "accessibility", "coverage", "dead_fraction")


def _label(metric: str) -> str:
    from raybench.analysis.figures import metric_label

    return "Dead fraction" if metric == "dead_fraction" else metric_label(metric)


def fig_reproducibility_auc(t: Tables) -> Figure | None:
    from raybench.analysis.figures import error_bars, model_label

    rep = t["reproducibility_auc"]
    measures = [m for m in MEASURES if (rep.measure == m).any()]
    if not measures:
        return None
    n = rep.model.nunique()
    fig = Figure(figsize=(4.0 * len(measures), 0.42 * n + 1.8), layout="constrained")
    axes = fig.subplots(1, len(measures), squeeze=False)[0]
    for ax, measure in zip(axes, measures, strict=True):
        sub = rep[rep.measure == measure].sort_values(["auc", "model"], ascending=[True, True])
        y = np.arange(len(sub))
        ax.errorbar(sub.auc, y, xerr=error_bars(sub.auc, sub.ci_low, sub.ci_high), fmt="s", color="0.3", ms=4,
                    capsize=2.5, label="crossed bootstrap 95% CI (depth units × seed pairs)")
        if sub.published.notna().any():
            ax.plot(sub.published, y + 0.22, "x", color="C3", ms=5, label="published")
        short = sub.short_denominator.astype(bool).to_numpy() if "short_denominator" in sub else np.zeros(len(sub))
        ax.set_yticks(y, [model_label(m) + (" *" if s else "") for m, s in zip(sub.model, short, strict=True)])
        ax.set_ylim(-0.7, len(sub) - 0.3)
        ax.set_title(f"{MEASURES[measure]}: AUC over log E")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=2, frameon=False)
    fig.suptitle("Seed reproducibility, common-scale summary (* short denominator)")
    return fig


def fig_arm_agreement(t: Tables) -> Figure | None:
    from raybench.analysis.figures import _palette, error_bars, model_label

    ranks, aucs = t["arm_rank_agreement"], t["arm_auc_differences"]
    metrics = [m for m in ARM_METRICS if (ranks.metric == m).any()]
    if not metrics:
        return None
    fig = Figure(figsize=(4.2 + 2.6 * len(metrics), 3.6), layout="constrained")
    axes = fig.subplots(1, 1 + len(metrics), squeeze=False)[0]
    ax = axes[0]
    for i, metric in enumerate(metrics):
        sub = ranks[ranks.metric == metric].sort_values("expansion")
        ax.plot(sub.expansion, sub.kendall_tau, marker="o", ms=4, color=f"C{i}", label=_label(metric))
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
    colors = _palette(models)
    for ax, metric in zip(axes[1:], metrics, strict=True):
        sub = aucs[aucs.metric == metric].set_index("model").reindex(models)
        y = np.arange(len(models))
        for j, m in enumerate(models):
            ax.errorbar(sub["diff"].iloc[j], y[j], xerr=error_bars([sub["diff"].iloc[j]], [sub.ci_low.iloc[j]],
                                                                    [sub.ci_high.iloc[j]]),
                        fmt="o", color=colors[m], ms=4, capsize=2.5)
        ax.axvline(0, color="0.4", lw=0.8)
        ax.set_yticks(y, [model_label(m) for m in models])
        ax.set_title(f"{_label(metric)}: Δ AUC (k/N − k/d)", fontsize=9)
    fig.suptitle("Sparsity arms at the sensitivity depth (paired-seed bootstrap 95% CIs)")
    return fig


def fig_dead_fraction(t: Tables) -> Figure | None:
    from raybench.analysis.figures import _expansion_axis, _legend_below, _models, _palette, model_label

    curve, rs = t["dead_fraction"], t["dead_fraction_rank_stability"]
    models = _models(curve)
    colors = _palette(models)
    split = str(curve.split.iloc[0]) if "split" in curve and len(curve) else ""
    fig = Figure(figsize=(8.0, 3.5), layout="constrained")
    axes = fig.subplots(1, 2)
    for model in models:
        g = curve[curve.model == model].sort_values("expansion")
        axes[0].plot(g.expansion, g.value, marker="o", ms=3.5, color=colors[model], label=model_label(model))
    _expansion_axis(axes[0], sorted(curve.expansion.unique()))
    axes[0].set_ylabel(f"Dead fraction ({split})" if split else "Dead fraction")
    axes[0].set_title("Dead-latent fraction (mean over depths and seeds)")
    rs = rs.sort_values(["expansion_a", "expansion_b"])
    pairs = [f"{int(a)}–{int(b)}" for a, b in zip(rs.expansion_a, rs.expansion_b, strict=True)]
    axes[1].plot(range(len(pairs)), rs.kendall_tau, marker="o", ms=4, color="0.25")
    axes[1].axhline(0, color="0.4", lw=0.8)
    axes[1].set_ylim(-1.05, 1.05)
    axes[1].set_xticks(range(len(pairs)), pairs, rotation=30)
    axes[1].set_xlabel("Pair of expansions (E_a–E_b)")
    axes[1].set_ylabel("Kendall τ between model orders")
    axes[1].set_title("Rank stability of the dead fraction")
    _legend_below(fig, axes[0], len(models))
    return fig


# (stem, tables needed, builder, caption): wrapped into figures.FigureSpec by figures.py
PAPER_FIGURES = (
    ("reproducibility_auc", ("reproducibility_auc",), fig_reproducibility_auc,
     "Common-scale AUC over log E of seed reproducibility (matched cosine above the permutation floor, subspace "
     "overlap) with crossed-bootstrap 95% CIs; x: published PTB-XL values."),
    ("arm_agreement", ("arm_rank_agreement", "arm_auc_differences"), fig_arm_agreement,
     "Kendall τ between the model orders of the fixed k/d and fixed k/N arms per E, and the arm difference of "
     "each model's common-scale AUC with paired-seed bootstrap 95% CIs."),
    ("dead_fraction_profile", ("dead_fraction", "dead_fraction_rank_stability"), fig_dead_fraction,
     "Dead-latent fraction across E per model, and Kendall τ between the model orders at every pair of E."),
)
