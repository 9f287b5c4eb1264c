"""Minimum reliable difference (docs/protocol.md §11.2): pure math.

|D|*_S = t(0.975, nu) * s * sqrt(2 / S) is the smallest difference between two S-seed means that a two-sided
5% t test would call real, given the per-seed standard deviation s. nu = 2S - 2 (the two-sample t test's
degrees of freedom) for S >= 2; at S = 1 that is 0, so nu must then be the degrees of freedom of the estimate
of s itself (a pooled reseed standard deviation has many).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from scipy import stats


def mrd(s: float, n_seeds: int, df: float | None = None, level: float = 0.975) -> float:
    """|D|*_S for per-seed standard deviation s; df defaults to 2S - 2 (required when S = 1)."""
    if n_seeds < 1:
        raise ValueError(f"n_seeds must be >= 1, got {n_seeds}")
    nu = 2 * n_seeds - 2 if df is None else df
    if not nu > 0:
        raise ValueError(f"MRD at S={n_seeds} needs df > 0 (2S-2 = {2 * n_seeds - 2}): pass the df of s")
    if not np.isfinite(s):
        return float("nan")
    return float(stats.t.ppf(level, nu) * s * np.sqrt(2.0 / n_seeds))


def pooled_sd(groups: Iterable[np.ndarray]) -> tuple[float, int]:
    """Pooled within-group standard deviation and its degrees of freedom (sum of n_g - 1); groups of fewer than
    two finite values add nothing. (nan, 0) when no group has two."""
    ss, df = 0.0, 0
    for g in groups:
        g = np.asarray(g, dtype=np.float64)
        g = g[np.isfinite(g)]
        if g.size >= 2:
            ss += float(((g - g.mean()) ** 2).sum()) if np.ptp(g) > 0 else 0.0  # equal values: exactly 0
            df += g.size - 1
    return (float(np.sqrt(ss / df)), df) if df else (float("nan"), 0)


def cv(s: float, mean: float) -> float:
    """Coefficient of variation s / |mean| (nan when the mean is 0)."""
    return float(s / abs(mean)) if mean != 0 and np.isfinite(mean) else float("nan")
