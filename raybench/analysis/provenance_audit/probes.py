"""Recover (docs/protocol.md §12.2): a calibrated multinomial logistic probe of provenance u from a frozen
embedding, and its LPI: bits of u per record that the probe recovers beyond the prevalence-only predictor.

LPI = CE(prior) - CE(probe) on held-out records, in bits; the prior is the train prevalence of u. The probe's
L2 strength is chosen on validation by cross-entropy, then a temperature is fitted on validation (Guo et al.'s
temperature scaling), so a confident-but-wrong probe cannot earn bits. Intervals: patient bootstrap (patients
are the resampling unit) of the per-record bit differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

LN2 = float(np.log(2.0))
PRIOR_FLOOR = 1e-6  # a class absent from train keeps a finite cross-entropy


@dataclass(frozen=True)
class Scaler:
    """Train-split standardization every probe and head applies first."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Scaler:
        x = np.asarray(x, dtype=np.float64)
        return cls(x.mean(0), np.maximum(x.std(0), 1e-8))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.mean) / self.std


@dataclass(frozen=True)
class Probe:
    """A fitted linear probe: logits = x @ coef.T + intercept, divided by temperature."""

    coef: np.ndarray  # [K, d] (K = 1 for a binary probe: the logit of class 1)
    intercept: np.ndarray  # [K]
    classes: np.ndarray  # [K'] class codes
    c: float
    temperature: float = 1.0

    def logits(self, x: np.ndarray) -> np.ndarray:
        z = x @ self.coef.T + self.intercept
        if self.coef.shape[0] == 1:  # binary: logits (0, z)
            z = np.concatenate([np.zeros_like(z), z], axis=1)
        return z / self.temperature

    def log_proba(self, x: np.ndarray) -> np.ndarray:
        return log_softmax(self.logits(x), axis=1)


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float, sample_weight: np.ndarray | None = None) -> Probe:
    """L2 logistic regression (multinomial for > 2 classes) with scikit-learn's lbfgs."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(C=c, max_iter=1000)
    model.fit(x, y, sample_weight=sample_weight)
    return Probe(model.coef_.copy(), model.intercept_.copy(), model.classes_.copy(), float(c))


def class_index(classes: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Position of each label in `classes` (labels must be among them)."""
    idx = np.searchsorted(classes, y)
    if np.any(idx >= len(classes)) or np.any(classes[np.minimum(idx, len(classes) - 1)] != y):
        raise ValueError("labels outside the probe's classes")
    return idx


def nll(log_proba: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Per-record negative log-likelihood in nats."""
    return -log_proba[np.arange(len(idx)), idx]


def fit_temperature(logits: np.ndarray, idx: np.ndarray) -> float:
    """The T > 0 that minimizes the mean NLL of softmax(logits / T) (searched on log T in [-4, 4])."""
    def loss(log_t: float) -> float:
        return float(nll(log_softmax(logits / np.exp(log_t), axis=1), idx).mean())

    res = minimize_scalar(loss, bounds=(-4.0, 4.0), method="bounded", options={"xatol": 1e-4})
    return float(np.exp(res.x))


def calibrated_probe(x_tr: np.ndarray, y_tr: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
                     c_grid: tuple[float, ...]) -> Probe:
    """Fit on train at every C, keep the one with the lowest validation cross-entropy, then temperature-scale
    it on validation. Inputs are already standardized."""
    best: tuple[float, Probe] | None = None
    for c in c_grid:
        probe = fit_logistic(x_tr, y_tr, c)
        loss = float(nll(probe.log_proba(x_val), class_index(probe.classes, y_val)).mean())
        if best is None or loss < best[0] - 1e-12:
            best = (loss, probe)
    assert best is not None
    probe = best[1]
    t = fit_temperature(probe.logits(x_val), class_index(probe.classes, y_val))
    return Probe(probe.coef, probe.intercept, probe.classes, probe.c, t)


def prior_log_proba(y_tr: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """log of the train prevalence of each class [K] (floored, renormalized)."""
    p = np.array([(y_tr == k).mean() for k in classes], dtype=np.float64)
    p = np.maximum(p, PRIOR_FLOOR)
    return np.log(p / p.sum())


def lpi_terms(log_proba: np.ndarray, prior_log: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Per-record bits the probe saves over the prior: -log2 prior(u) - (-log2 probe(u)). Their mean is LPI."""
    return (-prior_log[idx] - nll(log_proba, idx)) / LN2


def entropy_bits(prior_log: np.ndarray, idx: np.ndarray) -> float:
    """Cross-entropy of the prior on these records, in bits (LPI's ceiling)."""
    return float(np.mean(-prior_log[idx]) / LN2)


# ---------------------------------------------------------------- patient bootstrap

def patient_codes(patients: np.ndarray) -> tuple[np.ndarray, int]:
    """Patient ids -> (code per record, number of patients)."""
    _, codes = np.unique(np.asarray(patients).astype(str), return_inverse=True)
    return codes.astype(np.int64), int(codes.max()) + 1 if len(codes) else 0


def patient_draws(n_patients: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """[draws, n_patients] multiplicities: each draw resamples the patients with replacement."""
    return rng.multinomial(n_patients, np.full(n_patients, 1.0 / n_patients), size=draws).astype(np.float64)


def record_weights(counts: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Patient multiplicities [draws, P] -> record weights [draws, n] (every record of a patient inherits it)."""
    return counts[:, codes]


def bootstrap_mean(values: np.ndarray, codes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Per draw, the record mean of `values` over the resampled patients -> [draws]."""
    n_pat = counts.shape[1]
    sums = np.bincount(codes, weights=values, minlength=n_pat)
    ns = np.bincount(codes, minlength=n_pat).astype(np.float64)
    return (counts @ sums) / np.maximum(counts @ ns, 1e-12)


def interval(draws: np.ndarray, level: float = 95.0) -> tuple[float, float]:
    """Percentile interval of bootstrap draws (NaN draws ignored)."""
    d = np.asarray(draws, dtype=np.float64)
    d = d[np.isfinite(d)]
    if d.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(d, [(100 - level) / 2, 100 - (100 - level) / 2])
    return float(lo), float(hi)
