"""Training batch samplers (docs/protocol.md §6.5), one per SAE, each from np.random.default_rng(cell seed).

`per_step` (the published loop) draws rng.choice(n, batch, replace=False) afresh every step; `epoch` walks a
fresh permutation per epoch and drops the remainder. `state()`/`load()` round-trip a sampler exactly (the
trial checkpoint holds them as plain ints and arrays).
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np


class EpochSampler:
    """Batches without replacement: a fresh permutation per epoch; a remainder shorter than B is dropped."""

    def __init__(self, n: int, batch: int, seed: int):
        if n < batch:
            raise ValueError(f"training split has {n} records, fewer than batch_size={batch}: lower sae.batch_size")
        self.n, self.batch = n, batch
        self.rng = np.random.default_rng(seed)
        self.perm = self.rng.permutation(n)
        self.pos = 0

    def next(self) -> np.ndarray:
        if self.pos + self.batch > self.n:
            self.perm = self.rng.permutation(self.n)
            self.pos = 0
        out = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return out

    def state(self) -> dict[str, Any]:
        return {"rng": copy.deepcopy(self.rng.bit_generator.state), "perm": self.perm.copy(), "pos": self.pos}

    def load(self, st: dict[str, Any]) -> None:
        self.rng.bit_generator.state = copy.deepcopy(st["rng"])
        self.perm = np.asarray(st["perm"]).copy()
        self.pos = int(st["pos"])


class PerStepSampler:
    """The published sampler: rng.choice(n, min(batch, n), replace=False) drawn independently every step."""

    def __init__(self, n: int, batch: int, seed: int):
        self.n, self.batch = n, min(batch, n)
        self.rng = np.random.default_rng(seed)

    def next(self) -> np.ndarray:
        return self.rng.choice(self.n, size=self.batch, replace=False)

    def state(self) -> dict[str, Any]:
        return {"rng": copy.deepcopy(self.rng.bit_generator.state)}

    def load(self, st: dict[str, Any]) -> None:
        self.rng.bit_generator.state = copy.deepcopy(st["rng"])


BatchSampler = EpochSampler | PerStepSampler
SAMPLER_CLASSES: dict[str, type[BatchSampler]] = {"epoch": EpochSampler, "per_step": PerStepSampler}
