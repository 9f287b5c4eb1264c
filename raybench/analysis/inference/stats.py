"""Statistics on bootstrap draws (docs/protocol.md §8, §9.2): CIs, ranks, paired p, BH, Kendall tau, arm comparison."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd


def percentile_ci(draws: np.ndarray, low: float = 2.5, high: float = 97.5,
                  axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap draws along `axis` (NaN draws ignored)."""
    lo, hi = np.nanpercentile(np.asarray(draws, dtype=np.float64), [low, high], axis=axis)
    return lo, hi


def _complete(draws: np.ndarray) -> np.ndarray:
    """Draws where every model has a value (a crossed draw can pick only missing cells for a model)."""
    draws = np.asarray(draws, dtype=np.float64)
    return draws[np.all(np.isfinite(draws), axis=1)]


def ranks(draws: np.ndarray) -> np.ndarray:
    """Per draw, rank of each model (1 = highest value); draws [n, M]. Tied models share their average rank.

    Draws with a missing (NaN) value are left out.
    """
    draws = _complete(draws)
    better = np.sum(draws[:, None, :] > draws[:, :, None], axis=2)
    tied = np.sum(draws[:, None, :] == draws[:, :, None], axis=2) - 1
    return 1.0 + better + 0.5 * tied


def rank1_prob(draws: np.ndarray) -> np.ndarray:
    """Probability of ranking first; a draw with t models tied at the top gives each 1/t (sums to 1)."""
    draws = _complete(draws)
    top = draws == np.max(draws, axis=1, keepdims=True)
    return np.mean(top / top.sum(axis=1, keepdims=True), axis=0)


def mean_rank(draws: np.ndarray) -> np.ndarray:
    return np.mean(ranks(draws), axis=0)


def paired_p(diff: np.ndarray) -> float:
    """Two-sided bootstrap p of a paired difference: 2 min((1+#(d<=0))/(n+1), (1+#(d>=0))/(n+1)), capped at 1."""
    diff = np.asarray(diff, dtype=np.float64)
    diff = diff[np.isfinite(diff)]
    n = diff.size
    p = 2 * min((1 + np.sum(diff <= 0)) / (n + 1), (1 + np.sum(diff >= 0)) / (n + 1))
    return float(min(1.0, p))


def benjamini_hochberg(p: Sequence[float]) -> np.ndarray:
    """BH-adjusted p-values (step-up, monotone, capped at 1); NaN entries stay NaN and are not counted."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = p[order] * m / np.arange(1, m + 1)
    adj = np.minimum.accumulate(scaled[::-1])[::-1]
    out[order] = np.minimum(adj, 1.0)
    return out


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau-b between two orderings of the same items (ties handled as in scipy.stats.kendalltau)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two equal-length vectors, got {x.shape} and {y.shape}")
    i, j = np.triu_indices(x.size, k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    s = float(np.sum(sx * sy))
    n_x, n_y = float(np.sum(sx != 0)), float(np.sum(sy != 0))
    return s / math.sqrt(n_x * n_y) if n_x > 0 and n_y > 0 else float("nan")


def rank_stability(values: pd.DataFrame) -> pd.DataFrame:
    """Kendall tau between the model orders at every pair of expansions.

    values: columns metric, model, expansion, value (one value per model and E).
    -> metric, expansion_a, expansion_b, kendall_tau (expansion_a < expansion_b), only models present at both E.
    """
    rows = []
    for metric, sub in values.groupby("metric", sort=True):
        wide = sub.pivot_table(index="model", columns="expansion", values="value", aggfunc="mean")
        es = sorted(wide.columns)
        for a in range(len(es)):
            for b in range(a + 1, len(es)):
                pair = wide[[es[a], es[b]]].dropna()
                tau = kendall_tau(pair[es[a]].to_numpy(), pair[es[b]].to_numpy()) if len(pair) >= 2 else float("nan")
                rows.append({"metric": metric, "expansion_a": int(es[a]), "expansion_b": int(es[b]),
                             "kendall_tau": tau})
    return pd.DataFrame(rows, columns=["metric", "expansion_a", "expansion_b", "kendall_tau"])


def arm_comparison(values: pd.DataFrame) -> pd.DataFrame:
    """Fixed-k/d (primary) vs fixed-k/N (sensitivity) arm at the sensitivity depth, per model and E.

    values: seed-averaged point values with columns model, expansion, metric, arm, value (one depth).
    -> model, expansion, metric, primary, sensitivity, diff (= sensitivity - primary); both arms required.
    """
    wide = values.pivot_table(index=["model", "expansion", "metric"], columns="arm", values="value", aggfunc="mean")
    for arm in ("primary", "sensitivity"):
        if arm not in wide.columns:
            wide[arm] = np.nan
    wide = wide[["primary", "sensitivity"]].dropna(how="any").reset_index()
    wide["diff"] = wide["sensitivity"] - wide["primary"]
    wide.columns.name = None
    return wide[["model", "expansion", "metric", "primary", "sensitivity", "diff"]]
