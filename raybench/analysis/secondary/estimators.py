"""Pure estimators of the secondary analyses (docs/protocol.md §9): ridge, correlations, random
dictionaries, linear CKA, input harmonization transforms, matched-effect interventions, patient sums.

Everything here is numpy/scipy (torch only for BatchTopK) and independent of the run folder, so each
piece is checked against an independent formula in tests/test_secondary_estimators.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from raybench.cohorts.waveforms import LEADS
from raybench.sae.evaluate import pearson_from_sums

Matrix = np.ndarray | sp.spmatrix
SCALE_TINY = 10 * np.finfo(np.float64).eps  # sklearn's StandardScaler: a std this small counts as constant


# ---------------------------------------------------------------- correlations

def column_sums(x: Matrix) -> tuple[np.ndarray, np.ndarray]:
    """(sum, sum of squares) per column of a dense or sparse matrix, float64."""
    if sp.issparse(x):
        x = sp.csr_matrix(x, dtype=np.float64)
        return np.asarray(x.sum(axis=0)).ravel(), np.asarray(x.multiply(x).sum(axis=0)).ravel()
    x = np.asarray(x, dtype=np.float64)
    return x.sum(axis=0), np.square(x).sum(axis=0)


def feature_concept_corr(x: Matrix, y: np.ndarray) -> np.ndarray:
    """Pearson r of every feature column with every concept column -> [p, C] (0 for constant columns)."""
    y = np.asarray(y, dtype=np.float64)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"features have {x.shape[0]} rows, concepts {y.shape[0]}")
    sa, saa = column_sums(x)
    cross = np.asarray(x.T @ y) if sp.issparse(x) else np.asarray(x, dtype=np.float64).T @ y
    return pearson_from_sums(y.shape[0], sa[:, None], y.sum(0)[None, :], saa[:, None],
                             np.square(y).sum(0)[None, :], cross)


def paired_corr(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of column c of `a` with column c of `y` -> [C]."""
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if a.shape != y.shape:
        raise ValueError(f"paired_corr needs equal shapes, got {a.shape} and {y.shape}")
    n = a.shape[0]
    return pearson_from_sums(n, a.sum(0), y.sum(0), (a * a).sum(0), (y * y).sum(0), (a * y).sum(0))


def rank_features(corr: np.ndarray, candidates: np.ndarray | None = None) -> np.ndarray:
    """Feature indices per concept by decreasing train |r| (stable ties) -> [p or len(candidates), C]."""
    corr = np.asarray(corr)
    cand = np.arange(corr.shape[0]) if candidates is None else np.asarray(candidates, dtype=np.int64)
    return cand[np.argsort(-np.abs(corr[cand]), axis=0, kind="stable")]


def gather_columns(x: Matrix, cols: np.ndarray) -> np.ndarray:
    """Dense float64 [n, len(cols)] of the given columns (repeats allowed)."""
    cols = np.asarray(cols, dtype=np.int64)
    if sp.issparse(x):
        return np.asarray(sp.csc_matrix(x)[:, cols].toarray(), dtype=np.float64)
    return np.asarray(x, dtype=np.float64)[:, cols]


# ---------------------------------------------------------------- ridge (closed form)

@dataclass(frozen=True)
class GramStats:
    """Train sufficient statistics of a standardized ridge: X~ = (X - mean) / scale, y centred.

    gram = X~^T X~ [p, p], cross = X~^T (y - y_mean) [p, C]. Constant columns get scale 1 (and are all
    zero after centring), as sklearn's StandardScaler does.
    """

    n: int
    mean: np.ndarray
    scale: np.ndarray
    gram: np.ndarray
    cross: np.ndarray
    y_mean: np.ndarray


def gram_stats(x: Matrix, y: np.ndarray) -> GramStats:
    """Centred, scaled Gram and cross products without densifying a sparse X."""
    y = np.asarray(y, dtype=np.float64)
    if y.ndim == 1:
        y = y[:, None]
    n = x.shape[0]
    if n != y.shape[0] or n < 2:
        raise ValueError(f"ridge needs matching rows >= 2, got X {x.shape} and y {y.shape}")
    s1, s2 = column_sums(x)
    mean = s1 / n
    var = np.maximum(s2 / n - mean**2, 0.0)
    scale = np.sqrt(var)
    scale = np.where(scale < SCALE_TINY * np.maximum(1.0, np.abs(mean)), 1.0, scale)
    if sp.issparse(x):
        xs = sp.csr_matrix(x, dtype=np.float64)
        raw = np.asarray((xs.T @ xs).toarray())
        xty = np.asarray(xs.T @ y)
    else:
        xd = np.asarray(x, dtype=np.float64)
        raw = xd.T @ xd
        xty = xd.T @ y
    y_mean = y.mean(axis=0)
    gram = (raw - n * np.outer(mean, mean)) / np.outer(scale, scale)
    gram = 0.5 * (gram + gram.T)
    cross = (xty - n * np.outer(mean, y_mean)) / scale[:, None]
    return GramStats(n, mean, scale, gram, cross, y_mean)


def ridge_solve(stats: GramStats, alpha: float, cols: np.ndarray | None = None,
                targets: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ridge (penalty alpha on standardized coefficients, free intercept) on a column subset.

    Returns (coef [p_sub, C_sub] in raw feature units, intercept [C_sub]): y_hat = X[:, cols] @ coef + intercept.
    This is sklearn's Ridge(alpha, fit_intercept=True) on StandardScaler-transformed features.
    """
    if alpha <= 0:
        raise ValueError(f"ridge alpha must be > 0, got {alpha}")
    cols = np.arange(stats.gram.shape[0]) if cols is None else np.asarray(cols, dtype=np.int64)
    tg = np.arange(stats.cross.shape[1]) if targets is None else np.asarray(targets, dtype=np.int64)
    g = stats.gram[np.ix_(cols, cols)] + alpha * np.eye(cols.size)
    w = sla.solve(g, stats.cross[np.ix_(cols, tg)], assume_a="pos")
    coef = w / stats.scale[cols, None]
    return coef, stats.y_mean[tg] - stats.mean[cols] @ coef


def ridge_fit(x: Matrix, y: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-alpha ridge on standardized features (train statistics) -> (coef [p, C], intercept [C])."""
    return ridge_solve(gram_stats(x, y), alpha)


def ridge_predict(x: Matrix, coef: np.ndarray, intercept: np.ndarray) -> np.ndarray:
    out = x @ coef if sp.issparse(x) else np.asarray(x, dtype=np.float64) @ coef
    return np.asarray(out) + intercept


def topm_ridge_test_r(stats: GramStats, ranking: np.ndarray, m: int, alpha: float, x_test: Matrix,
                      y_test: np.ndarray) -> np.ndarray:
    """Per concept c: ridge on its top-m train-ranked columns, held-out r on the test split -> [C]."""
    y_test = np.asarray(y_test, dtype=np.float64)
    out = np.zeros(y_test.shape[1])
    m = min(m, ranking.shape[0])
    for c in range(y_test.shape[1]):
        cols = ranking[:m, c]
        coef, icpt = ridge_solve(stats, alpha, cols, np.array([c]))
        pred = gather_columns(x_test, cols) @ coef[:, 0] + icpt[0]
        out[c] = paired_corr(pred[:, None], y_test[:, c:c + 1])[0]
    return out


@dataclass(frozen=True)
class Readout:
    """Multi-target linear readout y_hat = x @ coef + intercept, alpha chosen per target on validation."""

    coef: np.ndarray  # [d, C]
    intercept: np.ndarray  # [C]
    alpha: np.ndarray  # [C]
    val_r: np.ndarray  # [C]


def ridge_readout(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                  alphas: Sequence[float]) -> Readout:
    """Ridge path over `alphas` from one eigendecomposition; per target keep the alpha with the best val |r|."""
    alphas = np.asarray(tuple(alphas), dtype=np.float64)
    if alphas.size == 0 or np.any(alphas <= 0):
        raise ValueError(f"readout alphas must be positive, got {alphas.tolist()}")
    st = gram_stats(x_train, y_train)
    lam, vec = np.linalg.eigh(st.gram)
    lam = np.maximum(lam, 0.0)
    proj = vec.T @ st.cross
    xv = (np.asarray(x_val, dtype=np.float64) - st.mean) / st.scale
    c = st.cross.shape[1]
    best = np.full(c, -np.inf)
    w_best = np.zeros_like(st.cross)
    a_best = np.zeros(c)
    for a in alphas:
        w = vec @ (proj / (lam[:, None] + a))
        score = np.abs(paired_corr(xv @ w, np.asarray(y_val, dtype=np.float64)))
        better = score > best
        best[better], w_best[:, better], a_best[better] = score[better], w[:, better], a
    coef = w_best / st.scale[:, None]
    return Readout(coef, st.y_mean - st.mean @ coef, a_best, best)


# ---------------------------------------------------------------- dictionaries

def random_directions(n_latents: int, d: int, seed: int) -> np.ndarray:
    """N Gaussian directions in R^d with unit norm -> [N, d] float32 (one seed -> one dictionary).

    The published protocol's draw and arithmetic exactly: default_rng(seed).normal(size=(N, d)) cast to
    float32, each row divided by its float32 norm clipped at 1e-8 (tests/parity pins it).
    """
    w = np.random.default_rng(seed).normal(size=(n_latents, d)).astype(np.float32)
    w /= np.linalg.norm(w, axis=1, keepdims=True).clip(min=1e-8)
    return w


def batch_topk_codes(xn: np.ndarray, directions: np.ndarray, k: int, batch: int) -> sp.csr_matrix:
    """Codes of the random-dictionary control: BatchTopK(ReLU(xn @ D^T)) on frozen-order batches -> CSR [n, N].

    The same activation rule as the SAE (keep the B*k largest entries of each batch, B its own size),
    on the same normalized inputs and batch order, so only the learned dictionary differs.
    """
    import torch

    from raybench.sae.model import batch_topk

    xn = np.asarray(xn, dtype=np.float32)
    n, n_lat = xn.shape[0], directions.shape[0]
    dt = torch.from_numpy(np.ascontiguousarray(directions.T))
    rows, cols, vals = [], [], []
    with torch.no_grad():
        for start in range(0, n, batch):
            xb = torch.from_numpy(xn[start:start + batch])
            p = torch.relu(xb @ dt).unsqueeze(0)
            v, f = batch_topk(p, k)
            v, f = v[0].numpy(), f[0].numpy()
            keep = v > 0
            rows.append(f[keep] // n_lat + start)
            cols.append(f[keep] % n_lat)
            vals.append(v[keep].astype(np.float64))
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n, n_lat))


def single_coordinate_r(train_x: Matrix, train_y: np.ndarray, test_x: Matrix, test_y: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Fit-free readout: j*(c) = argmax_j |r_train|, evaluated on test -> (selected [C], r_test [C])."""
    sel = np.abs(feature_concept_corr(train_x, train_y)).argmax(axis=0)
    return sel, paired_corr(gather_columns(test_x, sel), test_y)


# ---------------------------------------------------------------- representation similarity

def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA = ||X~^T Y~||_F^2 / (||X~^T X~||_F ||Y~^T Y~||_F) with column-centred X~, Y~ (rows paired)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same records in both, got {x.shape[0]} and {y.shape[0]} rows")
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    den = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(np.square(x.T @ y).sum() / den) if den > 0 else 0.0


# ---------------------------------------------------------------- input harmonization transforms

_I, _II = LEADS.index("I"), LEADS.index("II")
DEPENDENT_LEADS = ("III", "aVR", "aVL", "aVF")


def reconstruct_limb_leads(signal: np.ndarray) -> np.ndarray:
    """Keep I, II, V1-V6; rebuild III = II - I, aVR = -(I + II)/2, aVL = I - II/2, aVF = II - I/2 -> [12, T]."""
    x = np.asarray(signal, dtype=np.float32)
    if x.ndim != 2 or x.shape[0] != len(LEADS):
        raise ValueError(f"expected a [12, T] record in {LEADS} order, got shape {x.shape}")
    out = x.copy()
    i, ii = x[_I], x[_II]
    rebuilt = {"III": ii - i, "aVR": -(i + ii) / 2, "aVL": i - ii / 2, "aVF": ii - i / 2}
    for name, values in rebuilt.items():
        out[LEADS.index(name)] = values
    return out


def temporal_harmonize(signal: np.ndarray, window_seconds: float, canonical_samples: int = 2500
                       ) -> tuple[np.ndarray, float]:
    """Map the whole record onto `canonical_samples` points (FFT resampling; 10 s -> 250 Hz), then declare the
    rate at which those points span the model's input window exactly: (signal [12, canonical], fs').

    A model whose native preprocessing keeps `window_seconds` of signal then sees the whole record in its
    own input length (the protocol's "whole 10 s, adapted to each model's input length").
    """
    from scipy.signal import resample

    x = np.asarray(signal, dtype=np.float32)
    if window_seconds <= 0:
        raise ValueError(f"window_seconds must be > 0, got {window_seconds}")
    if x.shape[-1] != canonical_samples:
        x = resample(x, canonical_samples, axis=-1).astype(np.float32)
    return x, canonical_samples / float(window_seconds)


# ---------------------------------------------------------------- matched-effect interventions

@dataclass(frozen=True)
class UnitIntervention:
    """Readout changes of a full (dose 1) clamp of k coordinates to their high-concept train centroid."""

    val_out: np.ndarray  # [n_val, C] readout change
    test_out: np.ndarray  # [n_test, C]
    test_l2: np.ndarray  # [n_test] norm of the representation change (dense, normalized space)
    selected: np.ndarray  # [k]

    def val_effect(self, target: int) -> float:
        return float(np.mean(self.val_out[:, target]))


def centroid_intervention(train_sel: np.ndarray, y_train_target: np.ndarray, val_sel: np.ndarray,
                          test_sel: np.ndarray, basis_rows: np.ndarray, readout_coef: np.ndarray,
                          selected: np.ndarray, high_quantile: float = 0.75) -> UnitIntervention:
    """Move the selected coordinates of every record to the mean over train records whose concept value
    is in the top quartile; the change maps to the dense state through `basis_rows` [k, d] and to the
    readouts through `readout_coef` [d, C] (linear, so off-target effects are exact, not sampled)."""
    if not 0.5 <= high_quantile < 1.0:
        raise ValueError(f"high_quantile must be in [0.5, 1), got {high_quantile}")
    y = np.asarray(y_train_target, dtype=np.float64)
    high = y >= np.quantile(y, high_quantile)
    if high.sum() < 2:
        raise ValueError("fewer than two high-concept train records: cannot form a centroid")
    centroid = np.asarray(train_sel, dtype=np.float64)[high].mean(axis=0)
    basis = np.asarray(basis_rows, dtype=np.float64)
    to_readout = basis @ np.asarray(readout_coef, dtype=np.float64)  # [k, C]
    dv = centroid - np.asarray(val_sel, dtype=np.float64)
    dt = centroid - np.asarray(test_sel, dtype=np.float64)
    return UnitIntervention(dv @ to_readout, dt @ to_readout, np.linalg.norm(dt @ basis, axis=1),
                            np.asarray(selected, dtype=np.int64))


def common_effect(unit_effects: Mapping[str, float], cap: float = 0.25, floor: float = 0.05,
                  max_dose: float = 1.0) -> tuple[float, str]:
    """The shared validation target effect: min(cap, max_dose x each unit effect); gate on positivity and floor."""
    if not 0 < floor <= cap or max_dose <= 0:
        raise ValueError(f"need 0 < floor <= cap and max_dose > 0, got {floor}, {cap}, {max_dose}")
    vals = np.asarray(list(unit_effects.values()), dtype=np.float64)
    if vals.size == 0 or not np.all(np.isfinite(vals)) or np.any(vals <= 0):
        return float("nan"), "nonpositive_validation_effect"
    common = float(min(cap, max_dose * vals.min()))
    return common, ("eligible" if common >= floor else "below_effect_floor")


RECORD_METRICS = ("target_delta", "off_cross_rms", "off_all_rms", "activation_l2")


def record_metrics(unit: UnitIntervention, target: int, families: Sequence[str], dose: float) -> np.ndarray:
    """Per test record at `dose`: target change, cross-family and all off-target RMS, state L2 -> [n, 4]."""
    fam = np.asarray(families, dtype=object)
    if fam.size != unit.test_out.shape[1]:
        raise ValueError(f"{fam.size} families for {unit.test_out.shape[1]} readouts")
    other = np.arange(fam.size) != target
    cross = other & (fam != fam[target])
    if not cross.any():
        raise ValueError(f"concept {target} has no concept of another family: cross-family RMS undefined")
    delta = unit.test_out * dose
    return np.column_stack([
        delta[:, target],
        np.sqrt(np.mean(np.square(delta[:, cross]), axis=1)),
        np.sqrt(np.mean(np.square(delta[:, other]), axis=1)),
        unit.test_l2 * dose,
    ])


def wrong_behavior_index(target_delta: np.ndarray | float, off_rms: np.ndarray | float) -> np.ndarray:
    """WBI = off-target RMS / |target effect| (lower is more selective)."""
    return np.asarray(off_rms, dtype=np.float64) / np.maximum(np.abs(np.asarray(target_delta, np.float64)), 1e-8)


# ---------------------------------------------------------------- patient-level sums for bootstraps

def patient_sums(values: np.ndarray, codes: np.ndarray, n_patients: int) -> np.ndarray:
    """Sum rows of values [n, ...] per patient code -> [P, ...] (float64)."""
    values = np.asarray(values, dtype=np.float64)
    out = np.zeros((n_patients, *values.shape[1:]))
    np.add.at(out, np.asarray(codes, dtype=np.int64), values)
    return out


def corr_sums(a: np.ndarray, y: np.ndarray, codes: np.ndarray, n_patients: int) -> np.ndarray:
    """Per-patient sums of (1, a, y, a^2, y^2, a y) for paired columns -> [P, C, 6]."""
    a = np.asarray(a, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    stack = np.stack([np.ones_like(a), a, y, a * a, y * y, a * y], axis=2)
    return patient_sums(stack, codes, n_patients)


def draw_corr(counts: np.ndarray, sums: np.ndarray) -> np.ndarray:
    """Bootstrap draws of paired r: counts [D, P] x per-patient sums [P, C, 6] -> [D, C]."""
    w = np.tensordot(np.asarray(counts, dtype=np.float64), sums, axes=(1, 0))  # [D, C, 6]
    return pearson_from_sums(w[..., 0], w[..., 1], w[..., 2], w[..., 3], w[..., 4], w[..., 5])


def bootstrap_counts(n_patients: int, n_draws: int, seed: int, chunk_draws: int,
                     stream: str = "chunked") -> np.ndarray:
    """All patient-count draws [n_draws, P] of the run's patient bootstrap (same stream, seed and chunks)."""
    from raybench.analysis.bootstrap import patient_draws

    return np.concatenate(list(patient_draws(n_patients, n_draws, seed, chunk_draws, stream)))
