"""Intervene (docs/protocol.md §12.4): find a rank-p provenance component on train only and remove it.

The (standardized) embedding is whitened with the train covariance pooled within the classes of y
(eigenvalues floored at a small fraction of the mean, so near-null directions do not explode): the
diagnosis' own spread does not enter, so projecting off a provenance direction does not also regress the
diagnosis on provenance. Within each class of y, a linear probe of u is fitted on the whitened train records
- target-conditional, so the direction separates provenance at fixed diagnosis instead of following the
diagnosis - and U is the top-p right singular subspace of the stacked probe weights. Removal is the
orthogonal projection off U in whitened space, mapped back: x' = x - (x - mu) W U U^T W^-1. Heads are not
refitted.

Random controls (docs/protocol.md §12.5): rank-p whitened projections matched to the targeted one in raw removed
variance - the mean squared norm of x - x' over the train records (standardized embedding, each record's
y-class mean out), tr[(Q^T C Q)(Q^T S Q)] with C the whitened within-class second moment and S = W^-1 W^-T the
covariance the whitening inverts. In whitened coordinates every direction removes the same energy (C is the
identity up to the eigenvalue floor), so matching there equates nothing; in raw coordinates a provenance direction
often removes more than a random one. Each control is a Gaussian draw G tilted by the spectrum of S,
Q = orth(B V Lambda^g V^T G) (V, Lambda: eigenvectors and eigenvalues of S within the space B drawn from), g found
by bisection until the raw removed variance matches U's. B is the orthogonal complement of U when a subspace there
can remove that much, else the whole space (where the control may lean on U: its principal cosine with U is
reported, a description and not evidence).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raybench.analysis.provenance_audit.probes import fit_logistic

EIG_FLOOR = 1e-3  # eigenvalues below this fraction of the mean are raised to it
GAMMA_MAX = 256.0  # the tilt's bracket: wide enough to single out a top eigenvalue barely above the next


@dataclass(frozen=True)
class Whitener:
    mean: np.ndarray  # [d]
    w: np.ndarray  # [d, d] whitening: z = (x - mean) @ w
    w_inv: np.ndarray  # [d, d]: x - mean = z @ w_inv

    @classmethod
    def fit(cls, x: np.ndarray, groups: np.ndarray | None = None) -> Whitener:
        """Whiten with the covariance of x about its group means (pooled within groups; all one group when
        None), centred at the overall mean."""
        x = np.asarray(x, dtype=np.float64)
        mean = x.mean(0)
        resid = x - mean
        if groups is not None:
            for g in np.unique(groups):
                m = groups == g
                resid[m] = x[m] - x[m].mean(0)
        cov = np.atleast_2d(resid.T @ resid / len(x))
        vals, vecs = np.linalg.eigh(cov)
        vals = np.maximum(vals, EIG_FLOOR * max(float(vals.mean()), 1e-12))
        return cls(mean, (vecs / np.sqrt(vals)) @ vecs.T, (vecs * np.sqrt(vals)) @ vecs.T)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) @ self.w


def provenance_subspace(z_tr: np.ndarray, y_tr: np.ndarray, u_tr: np.ndarray, p: int, c: float) -> np.ndarray:
    """U [d, p], orthonormal: the top-p right singular vectors of the within-y-class probe weights of u."""
    rows = []
    for cls in np.unique(y_tr):
        m = y_tr == cls
        if np.unique(u_tr[m]).size < 2:
            continue
        rows.append(fit_logistic(z_tr[m], u_tr[m], c).coef)
    if not rows:
        raise ValueError("no class of y holds two provenance groups: the provenance component is undefined")
    stacked = np.vstack(rows)
    _, _, vt = np.linalg.svd(stacked, full_matrices=True)
    return vt[:p].T


def remove(x: np.ndarray, wh: Whitener, u_basis: np.ndarray) -> np.ndarray:
    """x' = x - (x - mean) W U U^T W^-1 (the whitened projection off span U)."""
    x = np.asarray(x, dtype=np.float64)
    return x - ((wh(x) @ u_basis) @ u_basis.T) @ wh.w_inv


@dataclass(frozen=True)
class RemovedVariance:
    """Raw removed variance of the whitened projection off an orthonormal basis Q of the whitened space:
    mean_i ||x_i - x_i'||^2 = tr[(Q^T C Q)(Q^T S Q)] (the removed part of a record is z Q Q^T W^-1)."""

    c: np.ndarray  # whitened within-class second moment [d, d]
    s: np.ndarray  # W^-1 W^-T [d, d]: the raw metric of a whitened direction

    @classmethod
    def fit(cls, z_tr: np.ndarray, groups: np.ndarray | None, w_inv: np.ndarray) -> RemovedVariance:
        """groups: the classes of y, whose means are taken out first (the diagnosis' own spread is not variance a
        control should be drawn towards)."""
        z = np.asarray(z_tr, dtype=np.float64).copy()
        if groups is not None:
            for g in np.unique(groups):
                z[groups == g] -= z[groups == g].mean(0)
        return cls(z.T @ z / len(z), w_inv @ w_inv.T)

    def __call__(self, q: np.ndarray) -> float:
        return float(np.sum((q.T @ self.c @ q) * (q.T @ self.s @ q)))


def complement(u_basis: np.ndarray) -> np.ndarray:
    """An orthonormal basis [d, d - p] of the orthogonal complement of span U."""
    d, p = u_basis.shape
    full, _, _ = np.linalg.svd(u_basis, full_matrices=True)
    return full[:, p:]


def max_cosine(u_basis: np.ndarray, q: np.ndarray) -> float:
    """Largest principal cosine between span U and span Q (|cos| of the two directions when p = 1)."""
    return float(np.linalg.svd(u_basis.T @ q, compute_uv=False).max())


@dataclass(frozen=True)
class Controls:
    """Matched random controls: the bases, each one's relative mismatch in raw removed variance, its removed
    variance, its largest principal cosine with U, and whether it was drawn in U's orthogonal complement."""

    bases: list[np.ndarray]
    errors: np.ndarray
    variance: np.ndarray
    cosines: np.ndarray
    orthogonal: np.ndarray


def _tilted(form: RemovedVariance, space: np.ndarray, p: int, target: float, rng: np.random.Generator,
            tol: float) -> tuple[np.ndarray, bool]:
    """One basis of span(space) tilted towards S until its removed variance is `target`; (basis, bracketed)."""
    vals, vecs = np.linalg.eigh(space.T @ form.s @ space)
    vals = np.maximum(vals, 1e-12 * max(float(vals.max()), 1e-12))
    g0 = vecs.T @ rng.standard_normal((space.shape[1], p))

    logs = np.log(vals)

    def basis(gamma: float) -> np.ndarray:
        # Lambda^g up to a constant (<= 1, so no overflow at either end of the bracket)
        scale = np.exp(gamma * (logs - (logs.max() if gamma > 0 else logs.min())))
        q, _ = np.linalg.qr(vecs @ (scale[:, None] * g0))
        return space @ q

    lo, hi = -GAMMA_MAX, GAMMA_MAX
    e_lo, e_hi = form(basis(lo)) - target, form(basis(hi)) - target
    if e_lo * e_hi > 0:
        return basis(lo if abs(e_lo) < abs(e_hi) else hi), False
    mid = 0.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        e_mid = form(basis(mid)) - target
        if abs(e_mid) <= tol * max(abs(target), 1e-12):
            break
        if (e_mid < 0) == (e_lo < 0):
            lo, e_lo = mid, e_mid
        else:
            hi = mid
    return basis(mid), True


def matched_random_subspaces(form: RemovedVariance, u_basis: np.ndarray, r: int, rng: np.random.Generator,
                             tol: float = 1e-3) -> Controls:
    """R random orthonormal [d, p] bases whose raw removed variance matches U's: drawn in U's orthogonal
    complement when a draw there brackets it, else in the whole space."""
    p = u_basis.shape[1]
    target = form(u_basis)
    comp = complement(u_basis)
    full = np.eye(u_basis.shape[0])
    out, orth = [], []
    for _ in range(r):
        q, ok = _tilted(form, comp, p, target, rng, tol) if comp.shape[1] >= p else (None, False)
        if not ok:
            q, _ = _tilted(form, full, p, target, rng, tol)
        out.append(q)
        orth.append(ok)
    var = np.array([form(q) for q in out])
    return Controls(out, np.abs(var - target) / max(abs(target), 1e-12), var,
                    np.array([max_cosine(u_basis, q) for q in out]), np.array(orth, dtype=bool))
