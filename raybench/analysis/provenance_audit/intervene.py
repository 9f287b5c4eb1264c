"""Intervene (docs/protocol.md §12.4): find a rank-p provenance component on train only and remove it.

The (standardized) embedding is whitened with the train covariance pooled within the classes of y
(eigenvalues floored at a small fraction of the mean, so near-null directions do not explode): the
diagnosis' own spread does not enter, so projecting off a provenance direction does not also regress the
diagnosis on provenance. Within each class of y, a linear probe of u is fitted on the whitened train records
- target-conditional, so the direction separates provenance at fixed diagnosis instead of following the
diagnosis - and U is the top-p right singular subspace of the stacked probe weights. Removal is the
orthogonal projection off U in whitened space, mapped back: x' = x - (x - mu) W U U^T W^-1. Heads are not
refitted.

Random controls (docs/protocol.md §12.5): rank-p orthonormal subspaces of the whitened space drawn inside the
orthogonal complement of U, so no control is the targeted direction (their largest principal cosine with U is
reported and is 0 up to rounding), each matched to U in removed energy - the mean squared whitened norm of what is
taken from a train record with the y-class means out, tr(Q^T C Q) with C the whitened within-class second
moment (the identity up to the eigenvalue floor, so the tilt is small) - by a spectral tilt Q =
orth(B V Lambda^g V^T G) of a Gaussian G within the complement B (V, Lambda: eigenvectors and eigenvalues of C
there), g solved by bisection. Energy measured in raw coordinates instead would pull the controls onto U whenever
provenance dominates the within-class variance (U is then the raw space's largest-energy direction).
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
    """Removed energy of an orthonormal basis Q of the whitened space: mean_i ||z_i Q||^2 = tr(Q^T C Q)."""

    c: np.ndarray

    @classmethod
    def fit(cls, z_tr: np.ndarray, groups: np.ndarray | None = None) -> EnergyForm:
        """groups: the classes of y, whose means are taken out first (the whitening's convention: the diagnosis'
        own spread is not energy a control should be tilted towards)."""
        z = np.asarray(z_tr, dtype=np.float64).copy()
        if groups is not None:
            for g in np.unique(groups):
                z[groups == g] -= z[groups == g].mean(0)
        return cls(z.T @ z / len(z))

    def __call__(self, q: np.ndarray) -> float:
        return float(np.trace(q.T @ self.c @ q))


def complement(u_basis: np.ndarray) -> np.ndarray:
    """An orthonormal basis [d, d - p] of the orthogonal complement of span U."""
    d, p = u_basis.shape
    full, _, _ = np.linalg.svd(u_basis, full_matrices=True)
    return full[:, p:]


def max_cosine(u_basis: np.ndarray, q: np.ndarray) -> float:
    """Largest principal cosine between span U and span Q (|cos| of the two directions when p = 1)."""
    return float(np.linalg.svd(u_basis.T @ q, compute_uv=False).max())


def matched_random_subspaces(energy: EnergyForm, u_basis: np.ndarray, r: int, rng: np.random.Generator,
                             tol: float = 1e-3) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """R random orthonormal [d, p] bases orthogonal to U whose removed energy matches U's. Returns the bases,
    the relative energy error of each (0 up to `tol` when the bisection bracketed U's energy, else the closest
    end's) and each one's largest principal cosine with U."""
    p = u_basis.shape[1]
    target = energy(u_basis)
    b = complement(u_basis)
    vals, vecs = np.linalg.eigh(b.T @ energy.c @ b)
    vals = np.maximum(vals, 1e-12)
    out, errors, cosines = [], [], []
    for _ in range(r):
        g0 = vecs.T @ rng.standard_normal((b.shape[1], p))

        def basis(gamma: float, g0: np.ndarray = g0) -> np.ndarray:
            q, _ = np.linalg.qr(vecs @ (vals[:, None] ** gamma * g0))
            return b @ q

        lo, hi = -8.0, 8.0
        e_lo, e_hi = energy(basis(lo)) - target, energy(basis(hi)) - target
        if e_lo * e_hi > 0:  # not bracketed: keep the closer end
            q = basis(lo if abs(e_lo) < abs(e_hi) else hi)
        else:
            mid = 0.0
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
        cosines.append(max_cosine(u_basis, q))
    return out, np.asarray(errors), np.asarray(cosines)
