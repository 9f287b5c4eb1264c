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
import itertools
import math
from collections.abc import Iterator, Sequence

import numpy as np

from raybench.analysis.inference.packed_stats import PatientStats, StatsError
from raybench.core.models import PUBLISHED_NAMES

STREAMS: tuple[str, ...] = ("published", "chunked")

# raybench model / arm ids -> the names the published code hashes into the permutation-floor seeds
PUBLISHED_MODEL_NAMES: dict[str, str] = PUBLISHED_NAMES  # raybench.core.models
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


def pair_floor_seeds(stream: str, model: str, layer: int, q: float, expansion: int, arm: str,
                     seeds: Sequence[int]) -> list[int] | None:
    """Published stream: the floor seed of each seed pair (i < j of `seeds` ascending); chunked: None."""
    if stream != "published":
        return None
    return [floor_seed(model, layer, q, expansion, arm, a, b) for a, b in itertools.combinations(sorted(seeds), 2)]


def chunked_floor_seed(base: int, model: str, q: float, expansion: int) -> int:
    """Chunked stream: the permutation floor's one generator seed per model x depth x E (drawn across the pairs)."""
    return int.from_bytes(hashlib.sha256(f"{base}:{model}:{q:g}:{expansion}".encode()).digest()[:8], "big")


# ---------------------------------------------------------------- raybench's chunked stream, and the dispatch


def n_chunks(n_draws: int, chunk_draws: int) -> int:
    return math.ceil(n_draws / chunk_draws)


def patient_counts(seed: int, n_draws: int, chunk_draws: int, n_patients: int, chunk: int) -> np.ndarray:
    """Multinomial patient counts [draws_in_chunk, P] of one chunk; chunk i uses child i of one SeedSequence."""
    children = np.random.SeedSequence(seed).spawn(n_chunks(n_draws, chunk_draws))
    size = min(chunk_draws, n_draws - chunk * chunk_draws)
    rng = np.random.default_rng(children[chunk])
    return rng.multinomial(n_patients, np.full(n_patients, 1.0 / n_patients), size=size).astype(np.float64)


def crossed_indices(seed: int, n_draws: int, chunk_draws: int, n_depths: int, n_seeds: int,
                    chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunked stream: resampled positions of depth units [draws, D] and seeds [draws, S] of one chunk.

    Its own SeedSequence([seed, 1]) so its draws never coincide with the patient bootstrap's.
    """
    children = np.random.SeedSequence([seed, 1]).spawn(n_chunks(n_draws, chunk_draws))
    size = min(chunk_draws, n_draws - chunk * chunk_draws)
    rng = np.random.default_rng(children[chunk])
    di = rng.integers(0, n_depths, size=(size, n_depths))
    si = rng.integers(0, n_seeds, size=(size, n_seeds))
    return di, si


def crossed_counts(seed: int, n_draws: int, chunk_draws: int, n_depths: int, n_seeds: int,
                   chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunked stream: resampling counts of depth units [draws, D] and seeds [draws, S] of one chunk."""
    di, si = crossed_indices(seed, n_draws, chunk_draws, n_depths, n_seeds, chunk)
    return index_counts(di, n_depths), index_counts(si, n_seeds)


def crossed_draw_indices(seed: int, n_draws: int, chunk_draws: int, n_depths: int, n_seeds: int,
                         stream: str = "chunked") -> tuple[np.ndarray, np.ndarray]:
    """Every crossed draw of a stream: positions of the depth units [draws, D] and seeds [draws, S]."""
    if check_stream(stream) == "published":
        return published_crossed_indices(seed, n_draws, n_depths, n_seeds)
    parts = [crossed_indices(seed, n_draws, chunk_draws, n_depths, n_seeds, c)
             for c in range(n_chunks(n_draws, chunk_draws))]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def patient_draws(stats: PatientStats | int, n_draws: int, seed: int, chunk_draws: int,
                  stream: str = "chunked", active: np.ndarray | None = None) -> Iterator[np.ndarray]:
    """The patient-count chunks [<= chunk_draws, P] a patient bootstrap of `stats` uses, in draw order.

    stats: the packed statistics (or just P, with `active` when not all P are).  The published stream draws over
    the active patients only and gives the others a count of 0; the chunked stream draws over all P.
    """
    n_patients = stats if isinstance(stats, int) else stats.n_patients
    if check_stream(stream) == "chunked":
        for c in range(n_chunks(n_draws, chunk_draws)):
            yield patient_counts(seed, n_draws, chunk_draws, n_patients, c)
        return
    active = active if isinstance(stats, int) else stats.active
    if active is None or bool(np.all(active)):
        yield from published_patient_counts(seed, n_draws, n_patients, chunk_draws)
        return
    cols = np.flatnonzero(active)
    if cols.size == 0:
        raise StatsError("no test patient has an evaluated record; nothing to bootstrap")
    for part in published_patient_counts(seed, n_draws, int(cols.size), chunk_draws):
        full = np.zeros((part.shape[0], n_patients))
        full[:, cols] = part
        yield full


def crossed_chunk_draws(n_draws: int) -> int:
    """Draws per task of the run's crossed bootstrap (the chunked stream's draws depend on it)."""
    return max(1, n_draws // 4)
