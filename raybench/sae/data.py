"""Inputs of one cell: stored activations, standardized concepts, test patients and the selection subset.

Everything here is determined by the manifest and the protocol, so every cell of the atlas sees the same
selection subset and the same test-patient order (which the paired bootstrap relies on).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.config import EvalProtocol

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class CellData:
    acts: dict[str, np.ndarray]  # split -> [n, d] raw float32 activations
    concepts: dict[str, np.ndarray]  # split -> [n, C] standardized concepts
    concept_names: tuple[str, ...]
    test_patient_codes: np.ndarray  # [n_test] int, codes into test_patients
    test_patients: tuple[str, ...]  # sorted test patient ids (same for every cell)
    selection_idx: np.ndarray  # positions into acts["train"]


def selection_ecg_ids(manifest: pd.DataFrame, eval_cfg: EvalProtocol) -> np.ndarray:
    """The fixed, deterministic train subset used for single-coordinate selection (sorted ecg_ids)."""
    train_ids = np.sort(manifest.loc[manifest["split"] == "train", "ecg_id"].to_numpy(np.int64))
    if len(train_ids) <= eval_cfg.selection_records:
        return train_ids
    rng = np.random.default_rng(eval_cfg.selection_seed)
    return np.sort(rng.choice(train_ids, size=eval_cfg.selection_records, replace=False))


def test_patients(manifest: pd.DataFrame) -> tuple[str, ...]:
    return tuple(sorted(manifest.loc[manifest["split"] == "test", "patient_id"].astype(str).unique()))


def load_cell_data(run_root: str | Path, model: str, layer: int, eval_cfg: EvalProtocol) -> CellData:
    """Align the activation store of (model, layer) with the manifest rows it holds."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.encoders.store import ActivationStore
    from raybench.paths import RunLayout

    layout = RunLayout.at(run_root)
    manifest, info = load_manifest(layout.manifest)
    store = ActivationStore(layout.activations_dir)
    names = tuple(info.concepts)
    by_id = manifest.set_index("ecg_id")
    acts, concepts, ids = {}, {}, {}
    for split in SPLITS:
        acts[split] = np.asarray(store.load(model, layer, split, mmap=False), dtype=np.float32)
        ids[split] = np.asarray(store.ecg_ids(model, layer, split), dtype=np.int64)
        if names:
            concepts[split] = by_id.loc[ids[split], list(names)].to_numpy(np.float32)
        else:
            concepts[split] = np.zeros((len(ids[split]), 0), np.float32)
    patients = test_patients(manifest)
    code_of = {p: i for i, p in enumerate(patients)}
    test_codes = np.array([code_of[str(p)] for p in by_id.loc[ids["test"], "patient_id"]], dtype=np.int64)
    selected = selection_ecg_ids(manifest, eval_cfg)
    selection_idx = np.flatnonzero(np.isin(ids["train"], selected))
    return CellData(acts, concepts, names, test_codes, patients, selection_idx)
