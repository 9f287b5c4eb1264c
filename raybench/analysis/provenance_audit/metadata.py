"""What the provenance audit reads beside the embedding (docs/protocol.md §12.1): the metadata-only comparator's
features (PTB-XL's age, sex and recording year, from ptbxl_database.csv), device families, and nested variables.

PTB-XL's `device` strings are firmware variants of a few recorders (`AT-6 C 5.5`, `AT-6 C 5.8`, `AT-6     6`,
`AT-60    3`, `CS-12   E`, `CS100    3`): `device_family` keeps the leading model token (letters, an optional
hyphen, digits: AT-6, AT-60, CS-12, CS100), so variants of one recorder pool into one group when
`provenance.device_grouping: family`. A variable `site+device` audits each (site, device) pair as its own group,
so a device used at two sites is two groups (devices nested within sites).
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


def variable_labels(frame: pd.DataFrame, variable: str, grouping: str) -> np.ndarray:
    """Provenance labels of every row: a manifest column, or `a+b` for nested columns joined by '/'; device strings
    grouped into families when grouping is 'family'. KeyError names a missing column."""
    parts = variable.split("+")
    missing = [p for p in parts if p not in frame.columns]
    if missing:
        raise KeyError(", ".join(missing))
    cols = []
    for p in parts:
        col = frame[p].astype(str).str.strip()
        if p == "device" and grouping == "family":
            col = col.map(device_family)
        cols.append(col)
    out = cols[0]
    for c in cols[1:]:
        out = out + "/" + c
    return out.to_numpy()


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
