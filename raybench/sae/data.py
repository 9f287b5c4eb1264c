"""Inputs of one cell: stored activations, standardized concepts, test patients and the selection subset.

Everything here is determined by the manifest and the protocol, so every cell of the atlas sees the same
selection subset and the same test-patient order (which the paired bootstrap relies on).

Missing concepts (`eval.missing_concepts`, resolved by `missing_policy`): the manifest stores standardized
concepts with missing values as 0 and the raw values with NaN. `fill_zero` uses the 0s everywhere.
`complete_case` is what the published MIMIC-IV-ECG run did (the protocol's public code,
JayDuan123/2027-kdd-ECG-InterpBench: scripts/run_multiscale_sae_task.py with
--preserve-missing-concepts --complete-case-evaluation, run_multiscale_sae_patient_bootstrap.py with
--complete-case-concepts): the selection subset is still drawn from the whole train split, and each
concept's correlation there uses only the records where that concept is present (`selection_present`,
a per-concept mask); val and test keep only complete cases (every concept present), so fidelity, r,
firing rates and the per-patient bootstrap statistics come from complete cases, and the test patients
are those with at least one complete-case test record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import pandas as pd

from raybench.cohorts.manifest import RECORD_ORDER
from raybench.cohorts.split import SPLITS
from raybench.core.config import EvalProtocol
from raybench.core.protocol import check_choices

if TYPE_CHECKING:
    from raybench.cohorts.manifest import ManifestInfo

Policy = Literal["complete_case", "fill_zero"]
"""eval.missing_concepts once `auto` is resolved (module doc)."""


@dataclass(frozen=True)
class CellData:
    acts: dict[str, np.ndarray]  # split -> [n, d] raw float32 activations
    concepts: dict[str, np.ndarray]  # split -> [n, C] standardized concepts
    concept_names: tuple[str, ...]
    test_patient_codes: np.ndarray  # [n_test] int, codes into test_patients
    test_patients: tuple[str, ...]  # sorted test patient ids (same for every cell)
    selection_idx: np.ndarray  # positions into acts["train"]
    # complete_case: [len(selection_idx), C] bool, concept present on each selection record; None: fill_zero
    selection_present: np.ndarray | None = None
    missing_concepts: Policy = "fill_zero"  # the resolved policy (module doc)
    ecg_ids: dict[str, np.ndarray] | None = None  # split -> [n] ecg_id of each row of acts (feature dashboards)


def missing_policy(eval_cfg: EvalProtocol, concept_source: str) -> Policy:
    """eval.missing_concepts resolved: auto is complete_case for waveform-derived concepts, else fill_zero."""
    check_choices(eval_cfg, "eval")
    if eval_cfg.missing_concepts == "auto":
        return "complete_case" if concept_source == "waveform" else "fill_zero"
    return eval_cfg.missing_concepts


def concept_present(manifest: pd.DataFrame, names: tuple[str, ...] | list[str]) -> np.ndarray:
    """[n, C] bool: the raw value of each concept is finite (manifests without raw_ columns: all present)."""
    cols = [manifest[f"raw_{c}"].to_numpy(np.float64) if f"raw_{c}" in manifest.columns
            else np.zeros(len(manifest)) for c in names]
    return np.isfinite(np.stack(cols, axis=1)) if cols else np.ones((len(manifest), 0), dtype=bool)


def evaluation_rows(manifest: pd.DataFrame, names: tuple[str, ...] | list[str], policy: Policy) -> np.ndarray:
    """[n] bool: manifest rows that val/test evaluation uses (complete cases under complete_case)."""
    if policy == "complete_case":
        return concept_present(manifest, names).all(axis=1)
    return np.ones(len(manifest), dtype=bool)


def selection_ecg_ids(manifest: pd.DataFrame, eval_cfg: EvalProtocol) -> np.ndarray:
    """The fixed, deterministic train subset used for single-coordinate selection (sorted ecg_ids).

    The published draw (scripts/run_multiscale_sae_task.py): np.sort(default_rng(20260714).choice(train_idx,
    4096, replace=False)) with train_idx the train rows in the published activation order, which is ascending
    ecg_id within the split; choice over an array draws positions, so drawing from the ascending train ecg_ids
    with the same generator call picks the same records (eval.selection_seed; paper: 20260714). As published,
    a train split of at most selection_records records is used whole (docs/protocol.md §7.3). Pinned by
    tests/parity/test_parity_sae.py. A manifest with a RECORD_ORDER column (MIMIC-IV-ECG: the published
    records.csv order, ascending sha256 rank) is drawn over in that order instead (docs/protocol.md §2.3);
    pinned by tests/parity/test_parity_mimic.py.
    """
    train = manifest.loc[manifest["split"] == "train"]
    if RECORD_ORDER in train.columns:
        train = train.sort_values(RECORD_ORDER, kind="stable")
        train_ids = train["ecg_id"].to_numpy(np.int64)
    else:
        train_ids = np.sort(train["ecg_id"].to_numpy(np.int64))
    if len(train_ids) <= eval_cfg.selection_records:
        return np.sort(train_ids)
    rng = np.random.default_rng(eval_cfg.selection_seed)
    return np.sort(rng.choice(train_ids, size=eval_cfg.selection_records, replace=False))


def complete_case_selection_ecg_ids(manifest: pd.DataFrame, names: tuple[str, ...] | list[str],
                                    eval_cfg: EvalProtocol) -> np.ndarray:
    """The selection subset of the published secondary analyses under complete cases (sorted ecg_ids).

    scripts/run_accessibility_calibration_worker.py and run_final_layer_sparse_accessibility_worker.py with
    --complete-case-concepts first keep the train rows with every concept present, then draw the subset as
    selection_ecg_ids does, from those rows (docs/protocol.md §9.6).
    """
    return selection_ecg_ids(manifest.loc[evaluation_rows(manifest, names, "complete_case")], eval_cfg)


def complete_case_train(data: CellData, manifest: pd.DataFrame, eval_cfg: EvalProtocol) -> CellData:
    """`data` (complete_case) with its train split cut to complete cases and the selection subset redrawn
    among them (complete_case_selection_ecg_ids); val and test are complete cases already."""
    if data.missing_concepts != "complete_case" or data.ecg_ids is None:
        raise ValueError("complete_case_train needs complete_case cell data with its ecg_ids")
    names = data.concept_names
    present = pd.Series(evaluation_rows(manifest, names, "complete_case"), index=manifest["ecg_id"].to_numpy())
    ids = data.ecg_ids["train"]
    keep = present.loc[ids].to_numpy(bool)
    if not keep.any():
        raise ValueError(f"no train record has every concept ({list(names)})")
    kept = ids[keep]
    selection_idx = np.flatnonzero(np.isin(kept, complete_case_selection_ecg_ids(manifest, names, eval_cfg)))
    return replace(data, acts={**data.acts, "train": data.acts["train"][keep]},
                   concepts={**data.concepts, "train": data.concepts["train"][keep]},
                   ecg_ids={**data.ecg_ids, "train": kept}, selection_idx=selection_idx, selection_present=None)


def load_secondary_data(run_root: str | Path, model: str, layer: int, eval_cfg: EvalProtocol,
                        complete_cases: bool) -> CellData:
    """load_cell_data for the secondary analyses: under complete_case with `complete_cases` (the published
    rule, SecondaryConfig.complete_case_train), complete_case_train; otherwise the atlas's data as it is."""
    data = load_cell_data(run_root, model, layer, eval_cfg)
    if not complete_cases or data.missing_concepts != "complete_case":
        return data
    from raybench.cohorts.manifest import load_manifest
    from raybench.core.paths import RunLayout

    manifest, _ = load_manifest(RunLayout.at(run_root).manifest)
    return complete_case_train(data, manifest, eval_cfg)


def test_patients(manifest: pd.DataFrame, rows: np.ndarray | None = None) -> tuple[str, ...]:
    """Sorted test patient ids; `rows` ([n] bool, evaluation_rows) restricts to patients with such a record."""
    test = (manifest["split"] == "test").to_numpy()
    if rows is not None:
        test = test & np.asarray(rows, dtype=bool)
    return tuple(sorted(manifest.loc[test, "patient_id"].astype(str).unique()))


def evaluation_test_patients(manifest: pd.DataFrame, info: ManifestInfo, eval_cfg: EvalProtocol) -> tuple[str, ...]:
    """The test patients every cell's patient statistics use (`info`: the manifest's ManifestInfo)."""
    names = tuple(info.concepts)
    policy = missing_policy(eval_cfg, info.concept_source) if names else "fill_zero"
    return test_patients(manifest, evaluation_rows(manifest, names, policy))


def load_cell_data(run_root: str | Path, model: str, layer: int, eval_cfg: EvalProtocol) -> CellData:
    """Align the activation store of (model, layer) with the manifest rows it holds."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.core.paths import RunLayout
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(run_root)
    manifest, info = load_manifest(layout.manifest)
    store = ActivationStore(layout.activations_dir)
    names = tuple(info.concepts)
    policy = missing_policy(eval_cfg, info.concept_source) if names else "fill_zero"
    rows = evaluation_rows(manifest, names, policy)
    by_id = manifest.set_index("ecg_id")
    evaluated = pd.Series(rows, index=by_id.index)
    acts, concepts, ids = {}, {}, {}
    for split in SPLITS:
        acts[split] = np.asarray(store.load(model, layer, split, mmap=False), dtype=np.float32)
        ids[split] = np.asarray(store.ecg_ids(model, layer, split), dtype=np.int64)
        if split != "train" and policy == "complete_case":  # val/test: complete cases only
            keep = evaluated.loc[ids[split]].to_numpy(bool)
            if not keep.any():
                raise ValueError(f"{model} layer {layer}: no {split} record has every concept "
                                 f"({list(names)}); set eval.missing_concepts: fill_zero to evaluate anyway")
            acts[split], ids[split] = acts[split][keep], ids[split][keep]
        if names:
            concepts[split] = by_id.loc[ids[split], list(names)].to_numpy(np.float32)
        else:
            concepts[split] = np.zeros((len(ids[split]), 0), np.float32)
    patients = test_patients(manifest, rows)
    code_of = {p: i for i, p in enumerate(patients)}
    test_codes = np.array([code_of[str(p)] for p in by_id.loc[ids["test"], "patient_id"]], dtype=np.int64)
    selected = selection_ecg_ids(manifest, eval_cfg)
    selection_idx = np.flatnonzero(np.isin(ids["train"], selected))
    present = None
    if policy == "complete_case":
        mask = pd.DataFrame(concept_present(manifest, names), index=by_id.index)
        present = mask.loc[ids["train"][selection_idx]].to_numpy(bool)
    return CellData(acts, concepts, names, test_codes, patients, selection_idx, present, policy, ids)
