"""A synthetic activation model with a known dictionary, and ground-truth scores of an SAE against it
(docs/protocol.md §11.4). Pure numpy/scipy; the panel (panel.py) trains SAEs on it.

Features are unit directions in d dimensions, more of them than d (superposition). Some come in hierarchies:
a child fires only when its parent fires, and siblings exclude each other (at most one child per parent
firing). Some pairs fire together more often than chance (a Gaussian copula with correlation `rho`). Every
feature has its own firing rate (log-uniform) and a positive magnitude when it fires. Concepts are known
functions of the feature activations: one feature's firing, the OR of two features' firing, and one feature's
magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats
from scipy.optimize import linear_sum_assignment


@dataclass(frozen=True)
class SyntheticSpec:
    """Size and structure of the synthetic model."""

    d: int = 128
    """Activation width."""
    n_features: int = 192
    """True features (> d: superposition)."""
    n_records: int = 2000
    """Records drawn (split 70/15/15 into train/val/test by panel.py)."""
    n_parents: int = 8
    """Parents of hierarchies; each has `children` children that fire only with it, one at a time."""
    children: int = 3
    """Children per parent."""
    n_correlated_pairs: int = 8
    """Feature pairs whose firing is correlated (Gaussian copula)."""
    rho: float = 0.6
    """Copula correlation of a correlated pair."""
    rate_low: float = 0.01
    """Lowest firing rate (log-uniform between rate_low and rate_high)."""
    rate_high: float = 0.12
    """Highest firing rate."""
    noise: float = 0.02
    """Standard deviation of isotropic Gaussian noise added to every activation."""
    concepts_per_kind: int = 4
    """Concepts of each kind: single feature, OR of two features, continuous magnitude."""
    seed: int = 0
    """Generator seed."""


@dataclass(frozen=True)
class SyntheticData:
    x: np.ndarray  # [n, d] activations
    acts: np.ndarray  # [n, F] feature magnitudes (0 = not firing)
    dictionary: np.ndarray  # [F, d] unit rows: the true directions
    concepts: np.ndarray  # [n, C] concept values
    concept_names: tuple[str, ...]
    parent: np.ndarray  # [F] parent feature index, -1 for none


def synthetic_data(spec: SyntheticSpec) -> SyntheticData:
    """Draw the dictionary, the feature activations and the concepts of `spec`."""
    rng = np.random.default_rng(spec.seed)
    f, n = spec.n_features, spec.n_records
    dictionary = rng.normal(size=(f, spec.d))
    dictionary /= np.linalg.norm(dictionary, axis=1, keepdims=True)
    rates = np.exp(rng.uniform(np.log(spec.rate_low), np.log(spec.rate_high), size=f))
    z = rng.normal(size=(n, f))
    perm = rng.permutation(f)
    n_h = spec.n_parents * (1 + spec.children)
    if n_h + 2 * spec.n_correlated_pairs > f:
        raise ValueError(f"SyntheticSpec: {n_h} hierarchy + {2 * spec.n_correlated_pairs} paired features exceed "
                         f"n_features={f}")
    pairs = perm[n_h:n_h + 2 * spec.n_correlated_pairs].reshape(-1, 2)
    z[:, pairs[:, 1]] = spec.rho * z[:, pairs[:, 0]] + np.sqrt(1 - spec.rho ** 2) * z[:, pairs[:, 1]]
    fires = stats.norm.cdf(z) < rates  # each feature's marginal rate is its own
    parent = np.full(f, -1)
    for p in range(spec.n_parents):
        group = perm[p * (1 + spec.children):(p + 1) * (1 + spec.children)]
        par, kids = group[0], group[1:]
        parent[kids] = par
        fires[:, par] |= rng.random(n) < 0.25  # parents fire often enough for their children
        choice = rng.integers(0, spec.children + 1, size=n)  # index children: that child, children: none
        kid_fire = np.zeros((n, spec.children), dtype=bool)
        kid_fire[np.arange(n), np.minimum(choice, spec.children - 1)] = choice < spec.children
        fires[:, kids] = kid_fire & fires[:, [par]]  # only with the parent; siblings exclusive
    acts = np.where(fires, rng.uniform(0.5, 1.5, size=(n, f)), 0.0)
    x = acts @ dictionary + spec.noise * rng.normal(size=(n, spec.d))
    concepts, names = _concepts(acts, spec, rng)
    return SyntheticData(x.astype(np.float32), acts, dictionary, concepts, names, parent)


def _concepts(acts: np.ndarray, spec: SyntheticSpec, rng: np.random.Generator) -> tuple[np.ndarray, tuple[str, ...]]:
    k = spec.concepts_per_kind
    rates = (acts > 0).mean(axis=0)
    common = np.flatnonzero(rates >= 0.03)
    picks = rng.choice(common if common.size >= 4 * k else np.arange(acts.shape[1]), size=4 * k, replace=False)
    cols, names = [], []
    for i in range(k):
        a, b, c, m = picks[i], picks[k + 2 * i], picks[k + 2 * i + 1], picks[3 * k + i]
        cols += [(acts[:, a] > 0).astype(float), ((acts[:, b] > 0) | (acts[:, c] > 0)).astype(float), acts[:, m]]
        names += [f"fires_{a}", f"or_{b}_{c}", f"magnitude_{m}"]
    y = np.stack(cols, axis=1)
    y = (y - y.mean(axis=0)) / np.where(y.std(axis=0) > 0, y.std(axis=0), 1.0)  # standardized, as the manifest
    return y.astype(np.float32), tuple(names)


def truth_in_normalized_space(dictionary: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The true directions as an SAE trained on z-scored inputs sees them: D / std, rows renormalized."""
    t = dictionary / np.asarray(std, dtype=np.float64)[None, :]
    return t / np.linalg.norm(t, axis=1, keepdims=True)


def _abs_cos(decoder: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """|cos| [N, F] between decoder rows [N, d] and true rows [F, d]."""
    a = decoder / np.maximum(np.linalg.norm(decoder, axis=1, keepdims=True), 1e-12)
    b = truth / np.maximum(np.linalg.norm(truth, axis=1, keepdims=True), 1e-12)
    return np.abs(a @ b.T)


def gt_mcc(decoder: np.ndarray, truth: np.ndarray) -> float:
    """Mean matched |cos| of the one-to-one (Hungarian) matching of decoder rows [N, d] to true rows [F, d]: the mean
    over the min(N, F) matched pairs."""
    cos = _abs_cos(decoder, truth)
    rows, cols = linear_sum_assignment(cos, maximize=True)
    return float(cos[rows, cols].mean())


def gt_f1(codes_fire: np.ndarray, decoder: np.ndarray, truth: np.ndarray, feature_fire: np.ndarray) -> float:
    """Mean F1 of each latent's firing [n, N] against the firing [n, F] of the true feature its decoder row matches
    best (largest |cos|), over latents that fire at least once (0 when none does)."""
    alive = np.flatnonzero(codes_fire.any(axis=0))
    if alive.size == 0:
        return 0.0
    best = _abs_cos(decoder[alive], truth).argmax(axis=1)
    z = codes_fire[:, alive].astype(np.float64)
    t = feature_fire[:, best].astype(np.float64)
    tp = (z * t).sum(axis=0)
    denom = z.sum(axis=0) + t.sum(axis=0)
    return float(np.mean(np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1.0), 0.0)))
