"""The comparison's figure, drawn from its tables only (PNG + SVG, byte-identical on rerun: plotting.py).

Top row, one panel per metric: each model's AUC in run A (x) against run B (y) with both intervals, the leaders
ringed, the title giving Kendall tau with its interval and whether the leader is preserved. Bottom row: each
model's AUC difference B - A with its interval, zero marked.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from raybench.analysis.report.plotting import (
    METRICS,
    RC,
    error_bars,
    metric_label,
    model_label,
    palette,
    render_figure,
    write_rendered,
)

STEM = "compare"
CAPTION = ("Top: each model's common-scale AUC in run A (x) and run B (y) with patient-bootstrap percentile "
           "intervals (95% unless the protocol sets other bounds); ringed: each run's leader(s); title: Kendall τ of "
           "the model profiles with its interval. Bottom: the AUC difference B − A per model with the interval from "
           "independent draws of the two runs.")


def _title(metric: str, agree: pd.Series, lead: pd.Series) -> str:
    kept = "leader preserved" if bool(lead.leader_preserved) else "leader changed"
    return (f"{metric_label(metric)}\nτ = {agree.kendall_tau:.2f} [{agree.kendall_ci_low:.2f}, "
            f"{agree.kendall_ci_high:.2f}] · {kept}")


def _scatter(ax, rows: pd.DataFrame, colours: dict, lead: pd.Series) -> None:
    for r in rows.itertuples():
        ax.errorbar([r.auc_a], [r.auc_b], xerr=error_bars([r.auc_a], [r.ci_low_a], [r.ci_high_a]),
                    yerr=error_bars([r.auc_b], [r.ci_low_b], [r.ci_high_b]), fmt="o", ms=5, capsize=2,
                    color=colours[r.model], label=model_label(r.model))
    for name, marker in ((lead.leader_a, "o"), (lead.leader_b, "s")):
        sel = rows[rows.model.isin(str(name).split("|"))]
        ax.scatter(sel.auc_a, sel.auc_b, s=150, facecolors="none", edgecolors="black", marker=marker, lw=1.0)
    lo = float(np.nanmin(rows[["ci_low_a", "ci_low_b"]].to_numpy()))
    hi = float(np.nanmax(rows[["ci_high_a", "ci_high_b"]].to_numpy()))
    pad = 0.05 * (hi - lo) if hi > lo else 0.01
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.6", lw=0.8, ls="--")
    ax.set_xlabel("AUC, run A (ring: A's leader)")
    ax.set_ylabel("AUC, run B (square: B's leader)")


def _forest(ax, rows: pd.DataFrame, colours: dict) -> None:
    sub = rows.sort_values(["diff", "model"], ascending=[True, True])
    y = np.arange(len(sub))
    for yi, r in zip(y, sub.itertuples(), strict=True):
        ax.errorbar([r.diff], [yi], xerr=error_bars([r.diff], [r.ci_low], [r.ci_high]), fmt="o", ms=4.5,
                    capsize=2.5, color=colours[r.model])
    ax.axvline(0, color="0.4", lw=0.8)
    ax.locator_params(axis="x", nbins=5)
    ax.set_yticks(y, [model_label(m) for m in sub.model])
    ax.set_ylim(-0.7, len(sub) - 0.3)
    ax.set_xlabel("AUC difference B − A")


def build(tables: dict[str, pd.DataFrame]) -> Figure | None:
    """The figure from the leaders, rank_agreement and auc_differences tables (None when they are empty)."""
    diff, agree, lead = (tables.get(n) for n in ("auc_differences", "rank_agreement", "leaders"))
    if any(t is None or t.empty for t in (diff, agree, lead)):
        return None
    metrics = [m for m in METRICS if (diff.metric == m).any()]
    colours = palette(list(dict.fromkeys(diff.model)))
    fig = Figure(figsize=(4.0 * len(metrics), 7.4), layout="constrained")
    axes = fig.subplots(2, len(metrics), squeeze=False)
    agree_by, lead_by = agree.set_index("metric"), lead.set_index("metric")
    for j, metric in enumerate(metrics):
        rows = diff[diff.metric == metric]
        _scatter(axes[0, j], rows, colours, lead_by.loc[metric])
        axes[0, j].set_title(_title(metric, agree_by.loc[metric], lead_by.loc[metric]))
        _forest(axes[1, j], rows, colours)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), frameon=False)
    return fig


def draw(tables: dict[str, pd.DataFrame], figures_dir: Path) -> list[Path]:
    """Write the figure as figures_dir/compare.png and .svg -> the paths (none when there is nothing to draw)."""
    with matplotlib.rc_context(RC):
        fig = build(tables)
        if fig is None:
            return []
        return write_rendered(render_figure(fig), figures_dir, STEM)
