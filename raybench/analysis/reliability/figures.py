"""The audit's figures (PNG + SVG through raybench.analysis.report.plotting, byte-identical on rerun): variance
shares per metric, raybench metrics against ground truth on the synthetic panel, metrics through training."""

from __future__ import annotations

import logging
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from raybench.analysis.report.plotting import RC, load_tables, panel_grid, save_figure
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

CAPTIONS = {
    "reliability_variance": "Share of each metric's variation across primary cells explained by model, depth, E, "
                            "training seed, their interactions and the seed residual (type I ANOVA).",
    "reliability_ground_truth": "raybench metrics against GT-MCC on the synthetic ground-truth panel (circles: "
                                "trained SAEs; squares: controls; star: the oracle; accessibility_out: the "
                                "out-of-SAE negative control).",
    "reliability_training": "Metrics at fixed fractions of training for the sampled stacks (one line per cell).",
}
SHARE_COLORS = {"model": "C0", "depth": "C1", "expansion": "C2", "seed": "C3", "interactions": "C7",
                "residual": "C5"}


def _variance(t: dict[str, pd.DataFrame]) -> Figure | None:
    var = t.get("reliability_variance")
    if var is None or var.empty:
        return None
    wide = var.pivot(index="metric", columns="factor", values="share").fillna(0.0)
    fig = Figure(figsize=(6.5, 0.5 + 0.45 * len(wide)), layout="constrained")
    ax = fig.add_subplot()
    left = np.zeros(len(wide))
    for f, color in SHARE_COLORS.items():
        if f in wide:
            ax.barh(wide.index, wide[f], left=left, color=color, label=f)
            left += wide[f].to_numpy()
    ax.set_xlim(0, 1)
    ax.set_xlabel("Share of variance across cells")
    fig.legend(loc="outside lower center", ncols=6, frameon=False, fontsize=7)
    return fig


def _ground_truth(t: dict[str, pd.DataFrame]) -> Figure | None:
    panel = t.get("reliability_panel")
    if panel is None or panel.empty:
        return None
    if "variant" in panel:
        panel = panel[panel.variant == panel.variant.iloc[0]]  # the deciding synthetic model
    metrics = [m for m in ("reconstruction", "accessibility", "coverage", "dead_fraction", "reproducibility",
                           "accessibility_out") if m in panel]
    rows, cols = panel_grid(len(metrics))
    fig = Figure(figsize=(3.0 * cols, 2.6 * rows), layout="constrained")
    for i, m in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        tr, ctl = panel[panel.kind == "trained"], panel[panel.kind == "control"]
        ax.scatter(tr.gt_mcc, tr[m], s=18, color="C0")
        ax.scatter(ctl.gt_mcc, ctl[m], s=22, marker="s", color="C3")
        orc = ctl[ctl.member == "oracle"]
        ax.scatter(orc.gt_mcc, orc[m], s=80, marker="*", color="C2")
        ax.set_xlabel("GT-MCC")
        ax.set_title(m)
    return fig


def _training(t: dict[str, pd.DataFrame]) -> Figure | None:
    tr = t.get("reliability_training")
    if tr is None or tr.empty:
        return None
    metrics = list(dict.fromkeys(tr.metric))
    rows, cols = panel_grid(len(metrics))
    fig = Figure(figsize=(3.0 * cols, 2.4 * rows), layout="constrained")
    for i, m in enumerate(metrics):
        ax = fig.add_subplot(rows, cols, i + 1)
        for _, s in tr[tr.metric == m].groupby(["model", "q", "expansion", "seed"]):
            s = s.sort_values("fraction")
            ax.plot(s.fraction, s.value, lw=0.8, alpha=0.6)
        ax.set_xlabel("Fraction of training")
        ax.set_title(m)
    return fig


BUILDERS = {"reliability_variance": _variance, "reliability_ground_truth": _ground_truth,
            "reliability_training": _training}


def make_reliability_figures(root: str | Path) -> list[Path]:
    """Draw the audit's figures whose tables exist; -> written paths."""
    layout = RunLayout.at(root)
    tables = load_tables(layout.tables_dir, ("reliability_variance", "reliability_panel", "reliability_training"))
    written: list[Path] = []
    for stem, build in BUILDERS.items():
        with matplotlib.rc_context(RC):
            fig = build(tables)
        if fig is None:
            for ext in ("png", "svg"):  # a figure of an earlier heavy pass that no longer applies
                (layout.figures_dir / f"{stem}.{ext}").unlink(missing_ok=True)
            continue
        written += save_figure(fig, layout.figures_dir, stem)
    return written
