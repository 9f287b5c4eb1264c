"""MIMIC-IV-ECG (external replication): read the published layout, split by subject, write the manifest.

Published layout (PhysioNet MIMIC-IV-ECG 1.0):
    record_list.csv             subject_id, study_id, file_name, ecg_time, path
    machine_measurements.csv    subject_id, study_id, cart_id, ecg_time, report_0..report_17, bandwidth,
                                filtering, rr_interval, p_onset, p_end, qrs_onset, qrs_end, t_end,
                                p_axis, qrs_axis, t_axis   (ms / degrees; 29999 = not measured)
    files/pNNNN/p<subject>/s<study>/<study>.{hea,dat}   12 leads, 500 Hz, 5000 samples; header lead
                                order I II III aVR aVF aVL V1..V6 (read_record reorders to LEADS)

The manifest is the PTB-XL builder's format (raybench.cohorts.manifest): ecg_id = study_id,
patient_id = subject_id as written, split = `mimic_split(subject_id)` (0-6 train, 7 val, 8-9 test),
site "BIDMC", device = the machine's cart_id, and the seven concepts measured on the waveform
(raybench.cohorts.waveform_concepts; concept_source "waveform"). The machine's own measurements stay
beside them as raw `mm_<name>` float64 columns (NaN for 29999) for cross-checking only.

Privacy: MIMIC-IV-ECG is credentialed data. Record-level identifiers (subject_id, study_id, paths,
cart ids) and record-level values never leave the user's environment: the manifest, quarantine.csv
and concept tables are written to `out_dir` beside the data and must not be shared; summary.json holds
aggregates only (counts, means, agreement statistics) and is what may be exported.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.manifest import (
    QUARANTINE_COLUMNS,
    ManifestError,
    check_record,
    manifest_hash,
    standardize,
    write_manifest,
)
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.split import SPLITS, mimic_split
from raybench.io import atomic_path, write_json

RECORD_LIST = "record_list.csv"
MEASUREMENTS = "machine_measurements.csv"
MM_COLUMNS: tuple[str, ...] = ("rr_interval", "p_onset", "p_end", "qrs_onset", "qrs_end", "t_end",
                               "p_axis", "qrs_axis", "t_axis")
MM_MISSING = 29999  # the machine's "not measured" code
FS = 500
N_SAMPLES = 5000
SITE = "BIDMC"  # every MIMIC-IV-ECG study comes from Beth Israel Deaconess Medical Center
SELECTION_SALT = "mimic-main-v1"  # the protocol's deterministic record ranking (sha256 of salt:study_id)
SPLIT_RULE = ("int.from_bytes(sha256('external-head-v1:' + subject_id).digest()[:8], 'big') % 10: "
              "0-6 train, 7 val, 8-9 test")


def _read_csv(path: Path, what: str) -> pd.DataFrame:
    if not path.exists():
        raise ManifestError(f"{path} not found; pass the MIMIC-IV-ECG folder that holds {what}")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as err:
        raise ManifestError(f"cannot read {path} ({type(err).__name__}: {err}); re-download the csv") from err


def _int_ids(df: pd.DataFrame, column: str, path: Path) -> pd.Series:
    text = df[column].str.strip()
    ok = text.str.fullmatch(r"\d+")
    if not ok.all():
        rows = [(int(r) + 2, df[column].iloc[r]) for r in np.flatnonzero(~ok.to_numpy())[:5]]
        raise ManifestError(f"{path}: non-integer {column} at (line, value) {rows}; fix those rows")
    return text.astype(np.int64)


def read_record_list(root: str | Path) -> pd.DataFrame:
    """record_list.csv -> subject_id, study_id (int64), path (str, as written). Table problems raise."""
    path = Path(root) / RECORD_LIST
    rl = _read_csv(path, RECORD_LIST)
    missing = [c for c in ("subject_id", "study_id", "path") if c not in rl.columns]
    if missing:
        raise ManifestError(f"{path} lacks columns {missing} (has {list(rl.columns)}); use the MIMIC-IV-ECG "
                            "record_list.csv (subject_id, study_id, file_name, ecg_time, path)")
    out = pd.DataFrame({"subject_id": _int_ids(rl, "subject_id", path), "study_id": _int_ids(rl, "study_id", path),
                        "path": rl["path"].str.strip()})
    dup = out["study_id"].duplicated(keep=False)
    if dup.any():
        raise ManifestError(f"{path}: duplicate study_id {sorted(set(out.loc[dup, 'study_id']))[:5]} at lines "
                            f"{(np.flatnonzero(dup.to_numpy()) + 2)[:10].tolist()}; keep one row per study (a study "
                            "listed twice could land in two splits)")
    shared = (out["path"] != "") & out["path"].duplicated(keep=False)
    if shared.any():
        raise ManifestError(f"{path}: several studies share a path: "
                            f"{out.loc[shared, ['study_id', 'path']].head(6).values.tolist()}; each study needs "
                            "its own waveform record")
    return out


def read_machine_measurements(root: str | Path) -> pd.DataFrame | None:
    """machine_measurements.csv -> index study_id; cart_id (str) and mm_<name> float64 (29999 -> NaN).

    None when the file is absent (the concepts come from the waveform, so it is optional).
    """
    path = Path(root) / MEASUREMENTS
    if not path.exists():
        return None
    mm = _read_csv(path, MEASUREMENTS)
    if "study_id" not in mm.columns:
        raise ManifestError(f"{path} has no study_id column; use the MIMIC-IV-ECG machine_measurements.csv")
    ids = _int_ids(mm, "study_id", path)
    if ids.duplicated().any():
        raise ManifestError(f"{path}: duplicate study_id {sorted(set(ids[ids.duplicated()]))[:5]}; keep one row "
                            "per study")
    out = pd.DataFrame(index=pd.Index(ids.to_numpy(), name="study_id"))
    out["cart_id"] = mm["cart_id"].str.strip().to_numpy() if "cart_id" in mm.columns else ""
    for col in MM_COLUMNS:
        if col in mm.columns:
            x = pd.to_numeric(mm[col].str.strip(), errors="coerce").to_numpy(np.float64)
            out[f"mm_{col}"] = np.where(x == MM_MISSING, np.nan, x)
    return out


def selection_rank(study_id: int) -> int:
    """The protocol's deterministic order for sub-sampling studies (smaller first)."""
    return int.from_bytes(hashlib.sha256(f"{SELECTION_SALT}:{study_id}".encode()).digest()[:8], "big")


def select_studies(rl: pd.DataFrame, max_records: int | None) -> pd.DataFrame:
    """All studies, or the `max_records` with the smallest selection_rank (reproducible, not the file head).

    The published 100k manifest ranked the same way but only among studies linked to MIMIC-IV
    hospital ICD codes whose extraction succeeded; that link needs MIMIC-IV-hosp and is not applied.
    """
    if max_records is None or max_records >= len(rl):
        return rl
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    rank = rl["study_id"].map(selection_rank)
    return rl.loc[rank.nsmallest(max_records).index].sort_index()


def _agreement(df: pd.DataFrame) -> dict:
    """Aggregate agreement of waveform concepts with the machine's measurements (median |diff|, n)."""
    pairs = {
        "rr_mean_ms": df.get("mm_rr_interval"),
        "qrs_duration_ms": _diff(df, "mm_qrs_end", "mm_qrs_onset"),
        "pr_interval_ms": _diff(df, "mm_qrs_onset", "mm_p_onset"),
        "qt_like_ms": _diff(df, "mm_t_end", "mm_qrs_onset"),
    }
    out = {}
    for name, machine in pairs.items():
        if machine is None:
            continue
        d = (df[f"raw_{name}"] - machine).to_numpy(np.float64)
        d = d[np.isfinite(d)]
        if d.size:
            out[name] = {"n": int(d.size), "median_diff": float(np.median(d)),
                         "median_abs_diff": float(np.median(np.abs(d)))}
    return out


def _diff(df: pd.DataFrame, a: str, b: str) -> pd.Series | None:
    return df[a] - df[b] if a in df and b in df else None


def build_mimic_manifest(root: str | Path, out_dir: str | Path, max_records: int | None = None,
                         num_cpus: int | None = None) -> Path:
    """Validate the studies, measure the seven concepts, split by subject, standardize; write out_dir.

    Writes out_dir/manifest.parquet (ordered by ecg_id = study_id), summary.json (aggregates only) and
    quarantine.csv (ecg_id, path, reason, detail). The manifest and quarantine hold record-level
    identifiers and stay in the user's environment (see module doc). Returns the manifest path.
    """
    root = Path(root).expanduser().resolve()
    out_dir = Path(out_dir)
    listed = read_record_list(root)
    mm = read_machine_measurements(root)
    rl = select_studies(listed, max_records)

    quarantine: list[dict] = []
    candidates = []
    for i, (sid, rel) in enumerate(zip(rl["study_id"], rl["path"], strict=True)):
        if rel:
            candidates.append(i)
        else:
            quarantine.append({"ecg_id": int(sid), "path": "", "reason": "missing_filename",
                               "detail": "empty path in record_list.csv; restore the row from the release"})
    with ThreadPoolExecutor(max_workers=min(8, (os.cpu_count() or 1) * 2)) as pool:
        checks = list(pool.map(lambda i: check_record(root, rl["path"].iat[i], FS, N_SAMPLES), candidates))
    keep = []
    for i, chk in zip(candidates, checks, strict=True):
        if chk.ok:
            keep.append(i)
        else:
            quarantine.append({"ecg_id": int(rl["study_id"].iat[i]), "path": rl["path"].iat[i],
                               "reason": chk.reason, "detail": chk.detail})
    good = rl.iloc[keep]
    df = pd.DataFrame({
        "ecg_id": good["study_id"].to_numpy(np.int64),
        "patient_id": good["subject_id"].astype(str).to_numpy(),
        "split": [mimic_split(int(s)) for s in good["subject_id"]],
        "site": SITE,
        "device": "",
        "path": good["path"].to_numpy(),
        "fs": np.full(len(good), FS, dtype=np.int64),
        "n_samples": np.full(len(good), N_SAMPLES, dtype=np.int64),
    }).sort_values("ecg_id", kind="stable").reset_index(drop=True)
    notes: list[str] = []
    if mm is not None:
        matched = mm.reindex(df["ecg_id"])
        df["device"] = matched["cart_id"].fillna("").astype(str).to_numpy()
        unmatched = int(matched["cart_id"].isna().sum())
        if unmatched:
            notes.append(f"{unmatched} studies have no machine_measurements.csv row (mm_ columns NaN)")
    else:
        matched = None
        notes.append(f"{MEASUREMENTS} not found: no mm_ cross-check columns (concepts are unaffected)")

    summary: dict = {}
    raw = _measure(root, df, num_cpus, notes, summary)
    train = (df["split"] == "train").to_numpy()
    raw_cols, std_cols, stats = {}, {}, {}
    for name in WAVEFORM_CONCEPTS:
        x = raw[name].to_numpy(np.float64)
        x = np.where(np.isfinite(x), x, np.nan)
        z, mean, std, n = standardize(x, train)
        raw_cols[f"raw_{name}"] = x
        std_cols[name] = z
        stats[name] = {"train_mean": mean, "train_std": std, "n_train_finite": n,
                       "missing_fraction": float(np.mean(~np.isfinite(x))) if len(x) else 0.0}
    parts = [df, pd.DataFrame(raw_cols, index=df.index), pd.DataFrame(std_cols, index=df.index)]
    if matched is not None:
        mm_cols = [c for c in matched.columns if c.startswith("mm_")]
        parts.append(pd.DataFrame({c: matched[c].to_numpy(np.float64) for c in mm_cols}, index=df.index))
    df = pd.concat(parts, axis=1)

    per_patient = df.groupby("patient_id")["split"].nunique()
    if (per_patient > 1).any():  # impossible by construction (split is a function of subject_id)
        raise ManifestError(f"subjects in two splits: {per_patient[per_patient > 1].index[:5].tolist()}")
    if len(df) == 0:
        notes.append("WARNING: no usable records; see quarantine.csv")

    qdf = pd.DataFrame(quarantine, columns=list(QUARANTINE_COLUMNS)).sort_values("ecg_id", kind="stable")
    complete = np.isfinite(df[[f"raw_{c}" for c in WAVEFORM_CONCEPTS]].to_numpy(np.float64)).all(axis=1)
    summary.update({
        "cohort": "mimic", "root": str(root), "sampling_rate": FS, "records_listed": int(len(listed)),
        "records_selected": int(len(rl)), "selection": "all" if len(rl) == len(listed) else
        f"{len(rl)} smallest sha256('{SELECTION_SALT}:' + study_id)",
        "records": int(len(df)), "records_all_concepts": int(complete.sum()), "quarantined": int(len(qdf)),
        "quarantine_reasons": dict(Counter(qdf["reason"])),
        "splits": {s: {"records": int((df["split"] == s).sum()),
                       "patients": int(df.loc[df["split"] == s, "patient_id"].nunique())} for s in SPLITS},
        "split_rule": SPLIT_RULE, "concept_source": "waveform", "concepts": list(WAVEFORM_CONCEPTS),
        "concept_stats": stats, "machine_agreement": _agreement(df) if matched is not None else {},
        "notes": notes, "privacy": "aggregate only; manifest.parquet and quarantine.csv hold record-level "
        "identifiers and must stay in the credentialed environment",
    })
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "quarantine.csv") as tmp:
        qdf.to_csv(tmp, index=False)
    path = out_dir / "manifest.parquet"
    summary["manifest_hash"] = manifest_hash(df)
    write_json(out_dir / "summary.json", summary)
    write_manifest(path, df, root, list(WAVEFORM_CONCEPTS), "waveform")
    return path


def _measure(root: Path, df: pd.DataFrame, num_cpus: int | None, notes: list[str], summary: dict) -> pd.DataFrame:
    from raybench.cohorts.waveform_concepts import extract_concepts

    if len(df) == 0:
        return pd.DataFrame(columns=list(WAVEFORM_CONCEPTS), dtype=np.float64)
    values, failures = extract_concepts(root, df[["ecg_id", "path", "fs"]], num_cpus=num_cpus)
    if len(failures):
        reasons = dict(Counter(failures["reason"].astype(str)))
        summary["waveform_concept_failures"] = {"count": int(len(failures)), "reasons": reasons}
        notes.append(f"waveform concepts failed on {len(failures)} records (kept, concepts missing): {reasons}")
    return values.reindex(df["ecg_id"])[list(WAVEFORM_CONCEPTS)].reset_index(drop=True)
