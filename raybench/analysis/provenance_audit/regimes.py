"""Stress regimes by odds ratio (docs/protocol.md §12.3): the held-out (y, u) joint with both marginals fixed and
the y-u association set to kappa^e, kappa the natural (train) odds ratio and e in (1, 1/2, 0, -1/2, -1).

For a 2 x K table every local odds ratio of the train joint is raised to the power e: the seed p_train^e has
exactly those odds ratios, and iterative proportional fitting (IPF) to the held-out marginals rescales rows and
columns, which leaves odds ratios unchanged. e = 0 gives independence, e = -1 the reversed association
(PhysioTRACE, Table 15: aligned kappa, sqrt(kappa), independent, 1/sqrt(kappa), reversed 1/kappa). A held-out
record's weight in a regime is its cell's regime mass over its cell's observed mass.
"""

from __future__ import annotations

import numpy as np

IPF_TOL = 1e-13  # largest marginal error IPF stops at
IPF_MAX_ITER = 10_000


class RegimeError(ValueError):
    """A regime cannot be built (an empty cell, marginals that do not sum to one)."""


def joint(y: np.ndarray, u: np.ndarray, k: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Joint distribution [2, k] of binary y and u in 0..k-1 (weighted)."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    table = np.zeros((2, k))
    np.add.at(table, (np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)), w)
    return table / max(table.sum(), 1e-300)


def cell_counts(y: np.ndarray, u: np.ndarray, k: int) -> np.ndarray:
    """Records per (y, u) cell [2, k]."""
    table = np.zeros((2, k), dtype=np.int64)
    np.add.at(table, (np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)), 1)
    return table


def odds_ratio(p: np.ndarray, j: int = 1, ref: int = 0) -> float:
    """Odds ratio of y = 1 between u = j and u = ref: p[1, j] p[0, ref] / (p[0, j] p[1, ref])."""
    return float(p[1, j] * p[0, ref] / (p[0, j] * p[1, ref]))


def ipf(seed: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Rescale the rows and columns of a positive seed until its marginals are `rows` and `cols` (each summing
    to one); the seed's odds ratios are kept."""
    seed, rows, cols = (np.asarray(a, dtype=np.float64) for a in (seed, rows, cols))
    if not np.all(np.isfinite(seed)) or np.any(seed <= 0):
        raise RegimeError("the IPF seed needs every cell positive and finite (an empty (y, u) cell has no odds "
                          "ratio)")
    if abs(rows.sum() - 1) > 1e-9 or abs(cols.sum() - 1) > 1e-9:
        raise RegimeError(f"marginals must sum to one, got {rows.sum()} and {cols.sum()}")
    q = seed / seed.sum()
    for _ in range(IPF_MAX_ITER):
        q *= (rows / q.sum(1))[:, None]
        q *= (cols / q.sum(0))[None, :]
        if np.abs(q.sum(1) - rows).max() < IPF_TOL:
            return q
    raise RegimeError("IPF did not converge")  # pragma: no cover - positive 2 x K seeds always converge


def regime_joint(p_natural: np.ndarray, p_target: np.ndarray, e: float) -> np.ndarray:
    """The joint with p_target's marginals and the odds ratios of p_natural raised to the power e."""
    p_natural = np.asarray(p_natural, dtype=np.float64)
    if np.any(p_natural <= 0):
        raise RegimeError("the natural joint has an empty (y, u) cell: its odds ratio is undefined")
    return ipf(p_natural ** e, p_target.sum(1), p_target.sum(0))


def regime_ratios(p_natural: np.ndarray, p_obs: np.ndarray, exponents: tuple[float, ...]) -> np.ndarray:
    """Per regime, the cell weights [R, 2, k] that turn the observed held-out joint into the regime's joint."""
    if np.any(p_obs <= 0):
        raise RegimeError("the held-out joint has an empty (y, u) cell: it cannot be reweighted")
    return np.stack([regime_joint(p_natural, p_obs, e) / p_obs for e in exponents])


def record_weights(ratios: np.ndarray, y: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Cell weights [R, 2, k] -> record weights [R, n]."""
    return ratios[:, np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)]


def cell_bootstrap(patients: np.ndarray, y: np.ndarray, u: np.ndarray, k: int, draws: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Record weights [draws, n] of a patient bootstrap stratified by (y, u) cell.

    Within each cell the patients with records there are drawn with replacement (a patient's records in that
    cell move together), then the cell's weights are rescaled to its record count, so every draw keeps the
    observed joint - and both marginals - exactly. A patient with records in two cells is drawn in each
    independently (docs/protocol.md §12.1)."""
    y, u = np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)
    _, pcode = np.unique(np.asarray(patients).astype(str), return_inverse=True)
    cell = y * k + u
    out = np.zeros((draws, len(y)))
    for c in np.unique(cell):
        idx = np.flatnonzero(cell == c)
        _, unit = np.unique(pcode[idx], return_inverse=True)
        n_units = int(unit.max()) + 1
        counts = rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=draws).astype(np.float64)
        w = counts[:, unit]
        out[:, idx] = w * (len(idx) / w.sum(1, keepdims=True))
    return out
