"""Any folder of 12-lead WFDB records -> a manifest (`cohort.kind: wfdb`, docs/protocol.md §2.7).

Records are the `.hea` files under the root, at any depth (`raybench.cohorts.wfdb_headers`); patients come
from a CSV, a header key, or each record alone (`raybench.cohorts.wfdb_patients`). Rules, each a quarantine
reason in quarantine.csv and counted in summary.json while the other records go on:
- two records with one name in different folders: both `duplicate_record_name` (a CSV row or a copied record
  could not be told apart, and a copy could leak across splits);
- a header that cannot be parsed: `unreadable`; a lead missing (an 8-lead record): `missing_leads`, leads being
  matched by name in any order and spelling (`AVR`/`aVR`, `v1`/`V1`); NaN or flat leads: `nan_lead`, `flat_lead`
  (the reader's checks, `raybench.cohorts.waveforms`);
- shorter than the protocol's window (`WINDOW_S`, 10 s at the record's own rate): `too_short`; longer: kept and
  cut to its central window when read (`window_start`); any rate is kept and resampled by each encoder's
  preprocessing exactly as PTB-XL's 500 Hz records are;
- no patient: `missing_patient_id`; a CSV row naming no record: `csv_unknown_record`.
ecg_id is a hash of the record's path (`record_id`): stable when records are added, never a small number that
the credentialed export's id scan would find everywhere. The split is the protocol's hashed patient split
(§2.2). Header metadata (age, sex, Dx codes and their diagnostic superclasses, recording date) and the
record's full length ride in the manifest after the concepts; site and device come from the CSV, else the
headers' `#Site` / `#Device`, for the provenance audit (§12).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.diagnostics import COLUMN
from raybench.cohorts.manifest import ManifestError, finish_manifest
from raybench.cohorts.panel import WAVEFORM_CONCEPTS, concept_names
from raybench.cohorts.ptbxl import check_patient_spellings
from raybench.cohorts.split import PTBXL_SPLIT_RULE, ptbxl_split
from raybench.cohorts.waveform49 import waveform49_values
from raybench.cohorts.waveform_concepts import waveform_concept_values
from raybench.cohorts.waveforms import LEADS, RecordError, canonical_lead, read_record
from raybench.cohorts.wfdb_headers import (
    HeaderInfo,
    HeaderProblem,
    dx_codes,
    dx_superclasses,
    find_headers,
    parse_age,
    parse_sex,
    read_header,
)
from raybench.cohorts.wfdb_patients import OWN_PATIENT_WARNING, match_records, read_patient_csv

WINDOW_S = 10.0  # the protocol's window: PTB-XL's and MIMIC-IV-ECG's record length
ID_SALT = "raybench-wfdb-v1:"
CONCEPT_CHOICES = ("auto", "waveform49", "waveform", "none")
META_COLUMNS = ("age", "sex", "dx_codes", COLUMN, "recording_date", "record_samples")


def record_id(rel_path: str) -> int:
    """A record's ecg_id: 12 hex digits of sha256(salt + path) as an integer (15 digits at most)."""
    return int(hashlib.sha256((ID_SALT + rel_path).encode()).hexdigest()[:12], 16)


def window_samples(fs: float) -> int:
    return int(round(WINDOW_S * fs))


def _header_rule(info: HeaderInfo) -> tuple[str, str] | None:
    """The header-level reason a record cannot enter (missing leads, too short), or None."""
    found = {canonical_lead(name) for name in info.leads}
    missing = [lead for lead in LEADS if lead not in found]
    if missing:
        return "missing_leads", f"leads {missing} absent (header has {list(info.leads)}); a 12-lead record is needed"
    need = window_samples(info.fs)
    if info.n_samples is None or info.n_samples < need:
        have = "no length" if info.n_samples is None else f"{info.n_samples / info.fs:.2f} s"
        return "too_short", (f"{have} at {info.fs:g} Hz, shorter than the protocol's {WINDOW_S:g} s window "
                             f"({need} samples)")
    return None


def _quarantine(rel: str, reason: str, detail: str) -> dict:
    return {"ecg_id": record_id(rel), "path": rel, "reason": reason, "detail": detail}


def _patients(infos: list[HeaderInfo], root: Path, patients_csv: str | Path | None, patient_key: str | None,
              names: dict[str, list[str]], quarantine: list[dict], notes: list[str], summary: dict
              ) -> dict[str, dict[str, str]]:
    """record path -> {patient_id, and site/device/recording_date where the CSV gives them}."""
    if patients_csv is not None:
        path = Path(patients_csv).expanduser()
        path = path if path.is_absolute() else root / path
        table = read_patient_csv(path)
        check_patient_spellings(table.rows.reset_index(), path)
        matched, unknown = match_records(table, [i.path for i in infos], names)
        for text in unknown:
            quarantine.append(_quarantine(text, "csv_unknown_record", f"{path.name} names record {text!r}, which "
                                          "is not in the folder (or its header is missing); fix the CSV row"))
        if unknown:
            notes.append(f"WARNING: {len(unknown)} rows of {path.name} name no record in the folder (quarantine.csv, "
                         "reason csv_unknown_record)")
        summary["patient_source"] = f"csv {path.name}"
        rows = table.rows.to_dict("index")
        return {rec: {k: str(v) for k, v in rows[text].items()} for text, rec in matched.items()}
    if patient_key is not None:
        summary["patient_source"] = f"header key #{patient_key}"
        key = patient_key.strip().lower()
        return {i.path: {"patient_id": i.comments[key]} for i in infos if i.comments.get(key, "").strip()}
    summary["patient_source"] = "record (each record its own patient)"
    notes.append(OWN_PATIENT_WARNING)
    return {i.path: {"patient_id": i.path} for i in infos}


def _check_signal(root: Path, info: HeaderInfo) -> tuple[str, str] | None:
    """Read the record as encoders will (window included); the reader's reason when it is unusable."""
    try:
        read_record(root, info.path, expect_fs=info.fs, expect_samples=window_samples(info.fs),
                    record_samples=info.n_samples)
    except RecordError as err:
        return err.reason, err.detail
    return None


def build_wfdb_manifest(root: str | Path, out_dir: str | Path, patients_csv: str | Path | None = None,
                        patient_key: str | None = None, concepts: str = "auto", num_cpus: int | None = None,
                        credentialed: bool = True) -> Path:
    """Find, check and split every record under `root`, attach concepts, write the manifest folder.

    concepts: auto = waveform49 (the 49-concept panel measured from the waveform, §4.4) | waveform (the seven
    waveform concepts, §4.2) | none. Returns the manifest.parquet path.
    """
    if concepts not in CONCEPT_CHOICES:
        raise ValueError(f"concepts must be one of {list(CONCEPT_CHOICES)} for a wfdb cohort, got {concepts!r}")
    root = Path(root).expanduser().resolve()
    if not root.is_dir():
        raise ManifestError(f"{root} is not a folder; point cohort.root at the folder holding the WFDB records")
    rels = find_headers(root)
    if not rels:
        raise ManifestError(f"no WFDB header (.hea) under {root}; point cohort.root at the folder of the records")
    ids = [record_id(r) for r in rels]
    if len(set(ids)) != len(ids):
        raise ManifestError(f"{root}: two record paths hash to one ecg_id; rename one of the records")
    quarantine: list[dict] = []
    notes: list[str] = []
    summary: dict = {"cohort": "wfdb", "credentialed": bool(credentialed), "records_listed": len(rels),
                     "window_s": WINDOW_S, "window_rule": "shorter: quarantined (too_short); longer: central window"}
    by_name: dict[str, list[str]] = defaultdict(list)
    for rel in rels:
        by_name[Path(rel).name].append(rel)
    infos: list[HeaderInfo] = []
    for rel in rels:
        if len(by_name[Path(rel).name]) > 1:
            others = [o for o in by_name[Path(rel).name] if o != rel]
            quarantine.append(_quarantine(rel, "duplicate_record_name", f"record name also used by {others[:3]}; "
                                          "rename one (or remove a copy): a name must identify one record"))
            continue
        info = read_header(root, rel)
        if isinstance(info, HeaderProblem):
            quarantine.append(_quarantine(rel, info.reason, info.detail))
            continue
        bad = _header_rule(info) or _check_signal(root, info)
        if bad:
            quarantine.append(_quarantine(rel, *bad))
            continue
        infos.append(info)
    who = _patients(infos, root, patients_csv, patient_key, by_name, quarantine, notes, summary)
    good = []
    for info in infos:
        if not who.get(info.path, {}).get("patient_id", "").strip():
            quarantine.append(_quarantine(info.path, "missing_patient_id", f"no patient id ({summary['patient_source']}"
                                          "); without a patient the record has no split"))
        else:
            good.append(info)
    records = _records(good, who)
    if summary["patient_source"].startswith("record"):
        summary["patient_disjoint_split"] = "not guaranteed (each record its own patient)"
    names: list[str] = []
    values = None
    source = "none" if concepts == "none" else "waveform" if concepts == "waveform" else "waveform49"
    if source == "waveform49":  # auto: the full panel, measured on the same window encoders see
        values = waveform49_values(root, records, num_cpus, notes, summary)
        names = concept_names()
    elif source == "waveform":
        values = waveform_concept_values(root, records, num_cpus, notes, summary)
        names = list(WAVEFORM_CONCEPTS)
    summary["rates_hz"] = {f"{k:g}": int(v) for k, v in records["fs"].value_counts().sort_index().items()}
    summary["cropped_records"] = int((records["record_samples"] > records["n_samples"]).sum())
    return finish_manifest(out_dir, records, root, values, names, source, quarantine, notes, summary,
                           PTBXL_SPLIT_RULE, extra_columns=META_COLUMNS)


def _records(infos: list[HeaderInfo], who: dict[str, dict[str, str]]) -> pd.DataFrame:
    """The manifest rows of usable records: base columns, then header metadata."""
    def meta(info: HeaderInfo, key: str) -> str:
        return who[info.path].get(key) or info.comments.get(key, "")

    codes = [dx_codes(i.comments) for i in infos]
    rates = np.array([i.fs for i in infos], dtype=np.float64)
    fs = rates.astype(np.int64) if np.all(rates == np.round(rates)) else rates  # the hash reads whole Hz
    return pd.DataFrame({
        "ecg_id": np.array([record_id(i.path) for i in infos], dtype=np.int64),
        "patient_id": np.array([who[i.path]["patient_id"].strip() for i in infos], dtype=object),
        "split": [ptbxl_split(who[i.path]["patient_id"].strip()) for i in infos],
        "site": np.array([meta(i, "site") for i in infos], dtype=object),
        "device": np.array([meta(i, "device") for i in infos], dtype=object),
        "path": np.array([i.path for i in infos], dtype=object),
        "fs": fs,
        "n_samples": np.array([window_samples(i.fs) for i in infos], dtype=np.int64),
        "age": np.array([parse_age(i.comments.get("age", "")) for i in infos], dtype=np.float64),
        "sex": np.array([parse_sex(i.comments.get("sex", "")) for i in infos], dtype=object),
        "dx_codes": np.array([",".join(c) for c in codes], dtype=object),
        COLUMN: np.array([dx_superclasses(c) for c in codes], dtype=object),
        "recording_date": np.array([meta(i, "recording_date") for i in infos], dtype=object),
        "record_samples": np.array([i.n_samples for i in infos], dtype=np.int64),
    }, columns=["ecg_id", "patient_id", "split", "site", "device", "path", "fs", "n_samples", *META_COLUMNS])
