"""A planted provenance shortcut for the synthetic cohort, so the provenance audit (docs/protocol.md §12) can be
tested by construction.

`ProvenancePlant` adds (1) a device artifact - a constant baseline offset or 50 Hz mains hum on every lead of
the records of one device - and (2) a planted diagnosis: each record is NORM (P waves, regular rhythm) or
AFIB (no P waves, irregular RR) with P(NORM | artifact device) = (1 + a) / 2 and P(NORM | other devices) =
(1 - a) / 2 for association a in [-1, 1], drawn from a stream of its own so the rest of the cohort is the one
the same seed gives without a plant. `aligned` puts the artifact on the AFIB records as well: the task signal
then lives where the provenance does. The default cohort has no plant (no artifact, no association).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

HUM_HZ = 50.0
AFIB_RR_VAR = 0.15  # beat-to-beat RR variation of a planted AFIB record (patients' own: 0.005-0.06)
PLANT_STREAM = 7919  # second word of the plant's seed sequence


@dataclass(frozen=True)
class ProvenancePlant:
    """What to plant (module doc)."""

    artifact: Literal["none", "offset", "hum"] = "none"
    amplitude_mv: float = 0.3
    device: str = "CS-12   E"
    association: float | None = None  # None: keep the cohort's own diagnoses
    aligned: bool = False

    def validate(self) -> None:
        if self.artifact not in ("none", "offset", "hum"):
            raise ValueError(f"artifact must be none, offset or hum, got {self.artifact!r}")
        if self.association is not None and not -1.0 <= self.association <= 1.0:
            raise ValueError(f"association must lie in [-1, 1], got {self.association}")
        if not self.amplitude_mv >= 0:
            raise ValueError(f"amplitude_mv must be >= 0, got {self.amplitude_mv}")

    @property
    def active(self) -> bool:
        return self.artifact != "none" or self.association is not None

    def params(self) -> dict:
        return asdict(self)


def plant_labels(rec: dict[str, np.ndarray], devices: list[str], plant: ProvenancePlant, seed: int) -> None:
    """Redraw each record's diagnosis (rec['p_present'], rec['rr_var']) in place with the planted association."""
    if plant.association is None:
        return
    rng = np.random.default_rng([seed, PLANT_STREAM])
    on = np.array([d == plant.device for d in devices])
    p_norm = np.where(on, (1 + plant.association) / 2, (1 - plant.association) / 2)
    norm = rng.random(len(devices)) < p_norm
    rec["p_present"] = norm
    rec["rr_var"] = np.where(norm, rec["rr_var"], AFIB_RR_VAR)


def artifact(plant: ProvenancePlant, device: str, norm: bool, t_ms: np.ndarray, phase: float) -> np.ndarray | float:
    """The artifact added to one record's [12, T] signal (mV) at sample times t_ms; 0 when none applies."""
    hit = device == plant.device or (plant.aligned and not norm)
    if plant.artifact == "none" or not hit:
        return 0.0
    if plant.artifact == "offset":
        return plant.amplitude_mv
    return plant.amplitude_mv * np.sin(2 * np.pi * HUM_HZ * t_ms / 1000.0 + phase)[None, :]
