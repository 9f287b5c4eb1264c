"""Figures of the provenance audit (docs/protocol.md §12): LPI per depth, association-response curves, and G
before / after removal against the random controls' distribution. PNG + SVG through plotting.save_figure."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.report.plotting import RC, error_bars, model_label, save_figure

CAPTIONS = {
    "provenance_lpi": "Recover: bits of provenance per record a calibrated probe recovers from each depth (LPI, "
                      "patient-bootstrap 95% CI).",
    "provenance_curves": "Stress: AUROC of the exposed (solid) and control (dashed) heads as the target-provenance "
                         "odds ratio goes from the natural kappa (1) through independence (0) to 1/kappa (-1), both "
                         "marginals fixed.",
    "provenance_removal": "Intervene / Verify: G before removal (black), after removing the rank-p provenance "
                          "component (red), and after each matched random projection (grey).",
}


def make_provenance_figures(tables: dict[str, pd.DataFrame], out: Path) -> list[Path]:
    """Draw the figures whose tables have rows (an earlier run's provenance figures are removed first, so none
    is left stale); returns the written paths."""
    import matplotlib

    for stale in sorted(out.glob("provenance_*")) if out.is_dir() else []:
        if stale.stem in CAPTIONS and stale.suffix in (".png", ".svg"):
            stale.unlink()
    written: list[Path] = []
    with matplotlib.rc_context(RC):
        for stem, build in (("provenance_lpi", _lpi), ("provenance_curves", _curves),
                            ("provenance_removal", _removal)):
            fig = build(tables)
            if fig is not None:
                written += save_figure(fig, out, stem)
    return written


def _lpi(tables: dict[str, pd.DataFrame]):
    from matplotlib.figure import Figure

    rec = tables.get("provenance_recover")
    if rec is None or rec.empty:
        return None
    variables = sorted(rec.variable.unique())
    fig = Figure(figsize=(4.2 * len(variables), 3.4), layout="constrained")
    axes = np.atleast_1d(fig.subplots(1, len(variables), squeeze=False)[0])
    for ax, var in zip(axes, variables, strict=True):
        sub = rec[rec.variable == var]
        for model, m in sub.groupby("model", sort=True):
            m = m.sort_values("q")
            ax.errorbar(m.q, m.lpi_bits, yerr=error_bars(m.lpi_bits, m.ci_low, m.ci_high), marker="o", capsize=2,
                        label=model_label(model))
        ax.set_xlabel("Relative depth q")
        ax.set_ylabel("LPI (bits / record)")
        ax.set_title(f"Recover: {var}")
        ax.axhline(0, color="0.5", lw=0.8, ls=":")
    axes[-1].legend(fontsize=7, frameon=False)
    return fig


def _curves(tables: dict[str, pd.DataFrame]):
    import matplotlib
    from matplotlib.figure import Figure

    stress = tables.get("provenance_stress")
    if stress is None or stress.empty:
        return None
    before = stress[stress.stage == "before"]
    rows = sorted(before.variable.unique())
    models = sorted(before.model.unique())
    fig = Figure(figsize=(2.6 * len(models) + 1, 2.4 * len(rows) + 0.6), layout="constrained")
    axes = fig.subplots(len(rows), len(models), squeeze=False)
    depths = sorted(before.q.unique())
    cmap = matplotlib.colormaps["viridis"]
    for i, var in enumerate(rows):
        for j, model in enumerate(models):
            ax = axes[i, j]
            sub = before[(before.variable == var) & (before.model == model)]
            for qi, q in enumerate(depths):
                c = sub[sub.q == q].sort_values("level")
                if c.empty:
                    continue
                color = cmap(qi / max(len(depths) - 1, 1))
                ax.plot(c.level, c.auroc_exposed, "-o", ms=3, color=color, label=f"q={q:g}")
                ax.plot(c.level, c.auroc_control, "--", color=color)
            ax.set_title(f"{model_label(model)}: {var}", fontsize=8)
            ax.set_xlabel("regime e (odds ratio kappa^e)")
            if j == 0:
                ax.set_ylabel("AUROC")
    axes[0, -1].legend(fontsize=6, frameon=False)
    return fig


def _removal(tables: dict[str, pd.DataFrame]):
    from matplotlib.figure import Figure

    ver, ctl = tables.get("provenance_verdicts"), tables.get("provenance_controls")
    if ver is None or ver.empty or ctl is None or ctl.empty or "g" not in ver:
        return None
    rank = int(ver["verdict_rank"].dropna().min()) if "verdict_rank" in ver and ver["verdict_rank"].notna().any() \
        else int(ctl["rank"].min())
    ver = ver[ver.g.notna() & ver.get(f"g_after_p{rank}", pd.Series(np.nan, index=ver.index)).notna()]
    if ver.empty:
        return None
    labels = [f"{model_label(r.model)} q={r.q:g} {r.variable}" for r in ver.itertuples()]
    fig = Figure(figsize=(7.5, 0.22 * len(ver) + 1.2), layout="constrained")
    ax = fig.subplots()
    for i, r in enumerate(ver.itertuples()):
        c = ctl[(ctl.model == r.model) & (ctl.q == r.q) & (ctl.variable == r.variable) & (ctl["rank"] == rank)]
        ax.scatter(c.g_after, np.full(len(c), i), s=4, color="0.7", zorder=1)
        ax.scatter([r.g], [i], s=14, color="black", zorder=2)
        ax.scatter([getattr(r, f"g_after_p{rank}")], [i], s=14, color="#c0392b", zorder=3)
    ax.set_yticks(np.arange(len(ver)), labels, fontsize=6)
    ax.invert_yaxis()
    ax.axvline(0, color="0.4", lw=0.8, ls="--")
    ax.set_xlabel(f"G (excess vulnerability); removal rank p={rank}")
    ax.set_title("G before (black), after removal (red), after random controls (grey)", fontsize=8)
    return fig
