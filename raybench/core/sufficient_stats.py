"""Sufficient statistics shared by evaluation and analysis: per-patient sums and Pearson r from sums.

One implementation, used by the SAE evaluation (raybench.sae.evaluate: coordinate selection, val/test r, the
cell's patient_stats.npz), the patient bootstrap (raybench.analysis.inference.bootstrap: r of every draw from reweighted
sums) and the secondary analyses (single-coordinate readouts and their bootstraps). It imports nothing from
raybench, so every layer of cohorts -> encoders -> sae -> analysis may use it without an import running back up.

Zero-variance rule (one rule everywhere): with S1 = sum x and S2 = sum x^2 over n records, the scaled variance
n*S2 - S1^2 counts as zero when it is <= rtol * |n*S2| (rtol = CONSTANT_RTOL = 1e-12 for float64 sums; the
bootstrap passes a larger rtol for float32-packed sums).  A coordinate or concept that is constant up to
rounding has no defined correlation; its r is 0 (not NaN), so a dead latent counts as "not accessible" instead
of poisoning averages.

patient_stats.npz content (written by the SAE stage, read by the bootstrap): n [P] records per patient,
sse [P], sst [P] (per-record squared error and squared deviation, summed per patient) and corr [P, C, 5], the
per-patient sums of (a, y, a^2, y^2, a*y) in CORR_PARTS order (a: a concept's selected code coordinate).
"""

from __future__ import annotations

import numpy as np

CONSTANT_RTOL = 1e-12
CORR_PARTS = ("a", "y", "aa", "yy", "ay")  # order of the last axis of `corr` sums


def centered_sum_of_squares(n, s, ss, rtol: float = CONSTANT_RTOL) -> np.ndarray:
    """n * sum(x^2) - (sum x)^2 (= n^2 times the variance), 0 where it is <= rtol * |n * sum(x^2)|."""
    nss = np.asarray(n, dtype=np.float64) * np.asarray(ss, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    var = nss - s * s
    return np.where(var > rtol * np.abs(nss), var, 0.0)


def pearson_from_sums(n, sa, sy, saa, syy, say, rtol: float = CONSTANT_RTOL) -> np.ndarray:
    """Pearson r from sums (n, sum a, sum y, sum a^2, sum y^2, sum a*y); broadcasts over arrays.

    r = 0 where either side is constant (the module's zero-variance rule); clipped to [-1, 1].
    """
    n, sa, sy, say = (np.asarray(v, dtype=np.float64) for v in (n, sa, sy, say))
    var_a = centered_sum_of_squares(n, sa, saa, rtol)
    var_y = centered_sum_of_squares(n, sy, syy, rtol)
    cov = n * say - sa * sy
    den = np.sqrt(var_a * var_y)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(den > 0, cov / np.where(den > 0, den, 1.0), 0.0)
    return np.clip(r, -1.0, 1.0)


def pearson_from_parts(n, parts: np.ndarray, rtol: float = CONSTANT_RTOL) -> np.ndarray:
    """Pearson r from sums stacked on the last axis in CORR_PARTS order: parts [..., 5], n broadcastable to [...]."""
    parts = np.asarray(parts, dtype=np.float64)
    if parts.shape[-1] != len(CORR_PARTS):
        raise ValueError(f"parts must end in the {len(CORR_PARTS)} sums {CORR_PARTS}, got shape {parts.shape}")
    return pearson_from_sums(n, *np.moveaxis(parts, -1, 0), rtol=rtol)


def corr_parts(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Record-level terms of paired columns a, y [n, C] -> [n, C, 5] = (a, y, a^2, y^2, a*y)."""
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if a.shape != y.shape:
        raise ValueError(f"paired columns need equal shapes, got {a.shape} and {y.shape}")
    return np.stack([a, y, a * a, y * y, a * y], axis=-1)


def paired_corr(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of column c of `a` with column c of `y` [n, C] -> [C]."""
    parts = corr_parts(a, y)
    return pearson_from_parts(parts.shape[0], parts.sum(axis=0))


def per_patient_sums(codes: np.ndarray, n_patients: int, values: np.ndarray) -> np.ndarray:
    """Sum the rows of values [R, ...] per patient code (0..P-1) -> [P, ...] float64.

    A sparse one-hot [P, R] product: each patient's records are added in record order, in any record order.
    """
    codes = np.asarray(codes, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64)
    if codes.ndim != 1 or values.shape[:1] != codes.shape:
        raise ValueError(f"codes [R] and values [R, ...] do not fit: {codes.shape}, {values.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= n_patients):
        raise ValueError(f"patient codes must lie in 0..{n_patients - 1}, got {codes.min()}..{codes.max()}")
    import scipy.sparse as sp  # here: the bootstrap workers that import this module only combine sums

    onehot = sp.csr_matrix((np.ones(codes.size), (codes, np.arange(codes.size))), shape=(n_patients, codes.size))
    flat = values.reshape(codes.size, -1)
    return np.asarray(onehot @ flat).reshape(n_patients, *values.shape[1:])


def patient_stats(codes: np.ndarray, n_patients: int, a: np.ndarray, y: np.ndarray, sse: np.ndarray | None = None,
                  sst: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Record-level values -> per-patient sums (the patient_stats.npz content, see the module docstring).

    codes [R]: each record's patient (0..P-1); a, y [R, C]: selected coordinate and concept per column;
    sse, sst [R] (optional): per-record squared error and squared deviation.  -> n [P] (int64),
    corr [P, C, 5], and sse [P], sst [P] when given.
    """
    codes = np.asarray(codes, dtype=np.int64)
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] != codes.shape[0]:
        raise ValueError(f"patient_stats: shapes codes {codes.shape}, a {a.shape}, y {np.shape(y)} do not fit "
                         "[R], [R, C], [R, C]")
    corr = per_patient_sums(codes, n_patients, corr_parts(a, y))  # checks the codes
    out = {"n": np.bincount(codes, minlength=n_patients).astype(np.int64)}
    for name, v in (("sse", sse), ("sst", sst)):
        if v is not None:
            out[name] = per_patient_sums(codes, n_patients, v)
    out["corr"] = corr
    return out
