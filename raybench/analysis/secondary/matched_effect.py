"""Matched-effect interventions (docs/protocol.md §9): clamp k coordinates to their high-concept train
centroid, map the change through the readouts, and score target change, off-target RMS and the
wrong-behavior index at a dose that gives every arm the same validation target effect.

Pure numpy, independent of the run folder; intervention.py runs it per model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


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
    finite = np.isfinite(y)  # missing labels (the MIMIC design keeps them as NaN) join neither quantile nor centroid
    if not finite.any():
        raise ValueError("no finite train value of the target concept: cannot form a centroid")
    high = finite & (y >= np.quantile(y[finite], high_quantile))
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


RECORD_METRICS = ("target_delta", "off_cross_rms", "off_all_rms", "off_max_abs", "activation_l2")  # published


def record_metrics(unit: UnitIntervention, target: int, families: Sequence[str], dose: float) -> np.ndarray:
    """Per test record at `dose`: target change, cross-family and all off-target RMS, the largest off-target
    |change| (off_max_abs), state L2 -> [n, 5] (benchmark_v1/matched_effect.py calibrated_record_metrics)."""
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
        np.max(np.abs(delta[:, other]), axis=1),
        unit.test_l2 * dose,
    ])


def wrong_behavior_index(target_delta: np.ndarray | float, off_rms: np.ndarray | float) -> np.ndarray:
    """WBI = off-target RMS / |target effect| (lower is more selective)."""
    return np.asarray(off_rms, dtype=np.float64) / np.maximum(np.abs(np.asarray(target_delta, np.float64)), 1e-8)
