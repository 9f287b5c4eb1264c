"""Who each record of a `wfdb` cohort belongs to: the patient CSV, a header key, or each record alone.

The patient split needs a patient per record (docs/protocol.md §2.7). In order of preference:
- a CSV (`cohort.patients_csv`) with columns `record` (the record name, or its path under the root without
  extension) and `patient_id`, optionally `site`, `device`, `recording_date`. A CSV without both required columns,
  or naming one record twice, is refused (ManifestError: exit 2, naming the expected columns); a row naming a
  record that is not in the folder becomes a quarantine row (`csv_unknown_record`) and the run goes on; a record
  the CSV leaves out is quarantined (`missing_patient_id`);
- a header comment key (`cohort.patient_key`, e.g. `Patient` for `#Patient: 12`); a record without it is
  quarantined (`missing_patient_id`);
- else each record is its own patient (its path is the id) and the summary warns that the split cannot be
  patient-disjoint when a patient has several records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raybench.cohorts.manifest import ManifestError, read_csv_text

REQUIRED = ("record", "patient_id")
OPTIONAL = ("site", "device", "recording_date")
EXPECTED = f"columns {', '.join(REQUIRED)} (optional {', '.join(OPTIONAL)})"
OWN_PATIENT_WARNING = ("WARNING: no patient ids (no cohort.patients_csv, no cohort.patient_key): each record is its "
                       "own patient, so the split cannot be patient-disjoint if a patient has several records; add a "
                       "patients CSV or name the header key that holds the patient id")


@dataclass(frozen=True)
class PatientTable:
    """The CSV's rows keyed by its `record` text (as written, stripped)."""

    path: Path
    rows: pd.DataFrame  # index: record; columns patient_id and whichever of OPTIONAL the CSV has


def read_patient_csv(path: Path) -> PatientTable:
    """Read and check the CSV; refuses (ManifestError) a file without the required columns or naming a record twice."""
    db = read_csv_text(path, f"point cohort.patients_csv at a CSV with {EXPECTED}")
    db.columns = [str(c).strip().lower() for c in db.columns]
    missing = [c for c in REQUIRED if c not in db.columns]
    if missing:
        raise ManifestError(f"{path} lacks {missing}: a patients CSV needs {EXPECTED}; it has {list(db.columns)[:8]}")
    db["record"] = db["record"].str.strip()
    db = db[db["record"] != ""]
    dup = db["record"].duplicated(keep=False)
    if dup.any():
        raise ManifestError(f"{path}: records named more than once {sorted(set(db.loc[dup, 'record']))[:5]} at lines "
                            f"{(db.index[dup] + 2).tolist()[:10]}; keep one row per record ({EXPECTED})")
    keep = ["patient_id", *[c for c in OPTIONAL if c in db.columns]]
    rows = db.set_index("record")[keep].apply(lambda col: col.str.strip())
    return PatientTable(path=path, rows=rows)


def match_records(table: PatientTable, paths: list[str], names: dict[str, list[str]]
                  ) -> tuple[dict[str, str], list[str]]:
    """CSV record text -> record path, and the texts that name no record. A text matches a record's path under
    the root, else its name when exactly one record has that name."""
    matched: dict[str, str] = {}
    unknown: list[str] = []
    known = set(paths)
    for text in table.rows.index:
        key = text[:-4] if text.lower().endswith((".hea", ".dat", ".mat")) else text
        key = key.strip("/")
        if key in known:
            matched[text] = key
        elif len(names.get(key, [])) == 1:
            matched[text] = names[key][0]
        elif key not in names:
            unknown.append(text)
        # a name several records share: those records are quarantined as duplicates, the row matches none
    return matched, unknown
