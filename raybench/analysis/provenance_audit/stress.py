"""Stress (docs/protocol.md §12.3): how much a fixed head for y loses when the y-u association changes.

Association levels keep both marginals fixed: with p_obs the observed joint of (y, u) and p_ind = p(y) p(u),
the joint at level a is p_a = p_ind + a (p_obs - p_ind) (a = 1 observed, 0 independent, -1 reversed; the
difference has zero row and column sums, so the marginals never move). A held-out resample at level a is
the held-out set reweighted by p_a / p_obs per (y, u) cell, the expectation of drawing records cell by cell.
Where p_a would go negative, the level is cut to the most reversed feasible one and that level is reported.

Two linear heads: the exposed head fitted on train as it is; the control head fitted on train reweighted
to p_ind (y independent of u, fixed marginals). Excess vulnerability
G = [AUC_exp(observed) - AUC_exp(reversed)] - [AUC_ctl(observed) - AUC_ctl(reversed)].
The AUROCs behind G, the heads' utility and its change are scikit-learn's roc_auc_score; the curves' levels,
the bootstrap draws and the random controls use `weighted_auroc`, its vectorized twin over weight vectors
(equal to roc_auc_score with sample weights; checked in the tests).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raybench.analysis.provenance_audit.probes import Probe, fit_logistic, nll


def joint(y: np.ndarray, u: np.ndarray, k: int, weights: np.ndarray | None = None) -> np.ndarray:
    """Joint distribution [2, k] of binary y and u in 0..k-1 (weighted)."""
    w = np.ones(len(y)) if weights is None else np.asarray(weights, dtype=np.float64)
    table = np.zeros((2, k))
    np.add.at(table, (np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)), w)
    return table / max(table.sum(), 1e-300)


def independent(p: np.ndarray) -> np.ndarray:
    return np.outer(p.sum(1), p.sum(0))


def feasible_level(p: np.ndarray, a: float) -> float:
    """The level closest to `a` (towards 0) at which p_ind + level (p - p_ind) has no negative cell."""
    ind = independent(p)
    diff = p - ind
    if a >= 0:
        with np.errstate(divide="ignore", invalid="ignore"):
            cap = np.where(diff < 0, ind / -diff, np.inf).min()
        return float(min(a, cap))
    with np.errstate(divide="ignore", invalid="ignore"):
        cap = np.where(diff > 0, ind / diff, np.inf).min()
    return float(max(a, -cap))


def level_joint(p: np.ndarray, a: float) -> np.ndarray:
    ind = independent(p)
    return np.clip(ind + a * (p - ind), 0.0, None)


def level_weights(y: np.ndarray, u: np.ndarray, k: int, a: float, base: np.ndarray | None = None) -> np.ndarray:
    """Record weights that turn the (base-weighted) sample's joint into its level-a joint: base * p_a / p_obs."""
    base = np.ones(len(y)) if base is None else np.asarray(base, dtype=np.float64)
    p = joint(y, u, k, base)
    ratio = np.divide(level_joint(p, a), p, out=np.zeros_like(p), where=p > 0)
    return base * ratio[np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)]


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
              u_val: np.ndarray, k: int, c_grid: tuple[float, ...]) -> Heads:
    """Exposed head (train as it is) and control head (train reweighted to y independent of u); each keeps the
    C with the lowest validation cross-entropy under its own training distribution (observed, independent)."""
    w_ind_tr = level_weights(y_tr, u_tr, k, 0.0)
    w_ind_tr = w_ind_tr * len(w_ind_tr) / w_ind_tr.sum()
    w_ind_val = level_weights(y_val, u_val, k, 0.0)
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


def curve(scores: tuple[np.ndarray, np.ndarray], y: np.ndarray, u: np.ndarray, k: int,
          levels: tuple[float, ...]) -> list[dict[str, float]]:
    """Point AUROC of both heads at every association level (feasible level reported beside the asked one); one
    vectorized pass per head over the levels' weights."""
    p = joint(y, u, k)
    used = [feasible_level(p, a) for a in levels]
    w = np.vstack([level_weights(y, u, k, lvl) for lvl in used])
    exposed, control = weighted_auroc(scores[0], y, w), weighted_auroc(scores[1], y, w)
    return [{"level": float(a), "level_used": lvl, "auroc_exposed": float(e), "auroc_control": float(c)}
            for a, lvl, e, c in zip(levels, used, exposed, control, strict=True)]


def g_point(scores: tuple[np.ndarray, np.ndarray], y: np.ndarray, u: np.ndarray, k: int) -> float:
    """G from point AUROCs (observed vs the most reversed feasible level)."""
    p = joint(y, u, k)
    w_obs = np.ones(len(y))
    w_rev = level_weights(y, u, k, feasible_level(p, -1.0))
    drop = [auroc(s, y, w_obs) - auroc(s, y, w_rev) for s in scores]
    return float(drop[0] - drop[1])


def draw_weights(y: np.ndarray, u: np.ndarray, k: int, base: np.ndarray, a: float) -> np.ndarray:
    """Level-a weights within each bootstrap draw (rows of base [B, n]): each draw's own joint sets p_obs."""
    out = np.empty_like(base)
    yi, ui = np.asarray(y, dtype=np.int64), np.asarray(u, dtype=np.int64)
    for b in range(base.shape[0]):
        p = joint(yi, ui, k, base[b])
        lvl = feasible_level(p, a)
        ratio = np.divide(level_joint(p, lvl), p, out=np.zeros_like(p), where=p > 0)
        out[b] = base[b] * ratio[yi, ui]
    return out


def g_draws(scores: tuple[np.ndarray, np.ndarray], y: np.ndarray, u: np.ndarray, k: int,
            base: np.ndarray) -> np.ndarray:
    """G per patient-bootstrap draw (base: record weights [B, n] from the patient multiplicities)."""
    w_rev = draw_weights(y, u, k, base, -1.0)
    drops = [weighted_auroc(s, y, base) - weighted_auroc(s, y, w_rev) for s in scores]
    return drops[0] - drops[1]
