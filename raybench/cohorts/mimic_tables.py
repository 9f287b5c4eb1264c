"""MIMIC-IV-ECG's published files, read and checked: record_list.csv, machine_measurements.csv, and
MIMIC-IV's hospital admissions (for the published record pool's ICD link).

Published layout (PhysioNet MIMIC-IV-ECG 1.0):
    record_list.csv             subject_id, study_id, file_name, ecg_time, path
    machine_measurements.csv    subject_id, study_id, cart_id, ecg_time, report_0..report_17, bandwidth,
                                filtering, rr_interval, p_onset, p_end, qrs_onset, qrs_end, t_end,
                                p_axis, qrs_axis, t_axis   (ms / degrees; 29999 = not measured)
    files/pNNNN/p<subject>/s<study>/<study>.{hea,dat}   12 leads, 500 Hz, 5000 samples; header lead
                                order I II III aVR aVF aVL V1..V6 (read_record reorders to LEADS)
MIMIC-IV hosp/admissions.csv[.gz]: subject_id, hadm_id, admittime, dischtime, ...

Table problems (missing file or column, non-integer or duplicate ids, two studies sharing a path) raise a
ManifestError naming the file, the rows and the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.manifest import ManifestError, read_csv_text, refuse_duplicate_ids, refuse_shared_files

RECORD_LIST = "record_list.csv"
MEASUREMENTS = "machine_measurements.csv"
MM_COLUMNS: tuple[str, ...] = ("rr_interval", "p_onset", "p_end", "qrs_onset", "qrs_end", "t_end",
                               "p_axis", "qrs_axis", "t_axis")
MM_MISSING = 29999  # the machine's "not measured" code
FS = 500
N_SAMPLES = 5000
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # record_list.csv ecg_time and admissions admittime/dischtime


def _read_csv(path: Path, what: str) -> pd.DataFrame:
    return read_csv_text(path, f"pass the MIMIC-IV-ECG folder that holds {what}")


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
    if "ecg_time" in rl.columns:  # for the ICD link of the published record pool
        out["ecg_time"] = rl["ecg_time"].str.strip()
    refuse_duplicate_ids(out, "study_id", path)
    refuse_shared_files(out, "study_id", "path", path)
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


def read_admissions(path: str | Path) -> pd.DataFrame:
    """MIMIC-IV hosp admissions.csv[.gz] -> subject_id int64, admit, disch (datetime64).

    Rows without subject_id, hadm_id or a parsable admittime/dischtime are skipped, as the published
    `read_admissions_by_subject` does.
    """
    path = Path(path).expanduser()
    adm = _read_csv(path, "admissions.csv.gz (MIMIC-IV hosp module)")
    missing = [c for c in ("subject_id", "hadm_id", "admittime", "dischtime") if c not in adm.columns]
    if missing:
        raise ManifestError(f"{path} lacks columns {missing}; pass MIMIC-IV hosp/admissions.csv.gz")
    subject = pd.to_numeric(adm["subject_id"].str.strip(), errors="coerce")
    admit = pd.to_datetime(adm["admittime"].str.strip(), format=TIME_FORMAT, errors="coerce")
    disch = pd.to_datetime(adm["dischtime"].str.strip(), format=TIME_FORMAT, errors="coerce")
    ok = subject.notna() & (adm["hadm_id"].str.strip() != "") & admit.notna() & disch.notna()
    return pd.DataFrame({"subject_id": subject[ok].astype(np.int64).to_numpy(), "admit": admit[ok].to_numpy(),
                         "disch": disch[ok].to_numpy()})
