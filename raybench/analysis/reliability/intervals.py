"""Intervals that contain their estimate (docs/protocol.md §11.7).

A mean of |r| near zero is biased upward under resampling, so a percentile interval can miss its own point
estimate. `outside_rows` finds every such row in the finished tables (cheap). `profile_intervals` redraws the
profiles' paired patient bootstrap exactly as analyze did (same stream, seed and draws), adds a leave-one-patient-
out jackknife (one more weighted sum of the packed statistics), and reports the BCa and basic intervals next to
the published percentile one. The formulas are the standard ones (Efron 1987), as scipy.stats.bootstrap
implements them; tests compare the two.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.special import ndtr, ndtri

POINT_COLUMNS = ("auc", "value", "diff", "delta")
OUTSIDE_COLUMNS = ["table", "metric", "row", "point", "ci_low", "ci_high", "outside"]
PROFILE_COLUMNS = ["model", "metric", "auc", "ci_low", "ci_high", "outside", "bca_low", "bca_high", "basic_low",
                   "basic_high", "shifted_low", "shifted_high", "bias_draws", "ci_mc_sd"]


def bca_interval(draws: np.ndarray, point: np.ndarray, jack: np.ndarray, low: float = 2.5,
                 high: float = 97.5) -> tuple[np.ndarray, np.ndarray]:
    """BCa interval per column: draws [B, K], point [K], jackknife values [n, K]; low/high in percent."""
    draws, point, jack = (np.asarray(a, dtype=np.float64) for a in (draws, point, jack))
    frac = np.mean(draws < point[None, :], axis=0)
    z0 = ndtri(np.where((frac > 0) & (frac < 1), frac, np.nan))  # every draw on one side: BCa is undefined
    dev = jack.mean(axis=0, keepdims=True) - jack
    num, den = (dev ** 3).sum(axis=0), 6.0 * ((dev ** 2).sum(axis=0)) ** 1.5
    a = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    out = []
    for pct in (low, high):
        z = ndtri(pct / 100.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            alpha = ndtr(z0 + (z0 + z) / (1.0 - a * (z0 + z)))
        out.append(np.array([np.percentile(draws[:, k], 100.0 * alpha[k]) if np.isfinite(alpha[k]) else np.nan
                             for k in range(draws.shape[1])]))
    return out[0], out[1]


def basic_interval(draws: np.ndarray, point: np.ndarray, low: float = 2.5,
                   high: float = 97.5) -> tuple[np.ndarray, np.ndarray]:
    """Basic (reverse percentile) interval: (2 point - q_high, 2 point - q_low)."""
    q_lo, q_hi = np.percentile(np.asarray(draws, dtype=np.float64), [low, high], axis=0)
    return 2 * point - q_hi, 2 * point - q_lo


def shifted_interval(draws: np.ndarray, point: np.ndarray, low: float = 2.5,
                     high: float = 97.5) -> tuple[np.ndarray, np.ndarray]:
    """Bias-corrected percentile interval: the percentile ends minus the bootstrap bias mean(draws) - point."""
    draws = np.asarray(draws, dtype=np.float64)
    q_lo, q_hi = np.percentile(draws, [low, high], axis=0)
    bias = draws.mean(axis=0) - point
    return q_lo - bias, q_hi - bias


def quantile_mc_sd(draws: np.ndarray, pct: float) -> np.ndarray:
    """Monte Carlo sd of a percentile end from B draws (what another bootstrap seed would move it by):
    sqrt(p(1-p)/B) / f(x_p), the density f from a finite difference of the draws' own quantiles."""
    draws = np.asarray(draws, dtype=np.float64)
    b, p = draws.shape[0], pct / 100.0
    h = max(np.sqrt(p * (1 - p) / b), 1.0 / b)
    lo, hi = np.percentile(draws, [100 * max(p - h, 0.0), 100 * min(p + h, 1.0)], axis=0)
    return (hi - lo) / (2 * h) * np.sqrt(p * (1 - p) / b)


def outside_rows(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Every row of a finished table whose point estimate lies outside its own [ci_low, ci_high]."""
    rows = []
    for name, df in sorted(tables.items()):
        if name.startswith("reliability") or not {"ci_low", "ci_high"} <= set(df.columns):
            continue
        point = next((c for c in POINT_COLUMNS if c in df.columns), None)
        if point is None:
            continue
        keys = [c for c in df.columns if df[c].dtype == object or str(df[c].dtype).startswith("str")
                or c in ("q", "expansion")][:4]
        p, lo, hi = (df[c].to_numpy(float) for c in (point, "ci_low", "ci_high"))
        out = np.isfinite(p) & np.isfinite(lo) & np.isfinite(hi) & ((p < lo - 1e-12) | (p > hi + 1e-12))
        for i in np.flatnonzero(out):
            label = " ".join(f"{k}={df[k].iloc[i]}" for k in keys)
            rows.append((name, _metric_of(name, df, i), label, p[i], lo[i], hi[i], True))
    return pd.DataFrame(rows, columns=OUTSIDE_COLUMNS)


def _metric_of(table: str, df: pd.DataFrame, i: int) -> str:
    """The audited metric a table row is about (reproducibility and dead-fraction tables name it in the table)."""
    if "metric" in df.columns:
        return str(df["metric"].iloc[i])
    for metric in ("reproducibility", "dead_fraction"):
        if table.startswith(metric):
            return metric
    return ""


def profile_intervals(root, protocol, num_workers: int | None = None) -> pd.DataFrame:
    """The profiles' percentile, BCa, basic and bias-shifted intervals from the analysis' own bootstrap draws, the
    bootstrap bias and the Monte Carlo sd of the percentile ends (the bootstrap stream's reseed noise)."""
    from raybench.analysis.inference import stats as st
    from raybench.analysis.inference.bootstrap import patient_bootstrap
    from raybench.analysis.inference.packed_stats import METRIC_NAMES, load_packed_stats
    from raybench.analysis.inference.summary_weights import depth_auc_weights, profile_weights
    from raybench.analysis.run_inputs import read_cells, read_concepts, rounded_q, select_ok
    from raybench.core.paths import RunLayout

    layout = RunLayout.at(root)
    inf, ev = protocol.inference, protocol.eval
    ok, _ = select_ok(read_cells(layout), protocol)
    concepts = read_concepts(layout, ok)
    stats = load_packed_stats([layout.root / str(c) / "patient_stats.npz" for c in ok.cell_dir], list(ok.cell_id),
                              len(concepts), ev.coverage_threshold, dtype=np.dtype(inf.gemm_dtype).type)
    draws = patient_bootstrap(stats, inf.patient_draws, inf.seed, inf.chunk_draws,
                              num_workers, stream=inf.stream)
    models = [m for m in protocol.grid.models if m in set(ok.model)]
    expansions = [int(e) for e in protocol.grid.expansions]
    depths = sorted(rounded_q(q) for q in protocol.grid.depths)
    w_prof, models = profile_weights(depth_auc_weights(ok, "primary", models, expansions, depths), models)
    point = stats.point.T @ w_prof  # [3, M]
    prof_draws = np.einsum("dck,cm->kdm", draws, w_prof)
    jack = _jackknife(stats)
    rows = []
    for k, metric in enumerate(METRIC_NAMES):
        lo, hi = st.percentile_ci(prof_draws[k], inf.ci_low, inf.ci_high)
        blo, bhi = bca_interval(prof_draws[k], point[k], jack[:, :, k] @ w_prof, inf.ci_low, inf.ci_high)
        rlo, rhi = basic_interval(prof_draws[k], point[k], inf.ci_low, inf.ci_high)
        slo, shi = shifted_interval(prof_draws[k], point[k], inf.ci_low, inf.ci_high)
        bias = prof_draws[k].mean(axis=0) - point[k]
        mc = np.maximum(quantile_mc_sd(prof_draws[k], inf.ci_low), quantile_mc_sd(prof_draws[k], inf.ci_high))
        for i, m in enumerate(models):
            outside = bool(point[k, i] < lo[i] - 1e-12 or point[k, i] > hi[i] + 1e-12)
            rows.append((m, metric, point[k, i], lo[i], hi[i], outside, blo[i], bhi[i], rlo[i], rhi[i], slo[i],
                         shi[i], bias[i], mc[i]))
    return pd.DataFrame(rows, columns=PROFILE_COLUMNS)


def _jackknife(stats) -> np.ndarray:
    """Leave-one-patient-out values [P_active, cells, 3]: weights 1 - e_i over the patients with records."""
    from raybench.analysis.inference.packed_stats import CONSTANT_RTOL_F32, metrics_from_weighted
    from raybench.core.sufficient_stats import CONSTANT_RTOL

    active = np.ones(stats.n_patients, bool) if stats.active is None else np.asarray(stats.active, bool)
    idx = np.flatnonzero(active)
    w = np.ones((idx.size, stats.n_patients))
    w[np.arange(idx.size), idx] = 0.0
    parts = []
    for b, sl in zip(stats.cell_blocks, stats.block_slices, strict=True):
        rtol = CONSTANT_RTOL if b.dtype == np.float64 else CONSTANT_RTOL_F32
        parts.append(metrics_from_weighted(w @ stats.y_matrix, w.astype(b.dtype) @ b, stats.cell_group[sl],
                                           stats.n_concepts, stats.threshold, rtol))
    return np.concatenate(parts, axis=1)
