"""Pure estimators of the secondary analyses (docs/protocol.md §9): feature-concept correlations and
single-coordinate readouts, random dictionaries, linear CKA, the input-harmonization transforms and the
patient bootstrap of paired correlations. Ridge readouts are in ridge.py, the matched-effect interventions
in matched_effect.py; Pearson r from sums and per-patient sums are raybench.core.sufficient_stats'.

Everything here is numpy/scipy (torch only for BatchTopK) and independent of the run folder, so each
piece is checked against an independent formula in tests/analysis/secondary/test_estimators.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp

from raybench.analysis.inference.streams import patient_draws
from raybench.cohorts.waveforms import LEADS
from raybench.core.sufficient_stats import paired_corr, pearson_from_parts, pearson_from_sums

if TYPE_CHECKING:
    from raybench.sae.model import Normalizer, StackedBatchTopKSAE

Matrix = np.ndarray | sp.spmatrix


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


# ---------------------------------------------------------------- dictionaries

def random_directions(n_latents: int, d: int, seed: int) -> np.ndarray:
    """N Gaussian directions in R^d with unit norm -> [N, d] float32 (one seed -> one dictionary).

    The published protocol's draw and arithmetic exactly: default_rng(seed).normal(size=(N, d)) cast to
    float32, each row divided by its float32 norm clipped at 1e-8 (tests/parity pins it).
    """
    w = np.random.default_rng(seed).normal(size=(n_latents, d)).astype(np.float32)
    w /= np.linalg.norm(w, axis=1, keepdims=True).clip(min=1e-8)
    return w


def sae_codes(sae: StackedBatchTopKSAE, normalizer: Normalizer, x: np.ndarray, eval_batch: int) -> sp.csr_matrix:
    """BatchTopK codes of one SAE on raw activations x [n, d], as evaluation computes them -> CSR [n, N]."""
    from raybench.sae.evaluate import encode_split

    c = encode_split(sae, normalizer, x, eval_batch)
    return sp.csr_matrix((c.vals, (c.rows, c.cols)), shape=(c.n, sae.n_latents))


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


# ---------------------------------------------------------------- patient bootstrap of paired correlations

def draw_corr(counts: np.ndarray, sums: dict[str, np.ndarray]) -> np.ndarray:
    """Bootstrap draws of paired r: counts [D, P] x per-patient sums (sufficient_stats.patient_stats: n [P],
    corr [P, C, 5]) -> [D, C]."""
    counts = np.asarray(counts, dtype=np.float64)
    n = counts @ np.asarray(sums["n"], dtype=np.float64)  # [D] records in each draw
    w = np.tensordot(counts, np.asarray(sums["corr"], dtype=np.float64), axes=(1, 0))  # [D, C, 5]
    return pearson_from_parts(n[:, None], w)


def bootstrap_counts(n_patients: int, n_draws: int, seed: int, chunk_draws: int,
                     stream: str = "chunked") -> np.ndarray:
    """All patient-count draws [n_draws, P] of the run's patient bootstrap (same stream, seed and chunks)."""
    return np.concatenate(list(patient_draws(n_patients, n_draws, seed, chunk_draws, stream)))
