"""The random streams of the evaluation: the published protocol's generators, and raybench's chunked ones.

`inference.stream: published` (the `paper` preset) makes every evaluation draw the exact generator call,
seed and draw order of the protocol's public code (JayDuan123/2027-kdd-ECG-InterpBench, commit de4e19d), so
bootstrap intervals, rank probabilities and permutation floors equal the published ones draw for draw:

- patient bootstrap (scripts/run_multiscale_sae_patient_bootstrap.py; seed 20260714, 2,000 draws): ONE
  `np.random.default_rng(seed)`; the draws are rows of `rng.multinomial(P, full(P, 1/P), size=chunk)` taken in
  order.  The rows do not depend on the chunk size (tested), so the driver draws them in order and hands
  chunks to Ray tasks; the result does not depend on the number of workers.  The P columns are the evaluated
  test patients (those with at least one evaluated record) sorted by their id string.
- crossed bootstrap (scripts/analyze_multiscale_sae_inference.py; seed 20260714, 10,000 draws): ONE
  `default_rng(seed)`; per draw `rng.choice(depths, D)` then `rng.choice(seeds, S)` (with replacement) over
  the depth units and the SAE seeds in ascending order; the same draws for every metric and model.
- permutation floor of reproducibility (scripts/analyze_multiscale_sae_stability.py; 100 pairings): per
  seed pair a fresh `default_rng(floor_seed(model, layer, depth, E, arm, seed_i, seed_j))`, then
  `rng.permutation(m)` per pairing.
- random dictionaries (scripts/run_accessibility_baselines_v2_worker.py; 20 dictionaries, seeds 920000 + i):
  see raybench.analysis.secondary.estimators.random_directions (one stream for every preset).

`inference.stream: chunked` (raybench's own, the `demo` preset): chunk i of the patient bootstrap draws from
child i of `SeedSequence(seed)`, the crossed bootstrap from children of `SeedSequence([seed, 1])`, and the
floor from one generator per (model, depth, E) - every chunk is independent, so Ray tasks draw their own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

STREAMS: tuple[str, ...] = ("published", "chunked")

# raybench model / arm ids -> the names the published code hashes into the permutation-floor seeds
PUBLISHED_MODEL_NAMES: dict[str, str] = {"cardiac_fm": "CARDIAC-FM", "csfm": "CSFM", "ecg_fm": "ECG-FM",
                                         "ecg_jepa": "ECG-JEPA", "hubert_ecg": "HuBERT-ECG", "st_mem": "ST-MEM"}
PUBLISHED_ARMS: dict[str, str] = {"primary": "fixed_k_over_d", "sensitivity": "fixed_k_over_n"}


def check_stream(stream: str) -> str:
    if stream not in STREAMS:
        raise ValueError(f"unknown random stream {stream!r}; choose from {list(STREAMS)}")
    return stream


# ---------------------------------------------------------------- patient bootstrap


def published_patient_counts(seed: int, n_draws: int, n_patients: int, chunk_draws: int) -> Iterator[np.ndarray]:
    """The published patient-bootstrap draws, in order, as float64 count chunks [<= chunk_draws, P]."""
    if n_patients < 1 or n_draws < 1 or chunk_draws < 1:
        raise ValueError(f"need n_patients, n_draws, chunk_draws >= 1, got {n_patients}, {n_draws}, {chunk_draws}")
    rng = np.random.default_rng(seed)
    p = np.full(n_patients, 1.0 / n_patients, dtype=np.float64)
    for start in range(0, n_draws, chunk_draws):
        yield rng.multinomial(n_patients, p, size=min(chunk_draws, n_draws - start)).astype(np.float64)


# ---------------------------------------------------------------- crossed bootstrap


def published_crossed_indices(seed: int, n_draws: int, n_depths: int, n_seeds: int) -> tuple[np.ndarray, np.ndarray]:
    """The published crossed-bootstrap draws: positions of the resampled depth units [draws, D] and seeds
    [draws, S] (into the units sorted ascending), one generator, depths then seeds within each draw."""
    rng = np.random.default_rng(seed)
    di = np.empty((n_draws, n_depths), dtype=np.int64)
    si = np.empty((n_draws, n_seeds), dtype=np.int64)
    for n in range(n_draws):
        di[n] = rng.choice(n_depths, size=n_depths, replace=True)
        si[n] = rng.choice(n_seeds, size=n_seeds, replace=True)
    return di, si


def index_counts(idx: np.ndarray, n_units: int) -> np.ndarray:
    """Resampled positions [draws, k] -> how often each unit was drawn [draws, n_units] (float64)."""
    idx = np.asarray(idx, dtype=np.int64)
    rows = np.arange(idx.shape[0])[:, None] * n_units
    return np.bincount((rows + idx).ravel(), minlength=idx.shape[0] * n_units).reshape(
        idx.shape[0], n_units).astype(np.float64)


# ---------------------------------------------------------------- permutation floor


def floor_seed(model: str, layer: int, depth: float, expansion: float, arm: str, seed_i: int, seed_j: int) -> int:
    """Seed of the published permutation floor of one seed pair.

    The published code hashes the text "MODEL|layer|depth|E|arm|seed_i|seed_j" with the manifest's types
    (display model name, int layer, float depth and E as Python prints them, e.g. "0.25" and "8.0", the arm's
    long name), takes the first 8 bytes of the SHA-256 little-endian, modulo 2^32.  raybench ids are mapped.
    """
    parts = (PUBLISHED_MODEL_NAMES.get(model, model), int(layer), float(depth), float(expansion),
             PUBLISHED_ARMS.get(arm, arm), int(seed_i), int(seed_j))
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") % (2**32)
