"""Intervene (docs/protocol.md §12.4): find a rank-p provenance component on train only and remove it.

The (standardized) embedding is whitened with the train covariance pooled within the classes of y
(eigenvalues floored at a small fraction of the mean, so near-null directions do not explode): the
diagnosis' own spread does not enter, so projecting off a provenance direction does not also regress the
diagnosis on provenance. Within each class of y, a linear probe of u is fitted on the whitened train records
- target-conditional, so the direction separates provenance at fixed diagnosis instead of following the
diagnosis - and U is the top-p right singular subspace of the stacked probe weights. Removal is the
orthogonal projection off U in whitened space, mapped back: x' = x - (x - mu) W U U^T W^-1. Heads are not
refitted.

Random controls: rank-p subspaces of the whitened space drawn at random (Q = orth(Lambda^g G), G Gaussian,
Lambda the eigenvalues of the removal's energy form) with the tilt g solved by bisection so that each removes
the same energy as U: the mean squared norm of what is taken from a train record, with the y-class means taken
out as in the whitening (the diagnosis' own spread is not provenance energy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raybench.analysis.provenance_audit.probes import fit_logistic

EIG_FLOOR = 1e-3  # eigenvalues below this fraction of the mean are raised to it


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
class EnergyForm:
    """Removed energy of an orthonormal basis Q (whitened space): mean_i ||z_i Q Q^T W^-1||^2
    = tr(Q^T C Q Q^T M Q), C = Z^T Z / n, M = W^-1 W^-T."""

    c: np.ndarray
    m: np.ndarray

    @classmethod
    def fit(cls, z_tr: np.ndarray, wh: Whitener, groups: np.ndarray | None = None) -> EnergyForm:
        """groups: the classes of y, whose means are taken out first (the whitening's convention)."""
        z = np.asarray(z_tr, dtype=np.float64).copy()
        if groups is not None:
            for g in np.unique(groups):
                z[groups == g] -= z[groups == g].mean(0)
        return cls(z.T @ z / len(z), wh.w_inv @ wh.w_inv.T)

    def __call__(self, q: np.ndarray) -> float:
        return float(np.trace((q.T @ self.c @ q) @ (q.T @ self.m @ q)))


def matched_random_subspaces(energy: EnergyForm, target: float, p: int, r: int, rng: np.random.Generator,
                             tol: float = 1e-3) -> tuple[list[np.ndarray], np.ndarray]:
    """R random orthonormal [d, p] bases whose removed energy matches `target` (relative error per control
    returned beside them; 0 up to `tol` when the bisection bracketed the target)."""
    vals, vecs = np.linalg.eigh(energy.m)
    vals = np.maximum(vals, 1e-12)
    d = len(vals)
    out, errors = [], []
    for _ in range(r):
        g0 = vecs.T @ rng.standard_normal((d, p))

        def basis(gamma: float, g0: np.ndarray = g0) -> np.ndarray:
            q, _ = np.linalg.qr(vecs @ (vals[:, None] ** gamma * g0))
            return q

        lo, hi = -8.0, 8.0
        e_lo, e_hi = energy(basis(lo)) - target, energy(basis(hi)) - target
        if e_lo * e_hi > 0:  # not bracketed: keep the closer end
            best = lo if abs(e_lo) < abs(e_hi) else hi
            q = basis(best)
        else:
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                e_mid = energy(basis(mid)) - target
                if abs(e_mid) <= tol * max(abs(target), 1e-12):
                    break
                if (e_mid < 0) == (e_lo < 0):
                    lo, e_lo = mid, e_mid
                else:
                    hi = mid
            q = basis(mid)
        out.append(q)
        errors.append(abs(energy(q) - target) / max(abs(target), 1e-12))
    return out, np.asarray(errors)
