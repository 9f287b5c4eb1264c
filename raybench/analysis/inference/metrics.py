"""Summary math of the analysis (docs/protocol.md §7, §8) as pure functions of arrays: the common-scale AUC
over log E and decoder reproducibility across seeds.

Everything here is deterministic and free of I/O so it can be checked against hand-computed cases and
independent formulas. Pearson r from sums and per-patient sums live in raybench.core.sufficient_stats.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# ---------------------------------------------------------------- common-scale summary


def auc_weights(expansions: Sequence[float]) -> np.ndarray:
    """Weights w with AUC = w . values: trapezoid over log E, divided by log Emax - log Emin.

    Linear in the values, so the bootstrap can apply it to every draw with one matrix product.
    """
    x = np.log(np.asarray(expansions, dtype=np.float64))
    if x.ndim != 1 or len(x) < 2:
        raise ValueError(f"common-scale AUC needs at least two expansions, got {list(expansions)}")
    if np.any(np.diff(x) <= 0):
        raise ValueError(f"expansions must be strictly increasing, got {list(expansions)}")
    w = np.zeros_like(x)
    dx = np.diff(x)
    w[:-1] += dx / 2
    w[1:] += dx / 2
    return w / (x[-1] - x[0])


def trapezoid_auc(values: np.ndarray, expansions: Sequence[float], axis: int = -1) -> np.ndarray:
    """The same AUC in the published code's arithmetic: np.trapezoid over log E / (log Emax - log Emin).

    Equal to values @ auc_weights(expansions) up to rounding; used where rounding decides ties (quantized
    metrics such as coverage k/C in the crossed bootstrap), so paired p-values and rank ties come out as
    published.
    """
    x = np.log(np.asarray(expansions, dtype=np.float64))
    if x.ndim != 1 or len(x) < 2 or np.any(np.diff(x) <= 0):
        raise ValueError(f"expansions must be >= 2 strictly increasing values, got {list(expansions)}")
    values = np.asarray(values, dtype=np.float64)
    return np.trapezoid(values, x=x, axis=axis) / (x[-1] - x[0])


# ---------------------------------------------------------------- reproducibility


def _unit_columns(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    norms = np.linalg.norm(a, axis=0)
    return a / np.where(norms > 0, norms, 1.0)


def matched_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Mean cosine of the one-to-one column matching (Hungarian) that maximizes the signed cosine sum."""
    from scipy.optimize import linear_sum_assignment  # here: most importers only weigh AUCs (auc_weights)

    cos = _unit_columns(a).T @ _unit_columns(b)
    rows, cols = linear_sum_assignment(cos, maximize=True)
    return float(cos[rows, cols].mean())


def random_pairing_floor(a: np.ndarray, b: np.ndarray, n_permutations: int, rng: np.random.Generator) -> float:
    """Mean cosine of random one-to-one pairings: what matching would give with no shared structure."""
    cos = _unit_columns(a).T @ _unit_columns(b)
    m = cos.shape[0]
    idx = np.arange(m)
    return float(np.mean([cos[idx, rng.permutation(m)].mean() for _ in range(n_permutations)]))


def subspace_overlap(a: np.ndarray, b: np.ndarray) -> float:
    """||Qa^T Qb||_F^2 / rank, Q from the (reduced) QR of each column set; 1 = same span, ~m/d = random."""
    qa = np.linalg.qr(np.asarray(a, dtype=np.float64))[0]
    qb = np.linalg.qr(np.asarray(b, dtype=np.float64))[0]
    rank = min(qa.shape[1], qb.shape[1])
    return float(np.sum((qa.T @ qb) ** 2) / rank)


def reproducibility(decoders: Sequence[np.ndarray], top: int, n_permutations: int, seed: int,
                    pair_seeds: Sequence[int] | None = None) -> dict[str, float]:
    """Seed-to-seed stability of the most active decoder columns for one (model, depth, E).

    decoders: per seed, [d, m_s] columns sorted by validation firing rate (most active first).
    Every seed keeps the same count m = min(top, min_s m_s); results are means over seed pairs.
    The permutation floor draws from one default_rng(seed) across the pairs (i < j, in order), or - the
    published stream - from a fresh default_rng(pair_seeds[p]) for the p-th pair (see streams.floor_seed).
    """
    if len(decoders) < 2:
        raise ValueError(f"reproducibility needs at least two seeds, got {len(decoders)}")
    m = min(top, *(d.shape[1] for d in decoders))
    if m < 1:
        raise ValueError("reproducibility needs at least one non-dead decoder column in every seed")
    kept = [np.asarray(d)[:, :m] for d in decoders]
    n_pairs = len(kept) * (len(kept) - 1) // 2
    if pair_seeds is not None and len(pair_seeds) != n_pairs:
        raise ValueError(f"pair_seeds has {len(pair_seeds)} seeds for {n_pairs} seed pairs")
    rng = np.random.default_rng(seed)
    match, floor, overlap = [], [], []
    for i in range(len(kept)):
        for j in range(i + 1, len(kept)):
            if pair_seeds is not None:
                rng = np.random.default_rng(int(pair_seeds[len(floor)]))
            match.append(matched_cosine(kept[i], kept[j]))
            floor.append(random_pairing_floor(kept[i], kept[j], n_permutations, rng))
            overlap.append(subspace_overlap(kept[i], kept[j]))
    mc, rf = float(np.mean(match)), float(np.mean(floor))
    pairs = [(i, j) for i in range(len(kept)) for j in range(i + 1, len(kept))]  # per pair: (i, j, mc, floor, ov)
    return {"matched_cosine": mc, "random_floor": rf, "excess": mc - rf,
            "subspace_overlap": float(np.mean(overlap)), "n_columns": m,
            "pairs": [(i, j, match[p], floor[p], overlap[p]) for p, (i, j) in enumerate(pairs)]}
