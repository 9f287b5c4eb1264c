"""What the provenance audit reads beside the embedding (docs/protocol.md §12.1): the metadata-only comparator's
features (PTB-XL's age, sex and recording year, from ptbxl_database.csv), device families, and nested variables.

PTB-XL's `device` strings are firmware variants of a few recorders (`AT-6 C 5.5`, `AT-6 C 5.8`, `AT-6     6`,
`AT-60    3`, `CS-12   E`, `CS100    3`): `device_family` keeps the leading model token (letters, an optional
hyphen, digits: AT-6, AT-60, CS-12, CS100), so variants of one recorder pool into one group when
`provenance.device_grouping: family`. A variable `site+device` audits each (site, device) pair as its own group,
so a device used at two sites is two groups (devices nested within sites); `device|site` compares the devices
within each site (the site is the stratum). A record without a value (empty or NaN) has the label "" (no group).

Any cohort can bring its own comparator features: `provenance.metadata_csv` names a CSV keyed by `ecg_id` (per
record) or `patient_id` (per patient) with any of age, sex (numbers, or M / F / male / female), recording_year (or
recording_date); it replaces the PTB-XL table (MIMIC-IV-ECG users join age and sex from their own tables).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

META_COLUMNS = ("age", "sex", "recording_year")
_FAMILY = re.compile(r"^\s*([A-Za-z]+-?\d+)")


def device_family(name: str) -> str:
    """The recorder model of a device string (`AT-6 C 5.8` -> `AT-6`); the stripped string when none matches."""
    m = _FAMILY.match(str(name))
    return m.group(1).upper() if m else str(name).strip()


MISSING = ("", "nan", "NaN", "None", "<NA>", "NaT")


def _column(frame: pd.DataFrame, name: str, grouping: str) -> pd.Series:
    col = frame[name].astype(str).str.strip()
    col = col.where(~col.isin(MISSING) & frame[name].notna(), "")
    if name == "device" and grouping == "family":
        col = col.map(lambda v: device_family(v) if v else "")
    return col


def variable_labels(frame: pd.DataFrame, variable: str, grouping: str) -> np.ndarray:
    """Provenance labels of every row: a manifest column, or `a+b` for nested columns joined by '/' ("" where a
    part has no value); device strings grouped into families when grouping is 'family'; for `a|b` the labels of
    a (its strata: `variable_strata`). KeyError names a missing column."""
    parts = variable.split("|")[0].split("+")
    missing = [p for p in (*parts, *variable.split("|")[1:]) if p not in frame.columns]
    if missing:
        raise KeyError(", ".join(missing))
    cols = [_column(frame, p, grouping) for p in parts]
    out, empty = cols[0], cols[0] == ""
    for c in cols[1:]:
        out, empty = out + "/" + c, empty | (c == "")
    return out.where(~empty, "").to_numpy()


def variable_strata(frame: pd.DataFrame, variable: str, grouping: str) -> np.ndarray | None:
    """The stratum of every row for `a|b` (the labels of b), else None."""
    if "|" not in variable:
        return None
    return variable_labels(frame, variable.split("|", 1)[1], grouping)


def csv_metadata(path: Path, ecg_ids: np.ndarray, patients: np.ndarray) -> np.ndarray:
    """[n, 3] age, sex, recording year of the records from a user's CSV (keyed by ecg_id, else patient_id; NaN
    where missing). ValueError (one line, naming the file and the fix) when it cannot be read that way."""
    try:
        db = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, UnicodeDecodeError) as err:
        raise ValueError(f"{path}: cannot read the metadata CSV ({type(err).__name__}); provenance.metadata_csv "
                         "needs a readable CSV") from None
    key = "ecg_id" if "ecg_id" in db.columns else "patient_id" if "patient_id" in db.columns else None
    have = {"age", "sex", "recording_year", "recording_date"} & set(db.columns)
    if key is None or not have:
        raise ValueError(f"{path}: columns {sorted(db.columns)[:8]}; the metadata CSV needs ecg_id or patient_id "
                         "and any of age, sex, recording_year (or recording_date)")
    db = db.drop_duplicates(key).set_index(db[key].astype(str).str.strip())
    rows = db.reindex((ecg_ids if key == "ecg_id" else patients).astype(str))
    age = pd.to_numeric(rows["age"], errors="coerce") if "age" in rows else pd.Series(np.nan, index=rows.index)
    sex = rows["sex"].str.strip().str.lower() if "sex" in rows else pd.Series("", index=rows.index)
    sex = pd.to_numeric(sex.replace({"m": "0", "male": "0", "f": "1", "female": "1"}), errors="coerce")
    if "recording_year" in rows:
        year = pd.to_numeric(rows["recording_year"], errors="coerce")
    elif "recording_date" in rows:
        year = pd.to_datetime(rows["recording_date"], errors="coerce").dt.year
    else:
        year = pd.Series(np.nan, index=rows.index)
    return np.column_stack([age.to_numpy(float), sex.to_numpy(float), year.to_numpy(float)])


def ptbxl_metadata(root: Path, ecg_ids: np.ndarray) -> np.ndarray | None:
    """[n, 3] age, sex and recording year of the records (NaN where missing) from the cohort's ptbxl_database.csv;
    None when the cohort has no such table or none of the three columns."""
    path = Path(root) / "ptbxl_database.csv"
    if not path.exists():
        return None
    db = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "ecg_id" not in db.columns or not {"age", "sex", "recording_date"} & set(db.columns):
        return None
    db.index = pd.to_numeric(db["ecg_id"], errors="coerce")
    rows = db.reindex(np.asarray(ecg_ids, dtype=np.int64))
    num = {c: pd.to_numeric(rows[c], errors="coerce") if c in rows else pd.Series(np.nan, index=rows.index)
           for c in ("age", "sex")}
    dates = rows["recording_date"] if "recording_date" in rows else pd.Series("", index=rows.index)
    year = pd.to_datetime(dates, format="%Y-%m-%d %H:%M:%S", errors="coerce").dt.year  # PTB-XL's format
    return np.column_stack([num["age"].to_numpy(float), num["sex"].to_numpy(float), year.to_numpy(float)])
