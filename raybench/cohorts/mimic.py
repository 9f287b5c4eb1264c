"""MIMIC-IV-ECG (external replication): split by subject, measure the concepts, write the manifest.

The published files are read by `raybench.cohorts.mimic_tables`; which studies enter is the record pool
(`raybench.cohorts.mimic_pool`, config `cohort.record_pool`: published | all).

The manifest is the shared format (`raybench.cohorts.manifest.finish_manifest`): ecg_id = study_id,
patient_id = subject_id as written, split = `mimic_split(subject_id)` (0-6 train, 7 val, 8-9 test),
site "BIDMC", device = the machine's cart_id, and the seven concepts measured on the waveform
(`raybench.cohorts.waveform_concepts`; concept_source "waveform"). The machine's own measurements stay
beside them as raw `mm_<name>` float64 columns (NaN for 29999) for cross-checking only.
The summary names the pool rule, the ICD link, the extractor (`concept_extractor`, config
`cohort.concept_extractor`: published | refined) and the complete-case counts per split (records with all
seven concepts; what `eval.missing_concepts: complete_case` evaluates on), and the median agreement of the
waveform intervals with the machine's.

Privacy: MIMIC-IV-ECG is credentialed data. Record-level identifiers (subject_id, study_id, paths,
cart ids) and record-level values never leave the user's environment: the manifest, quarantine.csv
and concept tables are written to `out_dir` beside the data and must not be shared; summary.json holds
aggregates only (counts, means, agreement statistics) and is what may be exported.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.manifest import finish_manifest
from raybench.cohorts.mimic_pool import (
    RECORD_POOLS,
    SELECTION_SALT,
    check_studies,
    published_pool,
    select_studies,
)
from raybench.cohorts.mimic_tables import FS, MEASUREMENTS, N_SAMPLES, read_machine_measurements, read_record_list
from raybench.cohorts.panel import concept_names, heart_rate_bpm, mimic_concepts, with_rate_concept
from raybench.cohorts.split import MIMIC_SPLIT_RULE, mimic_split
from raybench.cohorts.waveform49 import waveform49_values
from raybench.cohorts.waveform_concepts import check_extractor, waveform_concept_values

SITE = "BIDMC"  # every MIMIC-IV-ECG study comes from Beth Israel Deaconess Medical Center
EXTRACTOR_NOTES = {
    "published": "the protocol's published extractor: lead-II detector marks and DWT points paired by position "
                 "after dropping missing points, raw (unreferenced) 12-lead amplitudes, 6 significant digits",
    "refined": "raybench's refined extractor: 12-lead QRS bounds, per-beat pairing, PR-baseline-referenced "
               "amplitudes at the lead-II R apex",
}
PRIVACY_NOTE = ("aggregate only; manifest.parquet and quarantine.csv hold record-level identifiers and must stay in "
                "the credentialed environment")


def build_mimic_manifest(root: str | Path, out_dir: str | Path, max_records: int | None = None,
                         num_cpus: int | None = None, concept_extractor: str = "refined",
                         record_pool: str = "all", admissions: str | Path | None = None,
                         rate_concept: str = "rr_mean_ms", concepts: str = "waveform") -> Path:
    """Validate the studies, measure the seven concepts, split by subject, standardize; write out_dir.

    concept_extractor: refined | published (raybench.cohorts.waveform_concepts); record_pool: all |
    published, with `admissions` (MIMIC-IV hosp/admissions.csv[.gz]) for the ICD link (mimic_pool);
    rate_concept: rr_mean_ms | heart_rate_bpm (60000 / RR, the published MIMIC run's; raybench.cohorts.panel).
    concepts: waveform (the seven concepts; anything but waveform49 reads as this, as MIMIC has no feature tables)
    or waveform49 (the 49-concept panel measured from the waveform, raybench.cohorts.waveform49; then
    concept_extractor and rate_concept only choose the published pool's extraction check).
    Writes out_dir/manifest.parquet (ordered by ecg_id = study_id), summary.json (aggregates only) and
    quarantine.csv (ecg_id, path, reason, detail). The manifest and quarantine hold record-level
    identifiers and stay in the user's environment (see module doc). Returns the manifest path.
    """
    check_extractor(concept_extractor)
    names = mimic_concepts(rate_concept)
    if record_pool not in RECORD_POOLS:
        raise ValueError(f"record_pool must be one of {list(RECORD_POOLS)}, got {record_pool!r}")
    root = Path(root).expanduser().resolve()
    listed = read_record_list(root)
    mm = read_machine_measurements(root)
    notes: list[str] = []
    summary: dict = {"cohort": "mimic", "sampling_rate": FS, "records_listed": int(len(listed)),
                     "concept_extractor": {"name": concept_extractor,
                                           "description": EXTRACTOR_NOTES[concept_extractor]},
                     "privacy": PRIVACY_NOTE}
    if record_pool == "published":
        good, values, quarantine = published_pool(root, listed, max_records, admissions, concept_extractor,
                                                  num_cpus, notes, summary)
    else:
        rl = select_studies(listed, max_records)
        good, quarantine = check_studies(root, rl)
        values = None
        summary["record_pool"] = {"rule": "all", "listed": int(len(listed)), "selected": int(len(rl)),
                                  "target": max_records, "icd_link": "not applied (record_pool: all)",
                                  "icd_linked": None}
        summary["records_selected"] = int(len(rl))
        summary["selection"] = ("all" if len(rl) == len(listed) else
                                f"{len(rl)} smallest sha256('{SELECTION_SALT}:' + study_id)")
    records = pd.DataFrame({
        "ecg_id": good["study_id"].to_numpy(np.int64),
        "patient_id": good["subject_id"].astype(str).to_numpy(),
        "split": [mimic_split(int(s)) for s in good["subject_id"]],
        "site": SITE,
        "device": "",
        "path": good["path"].to_numpy(),
        "fs": np.full(len(good), FS, dtype=np.int64),
        "n_samples": np.full(len(good), N_SAMPLES, dtype=np.int64),
    }).sort_values("ecg_id", kind="stable").reset_index(drop=True)
    mm_cols: list[str] = []
    if mm is not None:
        matched = mm.reindex(records["ecg_id"])
        records["device"] = matched["cart_id"].fillna("").astype(str).to_numpy()
        mm_cols = [c for c in matched.columns if c.startswith("mm_")]
        for c in mm_cols:
            records[c] = matched[c].to_numpy(np.float64)
        unmatched = int(matched["cart_id"].isna().sum())
        if unmatched:
            notes.append(f"{unmatched} studies have no machine_measurements.csv row (mm_ columns NaN)")
    else:
        notes.append(f"{MEASUREMENTS} not found: no mm_ cross-check columns (concepts are unaffected)")
    source = "waveform"
    if concepts == "waveform49":
        values = waveform49_values(root, records, num_cpus, notes, summary)
        names, source = concept_names(), "waveform49"
    else:
        if values is None:
            values = waveform_concept_values(root, records, num_cpus, notes, summary, concept_extractor)
        values = with_rate_concept(values, rate_concept)

    def describe(df: pd.DataFrame) -> dict:
        return {"machine_agreement": _agreement(df) if mm is not None else {}}

    return finish_manifest(out_dir, records, root, values, names, source, quarantine, notes,
                           summary, MIMIC_SPLIT_RULE, extra_columns=mm_cols, describe=describe)


def _agreement(df: pd.DataFrame) -> dict:
    """Aggregate agreement of waveform concepts with the machine's measurements (median |diff|, n)."""
    rr = df.get("mm_rr_interval")
    pairs = {
        "rr_mean_ms": rr,
        "heart_rate_bpm": None if rr is None else pd.Series(heart_rate_bpm(rr.to_numpy(np.float64)), index=rr.index),
        "qrs_duration_ms": _diff(df, "mm_qrs_end", "mm_qrs_onset"),
        "pr_interval_ms": _diff(df, "mm_qrs_onset", "mm_p_onset"),
        "qt_like_ms": _diff(df, "mm_t_end", "mm_qrs_onset"),
    }
    out = {}
    for name, machine in pairs.items():
        if machine is None or f"raw_{name}" not in df:
            continue
        d = (df[f"raw_{name}"] - machine).to_numpy(np.float64)
        d = d[np.isfinite(d)]
        if d.size:
            out[name] = {"n": int(d.size), "median_diff": float(np.median(d)),
                         "median_abs_diff": float(np.median(np.abs(d)))}
    return out


def _diff(df: pd.DataFrame, a: str, b: str) -> pd.Series | None:
    return df[a] - df[b] if a in df and b in df else None
