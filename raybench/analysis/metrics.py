"""Per-cell metric math (docs/protocol.md §7) as pure functions of arrays.

Everything here is deterministic and free of I/O so it can be checked against hand-computed cases
and independent formulas; the bootstrap reuses these on reweighted sufficient statistics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from scipy.optimize import linear_sum_assignment

_CONSTANT_TOL = 1e-12

# ---------------------------------------------------------------- correlation / fidelity


def pearson_from_sums(n, sa, sy, saa, syy, say) -> np.ndarray:
    """Pearson r from sums (n, sum a, sum y, sum a^2, sum y^2, sum a*y); broadcasts over arrays.

    A constant coordinate or concept (zero variance) has no defined correlation; it scores 0 so a
    dead latent counts as "not accessible" rather than poisoning averages with NaN.
    """
    n, sa, sy, saa, syy, say = (np.asarray(v, dtype=np.float64) for v in (n, sa, sy, saa, syy, say))
    cov = n * say - sa * sy
    # variance below rounding level of n * sum(x^2) means the values are constant (up to float error)
    var_a = n * saa - sa * sa
    var_a = np.where(var_a > _CONSTANT_TOL * np.abs(n * saa), var_a, 0.0)
    var_y = n * syy - sy * sy
    var_y = np.where(var_y > _CONSTANT_TOL * np.abs(n * syy), var_y, 0.0)
    den = np.sqrt(var_a * var_y)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, cov / np.where(den > 0, den, 1.0), 0.0)
    return np.clip(r, -1.0, 1.0)


def accessibility(r: np.ndarray, axis: int = -1) -> np.ndarray:
    """Single-coordinate accessibility: mean |r| over concepts."""
    return np.mean(np.abs(r), axis=axis)


def coverage(r: np.ndarray, threshold: float, axis: int = -1) -> np.ndarray:
    """Fraction of concepts whose selected coordinate reaches |r| >= threshold."""
    return np.mean(np.abs(r) >= threshold, axis=axis)


def r2_from_sums(sse, sst) -> np.ndarray:
    """Reconstruction R^2 = 1 - SSE/SST (SST around the frozen eval-split mean)."""
    sse = np.asarray(sse, dtype=np.float64)
    sst = np.asarray(sst, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sst > 0, 1.0 - sse / np.where(sst > 0, sst, 1.0), np.nan)


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


def common_scale_auc(values: np.ndarray, expansions: Sequence[float], axis: int = -1) -> np.ndarray:
    """AUC_E(m) of `values` whose `axis` runs over `expansions` (a mean of m on the log-E scale)."""
    values = np.moveaxis(np.asarray(values, dtype=np.float64), axis, -1)
    if values.shape[-1] != len(expansions):
        raise ValueError(f"values have {values.shape[-1]} points on the E axis, expansions {len(expansions)}")
    return values @ auc_weights(expansions)


def trapezoid_auc(values: np.ndarray, expansions: Sequence[float], axis: int = -1) -> np.ndarray:
    """The same AUC in the published code's arithmetic: np.trapezoid over log E / (log Emax - log Emin).

    Equal to common_scale_auc up to rounding; used where rounding decides ties (quantized metrics such as
    coverage k/C in the crossed bootstrap), so paired p-values and rank ties come out as published.
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


# ---------------------------------------------------------------- averaging helpers


def seed_average(df: pd.DataFrame, keys: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean of `values` over seeds (every row not distinguished by `keys`), sorted by `keys`."""
    out = df.groupby(list(keys), sort=True, dropna=False)[list(values)].mean().reset_index()
    return out


def depth_average(df: pd.DataFrame, keys: Sequence[str], values: Sequence[str]) -> pd.DataFrame:
    """Mean of `values` over depths (rows not distinguished by `keys`); same operation, named for intent."""
    return seed_average(df, keys, values)


def auc_over_expansions(df: pd.DataFrame, keys: Sequence[str], value: str, expansions: Sequence[float],
                        expansion_col: str = "expansion") -> pd.DataFrame:
    """Common-scale AUC of `value` per `keys` group; groups missing any expansion are dropped."""
    wide = df.pivot_table(index=list(keys), columns=expansion_col, values=value, aggfunc="mean")
    wide = wide.reindex(columns=list(expansions)).dropna(axis=0, how="any")
    out = pd.DataFrame({"auc": common_scale_auc(wide.to_numpy(), expansions)}, index=wide.index)
    return out.reset_index()


# ---------------------------------------------------------------- per-patient sufficient statistics


def patient_sums(patient: np.ndarray, n_patients: int, a: np.ndarray, y: np.ndarray, sse: np.ndarray,
                 sst: np.ndarray) -> dict[str, np.ndarray]:
    """Record-level values -> the per-patient sums the bootstrap reweights (patient_stats.npz content).

    patient [R]: index 0..P-1 of each test record's patient (patients sorted); a [R, C]: each concept's
    selected code coordinate; y [R, C]: the concepts; sse/sst [R]: per-record squared error and squared
    deviation from the frozen full-test mean.  -> n [P], sse [P], sst [P], corr [P, C, 5] = sums of
    (a, y, a^2, y^2, a*y).
    """
    patient = np.asarray(patient, dtype=np.int64)
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if a.shape != y.shape or a.ndim != 2 or a.shape[0] != patient.shape[0]:
        raise ValueError(f"patient_sums: shapes patient {patient.shape}, a {a.shape}, y {y.shape} do not fit "
                         f"[R], [R, C], [R, C]")

    counts = np.bincount(patient, minlength=n_patients)
    contiguous = counts.size == n_patients and np.all(counts > 0) and np.all(np.diff(patient) >= 0)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])

    def per_patient(v: np.ndarray) -> np.ndarray:
        if contiguous:  # records grouped by patient (the usual sorted order): one reduceat pass
            return np.add.reduceat(v, starts, axis=0)
        out = np.zeros((n_patients, *v.shape[1:]))
        np.add.at(out, patient, v)
        return out

    parts = np.stack([a, y, a * a, y * y, a * y], axis=-1)  # [R, C, 5]
    return {"n": per_patient(np.ones(len(patient))), "sse": per_patient(np.asarray(sse, dtype=np.float64)),
            "sst": per_patient(np.asarray(sst, dtype=np.float64)), "corr": per_patient(parts)}
