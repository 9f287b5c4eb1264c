"""Closed-form ridge readouts of the secondary analyses (docs/protocol.md §9): sklearn's Ridge(alpha,
fit_intercept=True) on StandardScaler-transformed features, from centred and scaled Gram statistics, without
densifying a sparse code matrix; per-concept top-m ridge and a multi-target readout with alpha chosen per
target on validation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from raybench.analysis.secondary.estimators import Matrix, column_sums, gather_columns
from raybench.core.sufficient_stats import paired_corr

SCALE_TINY = 10 * np.finfo(np.float64).eps  # sklearn's StandardScaler: a std this small counts as constant


@dataclass(frozen=True)
class GramStats:
    """Train sufficient statistics of a standardized ridge: X~ = (X - mean) / scale, y centred.

    gram = X~^T X~ [p, p], cross = X~^T (y - y_mean) [p, C]. Constant columns get scale 1 (and are all
    zero after centring), as sklearn's StandardScaler does.
    """

    n: int
    mean: np.ndarray
    scale: np.ndarray
    gram: np.ndarray
    cross: np.ndarray
    y_mean: np.ndarray


def gram_stats(x: Matrix, y: np.ndarray) -> GramStats:
    """Centred, scaled Gram and cross products without densifying a sparse X."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1:
        y = y[:, None]
    n = x.shape[0]
    if n != y.shape[0] or n < 2:
        raise ValueError(f"ridge needs matching rows >= 2, got X {x.shape} and y {y.shape}")
    s1, s2 = column_sums(x)
    mean = s1 / n
    var = np.maximum(s2 / n - mean**2, 0.0)
    scale = np.sqrt(var)
    scale = np.where(scale < SCALE_TINY * np.maximum(1.0, np.abs(mean)), 1.0, scale)
    if sp.issparse(x):
        xs = sp.csr_matrix(x, dtype=np.float64)
        raw = np.asarray((xs.T @ xs).toarray())
        xty = np.asarray(xs.T @ y)
    else:
        xd = np.asarray(x, dtype=np.float64)
        raw = xd.T @ xd
        xty = xd.T @ y
    y_mean = y.mean(axis=0)
    gram = (raw - n * np.outer(mean, mean)) / np.outer(scale, scale)
    gram = 0.5 * (gram + gram.T)
    cross = (xty - n * np.outer(mean, y_mean)) / scale[:, None]
    return GramStats(n, mean, scale, gram, cross, y_mean)


def ridge_solve(stats: GramStats, alpha: float, cols: np.ndarray | None = None,
                targets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ridge (penalty alpha on standardized coefficients, free intercept) on a column subset.

    Returns (coef [p_sub, C_sub] in raw feature units, intercept [C_sub]): y_hat = X[:, cols] @ coef + intercept.
    This is sklearn's Ridge(alpha, fit_intercept=True) on StandardScaler-transformed features.
    """
    if alpha <= 0:
        raise ValueError(f"ridge alpha must be > 0, got {alpha}")
    cols = np.arange(stats.gram.shape[0]) if cols is None else np.asarray(cols, dtype=np.int64)
    tg = np.arange(stats.cross.shape[1]) if targets is None else np.asarray(targets, dtype=np.int64)
    g = stats.gram[np.ix_(cols, cols)] + alpha * np.eye(cols.size)
    w = sla.solve(g, stats.cross[np.ix_(cols, tg)], assume_a="pos")
    coef = w / stats.scale[cols, None]
    return coef, stats.y_mean[tg] - stats.mean[cols] @ coef


def ridge_fit(x: Matrix, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-alpha ridge on standardized features (train statistics) -> (coef [p, C], intercept [C])."""
    return ridge_solve(gram_stats(x, y), alpha)


def ridge_predict(x: Matrix, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    out = x @ coef if sp.issparse(x) else np.asarray(x, dtype=np.float64) @ coef
    return np.asarray(out) + intercept


def topm_ridge_test_r(stats: GramStats, ranking: np.ndarray, m: int, alpha: float, x_test: Matrix,
                      y_test: np.ndarray) -> np.ndarray:
    """Per concept c: ridge on its top-m train-ranked columns, held-out r on the test split -> [C]."""
    y_test = np.asarray(y_test, dtype=np.float64)
    out = np.zeros(y_test.shape[1])
    m = min(m, ranking.shape[0])
    for c in range(y_test.shape[1]):
        cols = ranking[:m, c]
        coef, icpt = ridge_solve(stats, alpha, cols, np.array([c]))
        pred = gather_columns(x_test, cols) @ coef[:, 0] + icpt[0]
        out[c] = paired_corr(pred[:, None], y_test[:, c:c + 1])[0]
    return out


@dataclass(frozen=True)
class Readout:
    """Multi-target linear readout y_hat = x @ coef + intercept, alpha chosen per target on validation."""

    coef: np.ndarray  # [d, C]
    intercept: np.ndarray  # [C]
    alpha: np.ndarray  # [C]
    val_r: np.ndarray  # [C]


def ridge_readout(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                  alphas: Sequence[float]) -> Readout:
    """Ridge path over `alphas` from one eigendecomposition; per target keep the alpha with the best val |r|."""
    alphas = np.asarray(tuple(alphas), dtype=np.float64)
    if alphas.size == 0 or np.any(alphas <= 0):
        raise ValueError(f"readout alphas must be positive, got {alphas.tolist()}")
    st = gram_stats(x_train, y_train)
    lam, vec = np.linalg.eigh(st.gram)
    lam = np.maximum(lam, 0.0)
    proj = vec.T @ st.cross
    xv = (np.asarray(x_val, dtype=np.float64) - st.mean) / st.scale
    c = st.cross.shape[1]
    best = np.full(c, -np.inf)
    w_best = np.zeros_like(st.cross)
    a_best = np.zeros(c)
    for a in alphas:
        w = vec @ (proj / (lam[:, None] + a))
        score = np.abs(paired_corr(xv @ w, np.asarray(y_val, dtype=np.float64)))
        better = score > best
        best[better], w_best[:, better], a_best[better] = score[better], w[:, better], a
    coef = w_best / st.scale[:, None]
    return Readout(coef, st.y_mean - st.mean @ coef, a_best, best)
