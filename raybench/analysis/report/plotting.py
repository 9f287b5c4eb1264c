"""What every figure of a run shares: deterministic matplotlib settings and writer, labels, colours, the
figure registry entry, and the panels several figures draw (forest of AUCs, Kendall tau over E pairs).

Uses matplotlib's object API with the Agg canvas (no pyplot state), a fixed SVG hash salt and no date
metadata, so redrawing leaves identical files. figures.py (base tables), paper_figures.py (paper analyses)
and the secondary analyses draw through this module.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from raybench.core.atomic import atomic_path
from raybench.core.models import LABELS

METRICS = ("reconstruction", "accessibility", "coverage")
METRIC_LABELS = {"reconstruction": "Reconstruction R²", "accessibility": "Accessibility (mean |r|)",
                 "coverage": "Coverage (|r| ≥ .20)", "val_r2": "Validation R²",
                 "val_dead_fraction": "Validation dead fraction", "dead_fraction": "Dead fraction"}
RC = {
    "svg.hashsalt": "raybench",  # fixed ids in SVG output
    "svg.fonttype": "none",  # text stays text in SVG (small, searchable)
    "font.size": 9,
    "axes.titlesize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "image.cmap": "viridis",
}
METADATA = {"png": {"Software": "raybench"}, "svg": {"Date": None, "Creator": "raybench"}}

Tables = dict[str, pd.DataFrame]


@dataclass(frozen=True)
class FigureSpec:
    """One figure: file stem, the tables it needs, and a builder returning a Figure (None: nothing to draw)."""

    stem: str
    needs: tuple[str, ...]
    build: Callable[[Tables], Figure | None]
    caption: str = ""


def model_label(model: str) -> str:
    return LABELS.get(model, model)


def metric_label(metric: str) -> str:
    return METRIC_LABELS.get(metric, metric)


def metric_order(metric: str) -> tuple[int, str]:
    """Sort key: the three base metrics first, in METRICS order."""
    return (METRICS.index(metric) if metric in METRICS else len(METRICS), metric)


def load_tables(tables_dir: Path, names: tuple[str, ...] | None = None) -> Tables:
    """Read `<name>.parquet` tables that exist (all parquet files when `names` is None)."""
    paths = sorted(tables_dir.glob("*.parquet")) if names is None else [tables_dir / f"{n}.parquet" for n in names]
    return {p.stem: pd.read_parquet(p) for p in paths if p.exists()}


FORMATS = ("png", "svg")


def render_figure(fig: Figure) -> dict[str, bytes]:
    """`fig` as PNG and SVG bytes with deterministic metadata (the constrained layout runs once, for both)."""
    FigureCanvasAgg(fig)
    out = {}
    with matplotlib.rc_context(RC):
        fig.draw_without_rendering()  # run the constrained layout once, then freeze it for both formats
        fig.set_layout_engine("none")
        for ext in FORMATS:
            buf = io.BytesIO()
            fig.savefig(buf, format=ext, metadata=METADATA[ext])
            out[ext] = buf.getvalue()
    return out


def write_rendered(rendered: dict[str, bytes], out_dir: Path, stem: str) -> list[Path]:
    """Write `render_figure`'s bytes as `<stem>.<ext>` atomically (creating out_dir)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for ext, data in rendered.items():
        path = out_dir / f"{stem}.{ext}"
        with atomic_path(path) as tmp:
            tmp.write_bytes(data)
        paths.append(path)
    return paths


def save_figure(fig: Figure, out_dir: Path, stem: str) -> list[Path]:
    """Save `fig` as `<stem>.png` and `<stem>.svg` atomically (creating out_dir), with deterministic metadata."""
    return write_rendered(render_figure(fig), out_dir, stem)


# ---------------------------------------------------------------- helpers

def palette(models: list[str]) -> dict[str, tuple]:
    """One distinct colour per model (tab10, or tab20 beyond ten models)."""
    cmap = matplotlib.colormaps["tab10" if len(models) <= 10 else "tab20"]
    return {m: cmap(i % cmap.N) for i, m in enumerate(models)}


def panel_grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, columns) for n panels, at most max_cols wide."""
    cols = max(1, min(n, max_cols))
    return math.ceil(n / cols), cols


def models_in(*frames: pd.DataFrame) -> list[str]:
    """Sorted model ids found in the frames' `model` columns."""
    return sorted(set().union(*(set(f["model"].astype(str)) for f in frames if "model" in f)))


def expansion_axis(ax, expansions) -> None:
    """A log2 x axis ticked at the expansions E."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(expansions))
    ax.set_xticklabels([str(int(e)) for e in expansions])
    ax.minorticks_off()
    ax.set_xlabel("Expansion E = N/d")


def legend_below(fig: Figure, ax, n: int) -> None:
    """The legend of `ax` under the whole figure, up to six columns."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(n, 6), frameon=False)


def error_bars(point, low, high) -> np.ndarray:
    """[2, n] distances for errorbar. A percentile interval need not contain the point estimate (mean |r| is
    biased upward under resampling), so a side that would be negative is drawn as zero."""
    point, low, high = (np.asarray(a, dtype=float) for a in (point, low, high))
    return np.clip(np.stack([point - low, high - point]), 0.0, None)


# ---------------------------------------------------------------- shared panels

def forest_panel(ax, rows: pd.DataFrame, title: str, ci_label: str, fmt: str = "o", color: str = "C0",
                 ms: float = 4.5, mark_short: bool = False) -> pd.DataFrame:
    """AUCs of one metric as a forest, best model on top: rows (model, auc, ci_low, ci_high, optional published
    and short_denominator) -> the rows in drawing order (y = 0, 1, ...). Published values are crosses; with
    mark_short a model with a short denominator gets a '*'."""
    sub = rows.sort_values(["auc", "model"], ascending=[True, True])
    y = np.arange(len(sub))
    ax.errorbar(sub.auc, y, xerr=error_bars(sub.auc, sub.ci_low, sub.ci_high), fmt=fmt, color=color, ms=ms,
                capsize=2.5, label=ci_label)
    if "published" in sub and sub.published.notna().any():
        ax.plot(sub.published, y + 0.22, "x", color="C3", ms=5, label="published")
    short = sub.short_denominator.astype(bool).to_numpy() if mark_short and "short_denominator" in sub \
        else np.zeros(len(sub), dtype=bool)
    ax.set_yticks(y, [model_label(m) + (" *" if s else "") for m, s in zip(sub.model, short, strict=True)])
    ax.set_ylim(-0.7, len(sub) - 0.3)
    ax.set_title(title)
    return sub


def expansion_pairs_axis(ax, pairs: list[tuple[int, int]]) -> None:
    """x: every pair of expansions (E_a–E_b); y: Kendall tau between model orders in [-1, 1], 0 marked."""
    ax.axhline(0, color="0.4", lw=0.8)
    ax.set_ylim(-1.05, 1.05)
    ax.set_xticks(range(len(pairs)), [f"{a}–{b}" for a, b in pairs], rotation=30)
    ax.set_xlabel("Pair of expansions (E_a–E_b)")
    ax.set_ylabel("Kendall τ between model orders")
