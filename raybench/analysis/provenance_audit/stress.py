"""Stress (docs/protocol.md §12.3): how much a fixed head for y loses when only the y-u association changes.

The regimes (regimes.py) keep both held-out marginals and set the y-u odds ratio to kappa^e (kappa the train
split's natural odds ratio; e = 1 aligned, 0 independent, -1 reversed). Two linear heads: the exposed head fitted
on train as it is; the control head fitted on train reweighted to independence (same marginals). Excess
vulnerability G = [AUC_exp(aligned) - AUC_exp(reversed)] - [AUC_ctl(aligned) - AUC_ctl(reversed)]
(PhysioTRACE Table 15: ECGFounder 0.943 - 0.878 - (0.936 - 0.895) = 0.024, Table 1: 0.023).
AUROCs under record weights come from `weighted_auroc`, the vectorized twin of scikit-learn's roc_auc_score with
sample weights (checked in the tests), so every bootstrap draw and regime is one pass.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit.probes import Probe, fit_logistic, nll


def weighted_auroc(scores: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC of fixed scores under many weight vectors at once: weights [B, n] -> [B] (ties count one half).

    Equals roc_auc_score(y, scores, sample_weight=w) for every row w with both classes weighted."""
    weights = np.atleast_2d(np.asarray(weights, dtype=np.float64))
    order = np.argsort(scores, kind="stable")
    s, yy, w = np.asarray(scores)[order], np.asarray(y)[order].astype(bool), weights[:, order]
    _, group = np.unique(s, return_inverse=True)
    n_groups = int(group.max()) + 1 if len(group) else 0
    wneg = np.where(yy, 0.0, w)
    wpos = np.where(yy, w, 0.0)
    # per tie group: negative and positive weight; negatives strictly below each group (cumulative)
    if n_groups == len(s):  # no ties (continuous scores, the usual case): each record is its own group
        gneg, gpos = np.ascontiguousarray(wneg), np.ascontiguousarray(wpos)  # the layout (so the sums) of the tied path
    else:
        gneg = np.zeros((w.shape[0], n_groups))
        gpos = np.zeros((w.shape[0], n_groups))
        for arr, out in ((wneg, gneg), (wpos, gpos)):
            np.add.at(out.T, group, arr.T)
    below = np.cumsum(gneg, axis=1) - gneg
    num = (gpos * (below + 0.5 * gneg)).sum(1)
    den = gpos.sum(1) * gneg.sum(1)
    return np.divide(num, den, out=np.full(len(num), np.nan), where=den > 0)


def auroc(scores: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Point AUROC (scikit-learn); NaN when a class has no weight."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w[y == 1].sum() <= 0 or w[y == 0].sum() <= 0:
        return float("nan")
    return float(roc_auc_score(y, scores, sample_weight=w))


@dataclass(frozen=True)
class Heads:
    exposed: Probe
    control: Probe

    def scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return _score(self.exposed, x), _score(self.control, x)


def _score(head: Probe, x: np.ndarray) -> np.ndarray:
    return (x @ head.coef.T + head.intercept)[:, 0]


def fit_heads(x_tr: np.ndarray, y_tr: np.ndarray, u_tr: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
              u_val: np.ndarray, k: int, c_grid: tuple[float, ...], gs: np.ndarray | None = None) -> Heads:
    """Exposed head (train as it is) and control head (train reweighted to y independent of u, within each
    stratum when gs gives the groups' strata); each keeps the C with the lowest validation cross-entropy under its
    own training distribution (observed, independent)."""
    w_ind_tr = independence_weights(y_tr, u_tr, k, gs)
    w_ind_val = independence_weights(y_val, u_val, k, gs)
    heads = []
    for w_tr, w_val in ((None, None), (w_ind_tr, w_ind_val)):
        best: tuple[float, Probe] | None = None
        for c in c_grid:
            head = fit_logistic(x_tr, y_tr, c, sample_weight=w_tr)
            loss = float(np.average(nll(head.log_proba(x_val), y_val), weights=w_val))
            if best is None or loss < best[0] - 1e-12:
                best = (loss, head)
        assert best is not None
        heads.append(best[1])
    return Heads(*heads)


def independence_weights(y: np.ndarray, u: np.ndarray, k: int, gs: np.ndarray | None = None) -> np.ndarray:
    """Record weights (mean one) that make y independent of u with both marginals kept: p(y) p(u) / p(y, u); with
    strata (gs: the stratum of each group) within each stratum, p(y | s) p(u | s) / p(y, u | s), so the y-stratum
    association stays as observed."""
    p = rg.joint(y, u, k)
    ratio = np.zeros_like(p)
    for cols in _blocks(k, gs):
        q = p[:, cols]
        q = q / max(q.sum(), 1e-300)
        ratio[:, cols] = np.divide(np.outer(q.sum(1), q.sum(0)), q, out=np.zeros_like(q), where=q > 0)
    w = ratio[np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)]
    return w * len(w) / w.sum()


def _blocks(k: int, gs: np.ndarray | None) -> list[np.ndarray]:
    """The group columns of each stratum (one block of all k without strata)."""
    if gs is None:
        return [np.arange(k)]
    return [np.flatnonzero(gs == s) for s in np.unique(gs)]


@dataclass(frozen=True)
class Regimes:
    """The stress regimes of one held-out set: exponents e and their cell weights [R, 2, k] (regimes.py); with
    strata, each stratum's block is its own table (the y-u association changes within strata, each stratum keeps
    its held-out marginals and its mass)."""

    exponents: tuple[float, ...]
    ratios: np.ndarray
    odds: dict[tuple[int, int], float]  # natural (train) local odds ratio of each group vs its block's first
    kappa: float  # the local odds ratio furthest from 1 (k = 2: of u = 1 vs u = 0)

    @classmethod
    def build(cls, y_tr: np.ndarray, u_tr: np.ndarray, y_te: np.ndarray, u_te: np.ndarray, k: int,
              exponents: tuple[float, ...], gs: np.ndarray | None = None) -> Regimes:
        ex = tuple(dict.fromkeys((*map(float, exponents), 1.0, 0.0, -1.0)))
        p_nat, p_obs = rg.joint(y_tr, u_tr, k), rg.joint(y_te, u_te, k)
        ratios = np.ones((len(ex), 2, k))
        odds = {}
        for cols in _blocks(k, gs):
            nat, obs = p_nat[:, cols], p_obs[:, cols]
            ratios[:, :, cols] = rg.regime_ratios(nat / nat.sum(), obs / obs.sum(), ex)
            odds |= {(int(cols[j]), int(cols[0])): rg.odds_ratio(nat, j, 0) for j in range(1, len(cols))}
        kappa = max(odds.values(), key=lambda v: abs(np.log(v))) if odds else float("nan")
        return cls(ex, ratios, odds, kappa)

    def weights(self, y: np.ndarray, u: np.ndarray, e: float, base: np.ndarray | None = None) -> np.ndarray:
        """Record weights of regime e ([n], or [B, n] times a bootstrap's base weights)."""
        w = rg.record_weights(self.ratios[[self.exponents.index(float(e))]], y, u)[0]
        return w if base is None else base * w[None, :]


def curve(scores: tuple[np.ndarray, np.ndarray], y: np.ndarray, u: np.ndarray, reg: Regimes,
          exponents: tuple[float, ...]) -> list[dict[str, float]]:
    """AUROC of both heads in every regime (one vectorized pass per head)."""
    w = np.vstack([reg.weights(y, u, e) for e in exponents])
    exposed, control = weighted_auroc(scores[0], y, w), weighted_auroc(scores[1], y, w)
    return [{"level": float(e), "odds_ratio": reg.kappa ** e, "auroc_exposed": float(a), "auroc_control": float(c)}
            for e, a, c in zip(exponents, exposed, control, strict=True)]


@dataclass(frozen=True)
class StressAUROCs:
    """AUROCs [B] (or [1] for the point) of both heads in the regimes the gates and verdict read."""

    exp_aligned: np.ndarray
    exp_reversed: np.ndarray
    ctl_aligned: np.ndarray
    ctl_reversed: np.ndarray
    ctl_independent: np.ndarray
    exp_observed: np.ndarray

    @property
    def g(self) -> np.ndarray:
        return (self.exp_aligned - self.exp_reversed) - (self.ctl_aligned - self.ctl_reversed)


def stress_aurocs(scores: tuple[np.ndarray, np.ndarray], y: np.ndarray, u: np.ndarray, reg: Regimes,
                  base: np.ndarray | None = None) -> StressAUROCs:
    """AUROCs of both heads under aligned, reversed, independent and observed weights (base: bootstrap draws
    [B, n]; None: the point estimate)."""
    b = np.ones((1, len(y))) if base is None else np.atleast_2d(base)
    al, rev, ind = (reg.weights(y, u, e, b) for e in (1.0, -1.0, 0.0))
    exp = weighted_auroc(scores[0], y, np.vstack([al, rev, b]))
    ctl = weighted_auroc(scores[1], y, np.vstack([al, rev, ind]))
    n = b.shape[0]
    return StressAUROCs(exp[:n], exp[n:2 * n], ctl[:n], ctl[n:2 * n], ctl[2 * n:], exp[2 * n:])
