"""Nulls at the level of the design's independent units (docs/protocol.md §11.3, §11.6). Pure numpy/scipy.

Snapshots are nested in training runs, and final cells of one model and seed share a (model, seed) effect across
the grid's (depth, E) points: neither a snapshot nor a cell is an independent draw, a training run (model, seed)
is. So the models are tested against the spread of their runs: each (model, seed) unit is reduced to its mean over
blocks (block means removed) and snapshots, and the models' mean square is read against the mean square between
the runs of a model, an F with (V - 1, V (S - 1)) degrees of freedom. The same F decides the SNR's null (under a
permutation of model labels over runs the SNR's denominator does not move, so its null is the F's).

Reproducibility is scored on seed pairs (a, b) of one model: pairs that share a seed share its effect, so the
pairs' spread understates a model mean's noise. Its pair-aware null is the worst case, pair value = u_a + u_b with
no pair-specific noise: with S seeds and P = S (S - 1) / 2 pairs, F_pairs / c ~ F(V - 1, V (S - 1)) exactly, where
c = 4 P (P - 1) / (S (S - 1) (S - 2)) (4 for 3 seeds); any pair-specific noise only makes the test conservative.

Rank agreement: seeds' orders are independent under no model effect; its null is exact (every combination of
orders) where that is small, Monte Carlo otherwise, and for pairs simulated from shared seed effects. The smallest
attainable p (a perfect agreement) is reported, so a rule can be one a perfect metric passes.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import combinations, permutations, product

import numpy as np
from scipy import stats

from raybench.analysis.reliability.nulls import NULL_SEED, TRIALS, _spearman_rows, p_upper

EXACT_LIMIT = 50_000
"""Largest number of order combinations (V!)^(S-1) enumerated for an exact rank-agreement null."""


def unit_means(y: np.ndarray) -> np.ndarray:
    """[..., V, S] means of each (model, seed) unit of y[..., V, B, S, T] over blocks and snapshots, block means
    removed first (depth and E effects never count)."""
    y = np.asarray(y, dtype=np.float64)
    y = y - y.mean(axis=(-4, -2, -1), keepdims=True)
    return y.mean(axis=(-3, -1))


def pair_seeds(n_pairs: int) -> int:
    """S with S (S - 1) / 2 = n_pairs (0 when no S fits)."""
    s = int(round((1 + math.sqrt(1 + 8 * n_pairs)) / 2))
    return s if s * (s - 1) // 2 == n_pairs else 0


def pair_factor(n_seeds: int) -> float:
    """c of the pair-aware F: the ratio of the pairs' model and within-model mean squares with shared seed effects
    only (3 seeds: 4)."""
    s, p = n_seeds, n_seeds * (n_seeds - 1) // 2
    return 4.0 * p * (p - 1) / (s * (s - 1) * (s - 2))


def run_level_f(y: np.ndarray, pairs: bool = False) -> tuple[np.ndarray | float, np.ndarray | float, int, int]:
    """(F, p, df1, df2) of the models against their runs on y[..., V, B, S, T]; pairs: the S axis holds all seed
    pairs of S' >= 3 seeds (pair-aware: F / c against the seeds' degrees of freedom). p = 0 when the runs of a
    model agree exactly and the models do not; nan when nothing varies."""
    m = unit_means(y)
    v, s = m.shape[-2:]
    within = ((m - m.mean(axis=-1, keepdims=True)) ** 2).sum(axis=(-2, -1)) / (v * (s - 1))
    between = s * m.mean(axis=-1).var(axis=-1, ddof=1)
    df1, df2, scale = v - 1, v * (s - 1), 1.0
    if pairs:
        seeds = pair_seeds(s)
        if seeds < 3:
            raise ValueError(f"a pair design needs all pairs of >= 3 seeds, got {s} pairs")
        df2, scale = v * (seeds - 1), pair_factor(seeds)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.where(within > 0, between / np.where(within > 0, within, 1.0), np.where(between > 0, np.inf, np.nan))
    p = np.where(np.isnan(f), np.nan, stats.f.sf(f / scale, df1, df2))
    return (float(f) if f.ndim == 0 else f), (float(p) if p.ndim == 0 else p), df1, df2


def _agreement(orders: np.ndarray) -> np.ndarray:
    """Mean Spearman rho over column pairs of orders [..., V, K]."""
    pairs = list(combinations(range(orders.shape[-1]), 2))
    return np.mean([_spearman_rows(orders[..., a], orders[..., b]) for a, b in pairs], axis=0)


@lru_cache(maxsize=64)
def rank_null(n_variants: int, n_seeds: int, trials: int = TRIALS) -> tuple[np.ndarray, bool]:
    """(sorted null draws of the cross-seed rank agreement, exact?): every combination of the seeds' orders when
    (V!)^(S-1) <= EXACT_LIMIT (seed 1's order fixed, by symmetry), else independent uniform random orders."""
    if math.factorial(n_variants) ** (n_seeds - 1) <= EXACT_LIMIT:
        perms = np.array(list(permutations(range(n_variants))), dtype=np.float64)
        combos = np.array(list(product(range(len(perms)), repeat=n_seeds - 1)))
        orders = np.concatenate([np.broadcast_to(perms[0], (len(combos), 1, n_variants)),
                                 perms[combos]], axis=1)  # [n, S, V]
        return np.sort(_agreement(np.swapaxes(orders, -1, -2))), True
    rng = np.random.default_rng([NULL_SEED, n_variants, n_seeds])
    return np.sort(_agreement(rng.random((trials, n_variants, n_seeds)))), False


@lru_cache(maxsize=64)
def pair_rank_null(n_variants: int, n_seeds: int, trials: int = TRIALS) -> np.ndarray:
    """Sorted null draws of the rank agreement between the orders of all seed pairs when pair values are sums of
    two i.i.d. seed effects (the worst case: no pair-specific noise)."""
    rng = np.random.default_rng([NULL_SEED, n_variants, n_seeds, 2])
    u = rng.normal(size=(trials, n_variants, n_seeds))
    cols = np.stack([u[..., a] + u[..., b] for a, b in combinations(range(n_seeds), 2)], axis=-1)
    return np.sort(_agreement(cols))


def rank_p(means: np.ndarray, pairs: bool = False) -> tuple[float, float]:
    """(p, smallest attainable p) of the cross-seed rank agreement of means [V, S] (columns: seeds, or all seed
    pairs when `pairs`). Exact nulls give the exact p; the smallest attainable p is the p of a perfect agreement."""
    v, s = means.shape
    rho = float(_agreement(np.asarray(means, dtype=np.float64)))
    if pairs:
        null = pair_rank_null(v, pair_seeds(s))
        return p_upper(null, rho), p_upper(null, 1.0)
    null, exact = rank_null(v, s)
    if exact:
        n_ge = null.size - np.searchsorted(null, rho - 1e-9, side="left")
        return float(n_ge / null.size), float(1.0 / null.size)
    return p_upper(null, rho), max(1.0 / (1 + null.size), float(math.factorial(v)) ** -(s - 1))
