"""The audit's statistics and their Monte-Carlo nulls (docs/protocol.md §11.3, §11.6): pure numpy.

Every discriminability statistic is read against its distribution under i.i.d. noise on the same design, so a
threshold means the same thing on a 4 x 3 x 9 panel as on a 6 x 25 x 3 grid. Nulls are simulated once per shape
(cached) with a fixed seed; a p-value is (1 + #null >= observed) / (1 + trials).

Designs are arrays y[V, B, S, T]: V variants (the models being ranked), B blocks (sampled (depth, E) points; their
means are removed, so block effects never count as signal), S training seeds, T snapshots (1 for final cells).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations

import numpy as np

TRIALS = 20000
NULL_SEED = 20240611
P_PASS = 0.001
"""Above the null's 99.9% point: reliable evidence (the paper's Appendix S.1 reading of share > 0.20)."""
P_WEAK = 0.02
"""Above the null's 98% point: weak evidence."""


@dataclass(frozen=True)
class Shares:
    variant: float
    block: float
    seed: float
    snapshot: float


def _components(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(V_variant, V_block, V_seed, V_snapshot) over the last four axes [V, B, S, T] of y (leading axes: batch)."""
    y = y - y.mean(axis=(-4, -2, -1), keepdims=True)  # block means out
    cell = y.mean(axis=-1)  # [.., V, B, S]
    vb = cell.mean(axis=-1)  # [.., V, B]
    v = vb.mean(axis=-1)  # [.., V]
    var_v = v.var(axis=-1, ddof=1)
    var_b = vb.var(axis=-1, ddof=1).mean(axis=-1) if y.shape[-3] > 1 else np.zeros_like(var_v)
    var_s = cell.var(axis=-1, ddof=1).mean(axis=(-2, -1))
    var_t = y.var(axis=-1, ddof=1).mean(axis=(-3, -2, -1)) if y.shape[-1] > 1 else np.zeros_like(var_v)
    return var_v, var_b, var_s, var_t


def check_design(y: np.ndarray) -> None:
    if y.ndim != 4 or y.shape[0] < 2 or y.shape[2] < 2 or not np.all(np.isfinite(y)):
        raise ValueError(f"a design needs finite y[V >= 2, B, S >= 2, T], got shape {y.shape}")


def variance_shares(y: np.ndarray) -> Shares:
    """Shares of between-variant, variant x block, between-seed-within-variant and between-snapshot-within-run
    variance: each component a mean of ddof-1 sample variances, over their sum (paper Appendix S.1)."""
    y = np.asarray(y, dtype=np.float64)
    check_design(y)
    comps = [float(c) for c in _components(y)]
    total = sum(comps)
    if total <= 0:
        return Shares(float("nan"), float("nan"), float("nan"), float("nan"))
    return Shares(*(c / total for c in comps))


def _batched(shape: tuple[int, ...], trials: int, stat, seed: int = NULL_SEED, chunk_values: int = 4_000_000):
    rng = np.random.default_rng([seed, *shape])
    per = max(1, chunk_values // max(1, math.prod(shape)))
    out = []
    for start in range(0, trials, per):
        out.append(stat(rng.normal(size=(min(per, trials - start), *shape))))
    return np.concatenate(out)


@lru_cache(maxsize=64)
def share_null(shape: tuple[int, int, int, int], trials: int = TRIALS) -> np.ndarray:
    """Sorted null draws of the variant share on design `shape` under i.i.d. normal noise."""
    def stat(y):
        v, b, s, t = _components(y)
        return v / (v + b + s + t)
    return np.sort(_batched(tuple(shape), trials, stat))


def p_upper(null: np.ndarray, observed: float) -> float:
    """(1 + #null >= observed) / (1 + n): the Monte-Carlo p-value of a large observed statistic (null sorted)."""
    if not math.isfinite(observed):
        return float("nan")
    n_ge = null.size - np.searchsorted(null, observed - 1e-12, side="left")
    return float((1 + n_ge) / (1 + null.size))


def p_lower(null: np.ndarray, observed: float) -> float:
    """(1 + #null <= observed) / (1 + n) (null sorted)."""
    if not math.isfinite(observed):
        return float("nan")
    n_le = np.searchsorted(null, observed + 1e-12, side="right")
    return float((1 + n_le) / (1 + null.size))


def null_points(null: np.ndarray) -> tuple[float, float]:
    """The null's 98% and 99.9% points (the weak and pass thresholds)."""
    return float(np.quantile(null, 1 - P_WEAK)), float(np.quantile(null, 1 - P_PASS))


def _detrended_ss(y: np.ndarray, steps: np.ndarray, degree: int = 2) -> tuple[np.ndarray, int]:
    """Residual sum of squares of a degree-`degree` polynomial in the step, per run (last axis), and its df."""
    x = (steps - steps.mean()) / (np.ptp(steps) or 1.0)
    basis = np.vander(x, degree + 1)
    proj = basis @ np.linalg.pinv(basis)  # hat matrix [T, T]
    res = y - y @ proj.T
    return (res ** 2).sum(axis=-1), y.shape[-1] - (degree + 1)


def snr(y: np.ndarray, steps: np.ndarray) -> np.ndarray | float:
    """Signal-to-noise ratio of y[..., V, B, S, T]: sd across variants of the variant means (block means removed)
    over the pooled sd of the within-run residuals after a degree-2 polynomial fit in the step (paper Appendix Q)."""
    y = np.asarray(y, dtype=np.float64)
    steps = np.asarray(steps, dtype=np.float64)
    if y.shape[-1] != steps.size or steps.size < 4:
        raise ValueError(f"SNR needs >= 4 snapshots (a degree-2 fit leaves T - 3 df), got {steps.size}")
    yc = y - y.mean(axis=(-4, -2, -1), keepdims=True)
    between = yc.mean(axis=(-3, -2, -1)).std(axis=-1, ddof=1)
    ss, df = _detrended_ss(y, steps)
    runs = math.prod(y.shape[-4:-1])
    pooled = np.sqrt(ss.sum(axis=(-3, -2, -1)) / (df * runs))
    out = np.where(pooled > 0, between / np.where(pooled > 0, pooled, 1.0), np.nan)
    return float(out) if out.ndim == 0 else out


@lru_cache(maxsize=64)
def snr_null(shape: tuple[int, int, int, int], trials: int = TRIALS) -> np.ndarray:
    """Sorted null draws of the SNR on `shape` (evenly spaced steps; the fit's residuals do not depend on them)."""
    steps = np.arange(shape[-1], dtype=np.float64)
    return np.sort(_batched(tuple(shape), trials, lambda y: snr(y, steps)))


def distinct_winners(means: np.ndarray) -> int:
    """Distinct best variants across seeds: means [V, S] (higher is better)."""
    return int(np.unique(np.argmax(np.asarray(means, dtype=np.float64), axis=0)).size)


def winners_null_pmf(n_variants: int, n_seeds: int) -> np.ndarray:
    """P(D = d), d = 0..n_seeds, when each seed crowns a uniformly random variant (exact: surjections counted by
    Stirling numbers of the second kind)."""
    stirling = np.zeros((n_seeds + 1, n_seeds + 1))
    stirling[0, 0] = 1.0
    for n in range(1, n_seeds + 1):
        for k in range(1, n + 1):
            stirling[n, k] = k * stirling[n - 1, k] + stirling[n - 1, k - 1]
    pmf = np.array([math.perm(n_variants, d) * stirling[n_seeds, d] for d in range(n_seeds + 1)], dtype=np.float64)
    return pmf / float(n_variants) ** n_seeds


def _ranks(a: np.ndarray) -> np.ndarray:
    """Average ranks along the last axis (ties share their mean rank, as scipy.stats.rankdata)."""
    from scipy.stats import rankdata

    return rankdata(a, axis=-1)


def _spearman_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ra, rb = _ranks(a), _ranks(b)
    ra = ra - ra.mean(axis=-1, keepdims=True)
    rb = rb - rb.mean(axis=-1, keepdims=True)
    den = np.sqrt((ra ** 2).sum(axis=-1) * (rb ** 2).sum(axis=-1))
    return np.where(den > 0, (ra * rb).sum(axis=-1) / np.where(den > 0, den, 1.0), 0.0)


def rank_agreement(means: np.ndarray) -> float:
    """Mean Spearman rho between every two seeds' orders of the variants: means [V, S] (paper Appendix S.3)."""
    m = np.asarray(means, dtype=np.float64)
    pairs = list(combinations(range(m.shape[1]), 2))
    if m.shape[0] < 3 or not pairs:
        return float("nan")
    return float(np.mean([_spearman_rows(m[:, a], m[:, b]) for a, b in pairs]))


@lru_cache(maxsize=64)
def rank_agreement_null(n_variants: int, n_seeds: int, trials: int = TRIALS) -> np.ndarray:
    """Sorted null draws of rank_agreement when every seed's order is an independent uniform permutation."""
    rng = np.random.default_rng([NULL_SEED, n_variants, n_seeds])
    m = rng.random((trials, n_seeds, n_variants))
    rhos = [_spearman_rows(m[:, a], m[:, b]) for a, b in combinations(range(n_seeds), 2)]
    return np.sort(np.mean(rhos, axis=0))


def trend(series: list[np.ndarray]) -> float:
    """Mean Spearman rho of each series (values in step order, higher is better) with its step; a constant series
    counts 0."""
    rhos = [_spearman_rows(np.arange(s.size, dtype=np.float64), np.asarray(s, dtype=np.float64)) for s in series]
    return float(np.mean(rhos)) if rhos else float("nan")


@lru_cache(maxsize=64)
def trend_null(n_series: int, length: int, trials: int = TRIALS) -> np.ndarray:
    """Sorted null draws of `trend` for n_series series of `length` snapshots in random order."""
    rng = np.random.default_rng([NULL_SEED, n_series, length])
    vals = rng.random((trials, n_series, length))
    steps = np.broadcast_to(np.arange(length, dtype=np.float64), vals.shape)
    return np.sort(_spearman_rows(steps, vals).mean(axis=-1))


def spearman_p_one_sided(rho: float, n: int) -> float:
    """P(rho' >= rho) under no association, by the t approximation scipy's spearmanr uses (n - 2 df)."""
    from scipy import stats

    if not math.isfinite(rho) or n < 3:
        return float("nan")
    if rho >= 1.0:
        return 0.0
    if rho <= -1.0:
        return 1.0
    t = rho * math.sqrt((n - 2) / (1 - rho * rho))
    return float(stats.t.sf(t, n - 2))
