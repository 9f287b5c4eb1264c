"""Figures of the secondary analyses, drawn from their tables (so `raybench report` redraws them): the
calibration ladder, dense accessibility and CKA under input harmonization, and intervention selectivity."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.api import RenderInputs
from raybench.analysis.report.plotting import RC, error_bars, load_tables, model_label, save_figure
from raybench.core.run_state import run_protocol

HARMONIZATION_PROTOCOLS = ("native", "lead", "temporal", "joint")
LADDER_RANK = {"dense_ridge": 0, "sae_ridge": 1, "dense_single": 3, "sae_single": 4, "random_single": 5}


def ladder_methods(methods: pd.Series) -> list[str]:
    """The calibration ladder's methods in ladder order: ridges, top-m ridges (largest m first), singles."""
    def key(m: str) -> tuple[int, int, str]:
        if m.startswith("sae_top") and m[7:].isdigit():
            return 2, -int(m[7:]), m
        return LADDER_RANK.get(m, 6), 0, m
    return sorted(set(methods.astype(str)), key=key)


def draw_secondary_figures(inp: RenderInputs) -> list[Path]:
    """Every secondary figure whose tables exist (an analysis that failed or was skipped has none)."""
    layout = inp.layout
    t = load_tables(layout.tables_dir, ("calibration", "calibration_margin", "harmonization", "intervention",
                                        "intervention_contrasts"))
    written: list[Path] = []
    if "calibration" in t and "calibration_margin" in t:
        protocol = inp.protocol or run_protocol(inp.root)
        expansion = protocol.eval.calibration_expansion if protocol is not None else 8
        written += calibration_figure(t, ladder_methods(t["calibration"]["method"]), layout.figures_dir, expansion)
    if "harmonization" in t:
        present = set(t["harmonization"]["protocol"].astype(str))
        written += harmonization_figure(t["harmonization"], tuple(p for p in HARMONIZATION_PROTOCOLS if p in present),
                                        layout.figures_dir)
    if "intervention" in t and "intervention_contrasts" in t:
        summary = t["intervention"]  # one design drawn: the matched candidate arm when run, at the largest k
        arms = set(summary["arm"].astype(str)) if "arm" in summary else {"matched"}
        k = int(summary["k"].max()) if "k" in summary and len(summary) else 5
        written += intervention_figure(t, layout.figures_dir, "matched" if "matched" in arms else "full", k)
    return written


def calibration_figure(tables: dict[str, pd.DataFrame], methods: list[str], out: Path, expansion: int) -> list[Path]:
    import matplotlib
    from matplotlib.figure import Figure

    summary, margin = tables["calibration"], tables["calibration_margin"]
    models = sorted(summary["model"].unique())
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(max(6.5, 1.4 * len(models) + 3), 3.6), layout="constrained")
        ax, ax2 = fig.subplots(1, 2, width_ratios=[3, 1.3])
        cmap = matplotlib.colormaps["tab10"]
        width = 0.8 / len(methods)
        x = np.arange(len(models))
        s = summary.set_index(["model", "method"])
        for i, m in enumerate(methods):
            vals = [s["accessibility"].get((mm, m), np.nan) for mm in models]
            ax.bar(x + (i - (len(methods) - 1) / 2) * width, vals, width, color=cmap(i % 10), label=m)
            if m == "random_single":
                lo = [s["unit_ci_low"].get((mm, m), np.nan) for mm in models]
                hi = [s["unit_ci_high"].get((mm, m), np.nan) for mm in models]
                xs = x + (i - (len(methods) - 1) / 2) * width
                ax.errorbar(xs, vals, yerr=error_bars(vals, lo, hi), fmt="none",
                            ecolor="black", elinewidth=0.8, capsize=2)
        ax.set_xticks(x, [model_label(m) for m in models], rotation=30, ha="right")
        ax.set_ylabel("Held-out mean |r|")
        ax.set_title(f"Calibration ladder (E = {expansion})")
        ax.legend(fontsize=7, ncols=2, frameon=False)
        if not margin.empty:
            mg = margin.set_index("model").reindex(models)
            v = mg["sae_minus_random"].to_numpy()
            ax2.errorbar(v, np.arange(len(models)), xerr=error_bars(v, mg["random_ci_low"], mg["random_ci_high"]),
                         fmt="o", color="#c0392b", capsize=3)
            ax2.axvline(0, color="0.3", lw=0.8, ls="--")
            ax2.set_yticks(np.arange(len(models)), [model_label(m) for m in models])
            ax2.invert_yaxis()
            ax2.set_xlabel("SAE − random single |r|")
            ax2.set_title("Learned vs random")
        return save_figure(fig, out, "calibration_ladder")


def harmonization_figure(summary: pd.DataFrame, protocols: tuple[str, ...], out: Path) -> list[Path]:
    import matplotlib
    from matplotlib.figure import Figure

    models = sorted(summary["model"].unique())
    colors = {"native": "#66A9D6", "lead": "#E69A4E", "temporal": "#66C2A4", "joint": "#DCA6C8"}
    s = summary.set_index(["model", "protocol"])
    x = np.arange(len(models))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(max(7.5, 1.6 * len(models) + 4), 3.4), layout="constrained")
        axes = fig.subplots(1, 3)
        panels = (("accessibility", "Test mean |r|", protocols), ("coverage", "Coverage (|r| ≥ .20)", protocols),
                  ("cka_to_native", "Linear CKA to native", tuple(p for p in protocols if p != "native")))
        for ax, (col, label, prots) in zip(axes, panels, strict=True):
            width = 0.8 / max(1, len(prots))
            for i, p in enumerate(prots):
                ax.bar(x + (i - (len(prots) - 1) / 2) * width, [s[col].get((m, p), np.nan) for m in models], width,
                       color=colors[p], label=p)
            ax.set_xticks(x, [model_label(m) for m in models], rotation=30, ha="right")
            ax.set_ylabel(label)
        axes[0].legend(fontsize=7, frameon=False)
        axes[0].set_title("Dense accessibility (final layer)")
        axes[2].set_title("Similarity to native input")
        return save_figure(fig, out, "harmonization_final_layer")


def intervention_figure(tables: dict[str, pd.DataFrame], out: Path, arm: str, k: int) -> list[Path]:
    """SAE - dense at one design (arm, k): off-target RMS and WBI differences, and the gate and selectivity."""
    import matplotlib
    from matplotlib.figure import Figure

    con = tables["intervention_contrasts"]
    con = con[(con["arm"] == arm) & (con["k"] == k) & (con["comparison"] == "sae_minus_dense")]
    summary = tables["intervention"]
    summary = summary[(summary["arm"] == arm) & (summary["k"] == k)]
    models = sorted(summary["model"].unique())
    y = np.arange(len(models))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(9.0, 0.45 * len(models) + 2.2), layout="constrained")
        axes = fig.subplots(1, 3)
        for ax, metric, title in ((axes[0], "off_cross_rms", "Δ off-target RMS"), (axes[1], "wbi_cross", "Δ WBI")):
            rows = con[con["metric"] == metric].set_index("model").reindex(models)
            v = rows["delta"].to_numpy(dtype=float)
            lo, hi = rows["ci_low"].to_numpy(dtype=float), rows["ci_high"].to_numpy(dtype=float)
            ax.errorbar(v, y, xerr=[np.abs(v - lo), np.abs(hi - v)], fmt="o", color="#E45756", capsize=3)
            ax.axvline(0, color="0.3", lw=0.8, ls="--")
            ax.set_title(f"{title} ({arm}, k = {k})")
            ax.set_xlabel("SAE − dense")
            ax.set_yticks(y, [model_label(m) for m in models])
            ax.invert_yaxis()
        wide = summary.pivot_table(index="model", columns="method", values="concepts_eligible").reindex(models)
        sel = summary[summary["method"] == "sae"].set_index("model").reindex(models)
        total = sel["concepts_total"].to_numpy(dtype=float)
        axes[2].barh(y, wide["sae"].to_numpy(dtype=float) / total, color="#9ecae1", label="eligible")
        axes[2].barh(y, sel["sae_selective_fraction"].to_numpy(dtype=float), color="#3182bd",
                     label="SAE more selective")
        axes[2].set_xlim(0, 1)
        axes[2].set_yticks(y, [model_label(m) for m in models])
        axes[2].invert_yaxis()
        axes[2].set_xlabel("Fraction of all concepts")
        axes[2].set_title("Gate and selectivity")
        axes[2].legend(fontsize=7, frameon=False)
        return save_figure(fig, out, "intervention_selectivity")
