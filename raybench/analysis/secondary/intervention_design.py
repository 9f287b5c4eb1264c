"""The MIMIC-IV-ECG intervention design (docs/protocol.md §9.4.1): what the published MIMIC workers do unlike the
PTB-XL ones. scripts/run_mimic_final_layer_matched_effect_worker.py keeps every record with its missing labels,
ranks coordinates by NaN-masked train correlations over the whole train split, fits one masked ridge readout per
concept, draws the candidate subsets of a train-live or full latent pool from seed 976000 + r, and marks each SAE
seed with a quality gate; scripts/bootstrap_mimic_final_layer_matched_effect.py keeps a concept only where every
seed passes that gate and the matched-effect gate.

Pure numpy, independent of the run folder; intervention.py wires it in.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from raybench.analysis.secondary.estimators import Matrix, feature_concept_corr
from raybench.analysis.secondary.ridge import Readout
from raybench.core.sufficient_stats import paired_corr

CANDIDATE_POOLS = ("all", "train_live")
QUALITY_GATES = ("training_metrics", "matched_live_capacity")


def masked_corr(x: Matrix, y: np.ndarray) -> np.ndarray:
    """[p, C] Pearson r of every feature with every concept, each concept over its own finite rows (the
    published masked_feature_concept_correlations); a concept with fewer than three finite values is refused."""
    y = np.asarray(y, dtype=np.float64)
    out = np.zeros((x.shape[1], y.shape[1]))
    rows = sp.csr_matrix(x) if sp.issparse(x) else np.asarray(x)
    for c in range(y.shape[1]):
        ok = np.isfinite(y[:, c])
        if ok.sum() < 3:
            raise ValueError(f"concept {c} has {int(ok.sum())} finite train values: a masked correlation needs 3")
        out[:, c] = feature_concept_corr(rows[np.flatnonzero(ok)], y[ok, c:c + 1])[:, 0]
    return out


def masked_ridge_readout(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                         alphas: Sequence[float]) -> Readout:
    """One ridge per concept on its finite train rows (intercept, unscaled features: the published
    fit_masked_ridge_readout's sklearn Ridge, in closed form), alpha by |r| on its finite validation rows (the
    first alpha, then only a strictly better one)."""
    x_train, x_val = np.asarray(x_train, dtype=np.float64), np.asarray(x_val, dtype=np.float64)
    y_train, y_val = np.asarray(y_train, dtype=np.float64), np.asarray(y_val, dtype=np.float64)
    d, c_n = x_train.shape[1], y_train.shape[1]
    coef, intercept = np.zeros((d, c_n)), np.zeros(c_n)
    alpha, val_r = np.zeros(c_n), np.zeros(c_n)
    for c in range(c_n):
        tr, va = np.isfinite(y_train[:, c]), np.isfinite(y_val[:, c])
        if tr.sum() < 3 or va.sum() < 3:
            raise ValueError(f"concept {c}: {int(tr.sum())} finite train and {int(va.sum())} finite validation "
                             "values; a masked readout needs 3 of each")
        xm, ym = x_train[tr].mean(axis=0), y_train[tr, c].mean()
        xc, yc = x_train[tr] - xm, y_train[tr, c] - ym
        lam, vec = np.linalg.eigh(xc.T @ xc)
        proj = vec.T @ (xc.T @ yc)
        best = None
        for a in alphas:
            w = vec @ (proj / (np.maximum(lam, 0.0) + a))
            score = float(abs(paired_corr((x_val[va] @ w)[:, None], y_val[va, c:c + 1])[0]))
            if best is None or score > best[0]:
                best = (score, a, w)
        val_r[c], alpha[c], coef[:, c] = best
        intercept[c] = ym - xm @ coef[:, c]
    return Readout(coef, intercept, alpha, val_r)


def candidate_pool(train_codes: Matrix, kind: str) -> np.ndarray:
    """The target-independent latent universe subsets are drawn from: every latent, or those firing on a train
    record (`train_live`)."""
    if kind not in CANDIDATE_POOLS:
        raise ValueError(f"candidate_pool must be one of {list(CANDIDATE_POOLS)}, got {kind!r}")
    n = train_codes.shape[1]
    if kind == "all":
        return np.arange(n, dtype=np.int64)
    counts = train_codes.getnnz(axis=0) if sp.issparse(train_codes) else np.count_nonzero(train_codes, axis=0)
    return np.flatnonzero(np.asarray(counts).reshape(-1) > 0).astype(np.int64)


def pool_subsets(pool: np.ndarray, n_latents: int, budget: int, count: int, seed: int) -> list[np.ndarray]:
    """Subset r: budget latents of the pool drawn by default_rng(seed + r) (the published
    deterministic_feature_subset over every latent, deterministic_subset_from_candidates over a smaller pool)."""
    pool = np.asarray(pool, dtype=np.int64)
    if len(pool) < budget:
        raise ValueError(f"the candidate pool holds {len(pool)} latents, fewer than the budget {budget}")
    if len(pool) == budget:
        return [np.sort(pool)] * count
    if len(pool) == n_latents:  # deterministic_feature_subset draws from the count, not the array
        return [np.sort(np.random.default_rng(seed + r).choice(n_latents, budget, replace=False).astype(np.int64))
                for r in range(count)]
    return [np.sort(np.random.default_rng(seed + r).choice(pool, budget, replace=False)) for r in range(count)]


def quality_pass(metrics: Mapping[str, float], n_latents: int, gate: str, min_r2: float, min_live: int) -> bool:
    """The SAE seed's quality gate: its own fidelity gate (`training_metrics`: raybench's gate_pass, docs/protocol.md
    §7.2) or validation R^2 >= min_r2 and round(N (1 - validation dead fraction)) >= min_live live latents
    (`matched_live_capacity`, the published matched_live_capacity_quality)."""
    if gate not in QUALITY_GATES:
        raise ValueError(f"quality_gate must be one of {list(QUALITY_GATES)}, got {gate!r}")
    if gate == "training_metrics":
        return bool(metrics["gate_pass"])
    live = int(round(int(n_latents) * (1.0 - float(metrics["val_dead_fraction"]))))
    return bool(float(metrics["val_r2"]) >= min_r2 and live >= min_live)
