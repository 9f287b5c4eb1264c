"""A synthetic activation model with a known dictionary, after SynthSAEBench (docs/protocol.md §11.4), and
ground-truth scores of an SAE against it. Pure numpy/scipy; the panel (panel.py) trains SAEs on it.

F unit directions in d < F dimensions (superposition). Feature i's base firing rate follows a Zipf law in its
index (earlier features fire more). Some features form disjoint trees of depth `depth` and branching
`branching`: a child fires only when its parent fires, at most one child of a parent fires (siblings exclude
each other), chosen in proportion to the children's base rates. Roots and features outside trees fire
independently, except correlated pairs (a Gaussian copula). A firing feature's magnitude is a rectified Gaussian
ReLU(mu_i + sigma_i eps), so a firing feature can have magnitude 0 (it then counts as not firing). x = c D + b +
noise. An SAE of width N is expected to learn the N most frequent features (paper §5.2): those N by true
firing rate are "in-SAE", the rest "out-of-SAE". The paper's model keeps its Zipf order, so its first N indices are
the most frequent; here the hierarchy breaks that order (a child fires only with its parent), so the rate decides.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import stats
from scipy.optimize import linear_sum_assignment

from raybench.core.analysis_config import PANEL_VARIANTS


@dataclass(frozen=True)
class SyntheticSpec:
    """Size and structure of the synthetic model (default: fits the demo's audit budget)."""

    d: int = 96
    """Activation width."""
    n_features: int = 384
    """True features F (> d: superposition)."""
    n_trees: int = 6
    """Disjoint feature trees."""
    branching: int = 3
    """Children per tree node."""
    depth: int = 3
    """Levels below a tree's root (paper §5.1: 3)."""
    zipf_exponent: float = 0.5
    """Base firing rate of feature i: rate_max (i + 1)^-zipf_exponent."""
    rate_max: float = 0.3
    """Base rate of feature 0."""
    child_fire: float = 0.7
    """Probability that one child fires when its parent fires."""
    mu: tuple[float, float] = (0.6, 1.4)
    """Range of the per-feature mean magnitude mu_i (uniform)."""
    sigma: float = 0.4
    """Per-feature magnitude sd sigma_i."""
    n_correlated_pairs: int = 12
    """Independent-feature pairs whose firing is correlated (Gaussian copula)."""
    rho: float = 0.6
    """Copula correlation of a correlated pair."""
    bias_norm: float = 0.5
    """Norm of the bias b added to every activation."""
    noise: float = 0.02
    """Standard deviation of isotropic Gaussian noise."""
    n_records: int = 3000
    """Records drawn (split 70/15/15 into train/val/test by panel.py)."""
    seed: int = 0
    """Generator seed."""


PAPER_SPEC = SyntheticSpec(d=768, n_features=16384, n_trees=128, branching=4, depth=3, n_records=8192)
"""SynthSAEBench-16k's structure (paper §5.1: 16,384 features, 128 trees of branching 4 and depth 3, 10,880 of
them in trees). d = 768 is assumed (the paper's text does not give it); dense activations take n x F x 8 bytes."""
VARIANTS = PANEL_VARIANTS  # their one owner is the config (reliability.panel_variants is checked against it)


def variant_spec(spec: SyntheticSpec, name: str) -> SyntheticSpec:
    if name not in VARIANTS:
        raise ValueError(f"unknown synthetic variant {name!r}; choose from {sorted(VARIANTS)}")
    return replace(spec, **VARIANTS[name], seed=spec.seed + list(VARIANTS).index(name))


@dataclass(frozen=True)
class SyntheticData:
    x: np.ndarray  # [n, d] activations
    acts: np.ndarray  # [n, F] feature magnitudes (0 = not firing)
    dictionary: np.ndarray  # [F, d] unit rows: the true directions
    bias: np.ndarray  # [d]
    parent: np.ndarray  # [F] parent feature index, -1 for none
    noise: np.ndarray  # [n, d] the noise added
    fires: np.ndarray  # [n, F] the firing pattern z (the hierarchy holds on it; acts > 0 is what x can show)


def tree_size(spec: SyntheticSpec) -> int:
    return sum(spec.branching ** level for level in range(spec.depth + 1))


def tree_layout(spec: SyntheticSpec, rng: np.random.Generator) -> np.ndarray:
    """parent[F]: each tree's nodes are random feature indices (trees span in- and out-of-SAE features)."""
    f, size = spec.n_features, tree_size(spec)
    if spec.n_trees * size + 2 * spec.n_correlated_pairs > f:
        raise ValueError(f"SyntheticSpec: {spec.n_trees} trees x {size} + {2 * spec.n_correlated_pairs} paired "
                         f"features exceed n_features={f}")
    perm = rng.permutation(f)
    parent = np.full(f, -1)
    for t in range(spec.n_trees):
        nodes = np.sort(perm[t * size:(t + 1) * size])  # the root is the tree's most frequent feature
        for j in range(1, size):
            parent[nodes[j]] = nodes[(j - 1) // spec.branching]
    return parent


def synthetic_data(spec: SyntheticSpec) -> SyntheticData:
    """Draw the dictionary, the firing pattern, the magnitudes and the activations of `spec`."""
    rng = np.random.default_rng(spec.seed)
    f, n = spec.n_features, spec.n_records
    dictionary = rng.normal(size=(f, spec.d))
    dictionary /= np.linalg.norm(dictionary, axis=1, keepdims=True)
    parent = tree_layout(spec, rng)
    rates = spec.rate_max * (np.arange(f) + 1.0) ** -spec.zipf_exponent
    z = rng.normal(size=(n, f))
    free = np.flatnonzero(parent < 0)
    in_tree = set(np.flatnonzero(parent >= 0)) | set(parent[parent >= 0])
    singles = np.array([i for i in free if i not in in_tree])
    pairs = rng.choice(singles, size=2 * spec.n_correlated_pairs, replace=False).reshape(-1, 2)
    z[:, pairs[:, 1]] = spec.rho * z[:, pairs[:, 0]] + np.sqrt(1 - spec.rho ** 2) * z[:, pairs[:, 1]]
    fires = stats.norm.cdf(z) < rates
    kids_of: dict[int, list[int]] = {}
    for c in np.flatnonzero(parent >= 0):
        kids_of.setdefault(int(parent[c]), []).append(int(c))
    for p in sorted(kids_of, key=lambda p: _level(p, parent)):  # parents before their children
        kids = np.asarray(kids_of[p])
        fires[:, kids] = False
        w = rates[kids] / rates[kids].sum()
        pick = rng.choice(kids.size, size=n, p=w)
        on = fires[:, p] & (rng.random(n) < spec.child_fire)
        fires[np.flatnonzero(on), kids[pick[on]]] = True
    mu = rng.uniform(*spec.mu, size=f)
    acts = np.where(fires, np.maximum(mu + spec.sigma * rng.normal(size=(n, f)), 0.0), 0.0)
    bias = rng.normal(size=spec.d)
    bias *= spec.bias_norm / np.linalg.norm(bias)
    noise = spec.noise * rng.normal(size=(n, spec.d))
    x = acts @ dictionary + bias + noise
    return SyntheticData(x.astype(np.float32), acts, dictionary, bias, parent, noise, fires)


def _level(i: int, parent: np.ndarray) -> int:
    level = 0
    while parent[i] >= 0:
        i, level = int(parent[i]), level + 1
    return level


FAMILIES = ("in", "out", "mixed")


def in_sae_features(acts: np.ndarray, n_in_sae: int) -> np.ndarray:
    """The n_in_sae features of highest true firing rate (acts > 0), sorted by index (ties: lower index first)."""
    rate = (np.asarray(acts) > 0).mean(axis=0)
    return np.sort(np.argsort(-rate, kind="stable")[:n_in_sae])


def concept_tasks(acts: np.ndarray, n_in_sae: int, task_seed: int, per_family: int = 6, min_rate: float = 0.01,
                  min_rate_out: float = 0.004) -> tuple[np.ndarray, tuple[str, ...], tuple[str, ...]]:
    """Synthetic concepts (standardized), their names and families: `in` (an in-SAE feature firing, or the OR of
    two; in-SAE: the n_in_sae most frequent, in_sae_features), `out` (the same with the other features: the
    negative control) and `mixed` (the OR of one of each), drawn by `task_seed` among in-SAE features firing at
    rate >= min_rate and out-of-SAE ones at rate >= min_rate_out (paper §5.3: out-of-SAE features are the rare
    ones; on the default model none reaches 0.01)."""
    rng = np.random.default_rng([task_seed, 31])
    fire = acts > 0
    rate = fire.mean(axis=0)
    usable = rate >= min_rate
    inside = np.zeros(acts.shape[1], dtype=bool)
    inside[in_sae_features(acts, n_in_sae)] = True
    pool_in = np.flatnonzero(usable & inside)
    pool_out = np.flatnonzero((rate >= min_rate_out) & ~inside)
    if pool_in.size < 2 or pool_out.size < 2:
        raise ValueError(f"concept_tasks: too few features firing in ({min_rate}) or out ({min_rate_out}) of the "
                         f"{n_in_sae} most frequent ({pool_in.size} in, {pool_out.size} out)")
    cols, names, fams = [], [], []
    for i in range(per_family):
        for fam, pools in (("in", (pool_in, pool_in)), ("out", (pool_out, pool_out)), ("mixed", (pool_in, pool_out))):
            a = int(rng.choice(pools[0]))
            if fam != "mixed" and i % 2 == 0:
                cols.append(fire[:, a])
                names.append(f"{fam}_fires_{a}")
            else:
                b = int(rng.choice(pools[1][pools[1] != a]))
                cols.append(fire[:, a] | fire[:, b])
                names.append(f"{fam}_or_{a}_{b}")
            fams.append(fam)
    y = np.stack(cols, axis=1).astype(np.float64)
    sd = y.std(axis=0)
    y = (y - y.mean(axis=0)) / np.where(sd > 0, sd, 1.0)  # standardized, as the manifest
    return y.astype(np.float32), tuple(names), tuple(fams)


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
    best (largest |cos|), over all N latents: a latent that never fires scores 0 (as SAELens's calculator)."""
    alive = np.flatnonzero(codes_fire.any(axis=0))
    if alive.size == 0:
        return 0.0
    best = _abs_cos(decoder[alive], truth).argmax(axis=1)
    z = codes_fire[:, alive].astype(np.float64)
    t = feature_fire[:, best].astype(np.float64)
    tp = (z * t).sum(axis=0)
    denom = z.sum(axis=0) + t.sum(axis=0)
    f1 = np.where(denom > 0, 2 * tp / np.where(denom > 0, denom, 1.0), 0.0)
    return float(f1.sum() / codes_fire.shape[1])
