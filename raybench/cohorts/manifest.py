"""The manifest: one ordered row per usable record, the table every downstream stage is keyed on.

`manifest.parquet` (ordered by ecg_id) holds ecg_id int64, patient_id str (as written in the csv),
split, site, device, path (WFDB record base relative to the data root, at the chosen rate), fs,
n_samples, `raw_<concept>` float64 (NaN when missing) and `<concept>` float32 (standardized with the
train split's mean and population std, std floored at 1e-6; missing or non-finite -> 0), then any
cohort-specific record-level columns (MIMIC's `mm_<name>` cross-check values; PTB-XL's and the
synthetic cohort's `diagnostic_superclasses`, raybench.cohorts.diagnostics; a `wfdb` cohort's header
metadata and `record_samples`, a record's full length when it is longer than the window,
raybench.cohorts.wfdb_cohort). Schema metadata: raybench.root, raybench.concepts (JSON list), raybench.concept_source
(tables|waveform|waveform49|none), raybench.manifest_hash (content hash of keys, paths, splits, rates and raw
concepts; independent of where the data root lives). Beside it: summary.json (aggregates only) and
quarantine.csv (ecg_id, path, reason, detail). All three are written atomically, the manifest last.

This module holds the cohort-independent parts (metadata-table checks, standardization, hashing,
writing, loading, `finish_manifest`); record checks are `raybench.cohorts.record_checks`. The cohorts:
`raybench.cohorts.ptbxl` (PTB-XL/PTB-XL+ and the synthetic cohort), `raybench.cohorts.mimic` and
`raybench.cohorts.wfdb_cohort` (any WFDB folder; its own bad-input rules are in its docstring).

Bad input - what happens and why:
- Record level (the record is left out, one quarantine row with a reason; other records proceed):
  header missing (`missing_header`), header unparsable or .dat unreadable (`unreadable`), .dat
  shorter than the header says (`truncated`) or longer (`shape_mismatch`), header rate or length
  not the expected 500 Hz x 5000 / 100 Hz x 1000 (`rate_mismatch`, `length_mismatch`), a lead absent
  (`missing_leads`), NaN samples (`nan_lead`), a constant lead (`flat_lead`), a filename or any file a
  header names escaping the data root, directly or through a symlink (`path_escapes_root`), an empty
  filename (`missing_filename`) or patient_id (`missing_patient_id`; without a patient there is no split).
- Table level (a ManifestError naming the file, rows and fix; nothing is written): metadata csv
  missing/unreadable or lacking ecg_id/patient_id/filename columns, a non-integer ecg_id, a
  duplicate ecg_id (a record listed twice - possibly with two patients - would leak across
  splits), two ecg_ids sharing one waveform file (same leak), one patient spelled two ways
  ("15709" and "15709.0" hash to different splits), a feature table that is unreadable, lacks
  ecg_id or a panel column, or repeats an ecg_id.
- A patient in two splits cannot happen: the split is a pure function of the patient_id string and
  duplicate ecg_ids / spellings are refused above; the builder still asserts it before writing.
- Non-numeric concept cells ("12,5", "abc"; blank/NA/nan are plain missing values) become missing
  (NaN -> 0 after standardizing) and are counted with examples in summary.json
  (`bad_concept_cells`) and a note; the waveform is still good, so the record stays.
- Concepts: "auto" uses PTB-XL+ tables when `features/12sl_features.csv` exists (ECGDeli concepts
  are dropped from the list, with a note, when `ecgdeli_features.csv` is absent), else the seven
  waveform-derived concepts (`raybench.cohorts.waveform_concepts`), with a note. Records the extractor
  fails on keep NaN concepts and are counted in the summary. "waveform49" measures the whole panel on the
  waveform (`raybench.cohorts.waveform49`); each concept's missing count and reasons are in the summary.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from raybench.cohorts.split import SPLITS
from raybench.core.atomic import atomic_path, write_json
from raybench.core.errors import RaybenchError

log = logging.getLogger(__name__)

META_ROOT = b"raybench.root"
META_CONCEPTS = b"raybench.concepts"
META_SOURCE = b"raybench.concept_source"
META_HASH = b"raybench.manifest_hash"
BASE_COLUMNS: tuple[str, ...] = ("ecg_id", "patient_id", "split", "site", "device", "path", "fs", "n_samples")
STD_FLOOR = 1e-6
MANIFEST_QUARANTINE_COLUMNS = ("ecg_id", "path", "reason", "detail")  # quarantine.csv
RECORD_ORDER = "record_order"
"""Optional int64 manifest column: each record's position in the order the published scripts list the cohort's
records (MIMIC-IV-ECG: ascending sha256 rank, raybench.cohorts.mimic_pool.published_order). The selection draw
picks positions in that order (raybench.sae.data.selection_ecg_ids; docs/protocol.md §2.3); without it the
order is ascending ecg_id (PTB-XL's published train order). Part of the manifest hash when present."""


class ManifestError(RaybenchError, ValueError):
    """A table-level problem: nothing is written; the message names the file, the rows and the fix."""


@dataclass(frozen=True)
class ManifestInfo:
    root: Path
    concepts: tuple[str, ...]
    concept_source: str
    manifest_hash: str


# ---------------------------------------------------------------- metadata tables
def read_csv_text(path: Path, hint: str) -> pd.DataFrame:
    """A metadata csv as text (ids stay as written); a missing or unreadable file is a ManifestError.

    hint: the fix for a missing file ("pass the PTB-XL folder that holds ptbxl_database.csv").
    """
    if not path.exists():
        raise ManifestError(f"{path} not found; {hint}")
    try:
        return pd.read_csv(path, dtype=str, keep_default_na=False)
    except Exception as err:
        raise ManifestError(f"cannot read {path} ({type(err).__name__}: {err}); re-download the csv") from err


def refuse_duplicate_ids(table: pd.DataFrame, id_col: str, path: Path) -> None:
    """A record listed twice could land in two splits: name the ids and their csv lines."""
    dup = table[id_col].duplicated(keep=False)
    if dup.any():
        lines = np.flatnonzero(dup.to_numpy()) + 2
        raise ManifestError(f"{path}: duplicate {id_col} {sorted(set(table.loc[dup, id_col].tolist()))[:5]} at lines "
                            f"{lines[:10].tolist()}; keep exactly one row per record (a repeated record could land "
                            "in two splits)")


def refuse_shared_files(table: pd.DataFrame, id_col: str, file_col: str, path: Path) -> None:
    """Two records reading one waveform file would leak it across splits."""
    names = table[file_col].str.strip()
    dup = (names != "") & names.duplicated(keep=False)
    if dup.any():
        raise ManifestError(f"{path}: several {id_col}s share a {file_col}: "
                            f"{table.loc[dup, [id_col, file_col]].head(6).values.tolist()}; "
                            "each record needs its own waveform file")


# ---------------------------------------------------------------- standardizing
def standardize(raw: np.ndarray, train: np.ndarray) -> tuple[np.ndarray, float, float, int]:
    """(x - train mean) / max(train std, 1e-6); missing/non-finite -> 0. Returns z, mean, std, n."""
    raw = np.asarray(raw, dtype=np.float64)
    finite = np.isfinite(raw)
    use = finite & train
    n = int(use.sum())
    mean = float(raw[use].mean()) if n else 0.0
    std = float(raw[use].std()) if n else 1.0
    std = max(std, STD_FLOOR)
    z = np.where(finite, (np.where(finite, raw, 0.0) - mean) / std, 0.0)
    return z.astype(np.float32), mean, std, n


# ---------------------------------------------------------------- hashing and io
def manifest_hash(df: pd.DataFrame) -> str:
    """sha256 (first 16 hex) of keys, paths, splits, rates and raw concepts; stable across runs and roots."""
    h = hashlib.sha256()
    concepts = [c[4:] for c in df.columns if c.startswith("raw_")]
    h.update(json.dumps({"v": 1, "concepts": concepts}).encode())
    h.update(np.ascontiguousarray(df["ecg_id"].to_numpy(np.int64)).tobytes())
    for col in ("patient_id", "split", "path"):
        h.update("\x1f".join(df[col].astype(str)).encode())
        h.update(b"\x1e")
    for col in ("fs", "n_samples"):
        h.update(np.ascontiguousarray(df[col].to_numpy(np.int64)).tobytes())
    for c in concepts:
        x = df[f"raw_{c}"].to_numpy(np.float64)
        x = np.where(np.isfinite(x), x + 0.0, np.nan)
        h.update(np.ascontiguousarray(x).tobytes())
    if RECORD_ORDER in df.columns:  # the published record order the selection draw runs over (MIMIC)
        h.update(b"record_order" + np.ascontiguousarray(df[RECORD_ORDER].to_numpy(np.int64)).tobytes())
    return h.hexdigest()[:16]


def write_manifest(path: Path, df: pd.DataFrame, root: Path, concepts: list[str], source: str) -> str:
    digest = manifest_hash(df)
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta.update({META_ROOT: str(root).encode(), META_CONCEPTS: json.dumps(list(concepts)).encode(),
                 META_SOURCE: source.encode(), META_HASH: digest.encode()})
    table = table.replace_schema_metadata(meta)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)
    return digest


def load_manifest(path: str | Path, verify: bool = True) -> tuple[pd.DataFrame, ManifestInfo]:
    """Read a manifest (file or its folder); checks the stored hash against the content."""
    path = Path(path)
    if path.is_dir():
        path = path / "manifest.parquet"
    if not path.exists():
        raise ManifestError(f"manifest {path} not found; build it with `raybench manifest ptbxl|synth|mimic`")
    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as err:  # pyarrow: not a Parquet file, truncated, unreadable
        raise ManifestError(f"manifest {path} cannot be read ({' '.join(str(err).split())}); rebuild it with "
                            "`raybench manifest ptbxl|synth|mimic`") from None
    meta = table.schema.metadata or {}
    absent = [k.decode() for k in (META_ROOT, META_CONCEPTS, META_SOURCE, META_HASH) if k not in meta]
    if absent:
        raise ManifestError(f"{path} lacks raybench metadata {absent}; rebuild it with `raybench manifest`")
    df = table.to_pandas()
    info = ManifestInfo(root=Path(meta[META_ROOT].decode()), concepts=tuple(json.loads(meta[META_CONCEPTS])),
                        concept_source=meta[META_SOURCE].decode(), manifest_hash=meta[META_HASH].decode())
    if verify and manifest_hash(df) != info.manifest_hash:
        raise ManifestError(f"{path}: content does not match its stored hash {info.manifest_hash}; the file was "
                            "edited or damaged - rebuild it with `raybench manifest`")
    return df, info


# ---------------------------------------------------------------- builder
def complete_case_counts(df: pd.DataFrame, names: Sequence[str]) -> dict[str, Any]:
    """Records with every concept present (finite raw_<name>), overall and per split (records, patients).

    What `eval.missing_concepts: complete_case` evaluates on (docs/protocol.md §3.3).
    """
    raw = df[[f"raw_{c}" for c in names]].to_numpy(np.float64) if len(names) else np.zeros((len(df), 0))
    complete = np.isfinite(raw).all(axis=1)
    out: dict[str, Any] = {"records": int(complete.sum()), "fraction": float(complete.mean()) if len(df) else 0.0,
                           "splits": {}}
    for s in SPLITS:
        m = complete & (df["split"] == s).to_numpy()
        out["splits"][s] = {"records": int(m.sum()), "patients": int(df.loc[m, "patient_id"].nunique()),
                            "of_records": int((df["split"] == s).sum())}
    return out


def finish_manifest(out_dir: str | Path, records: pd.DataFrame, root: Path, concept_values: pd.DataFrame | None,
                    names: Sequence[str], source: str, quarantine: Sequence[dict[str, Any]], notes: list[str],
                    summary: dict[str, Any], split_rule: str, extra_columns: Sequence[str] = (),
                    describe: Callable[[pd.DataFrame], dict[str, Any]] | None = None) -> Path:
    """Attach raw + standardized concepts, check patient-disjointness, write the three files.

    records: one row per usable record with BASE_COLUMNS (any order; sorted here by ecg_id) and
    `extra_columns`, record-level columns kept after the concept columns (not part of the hash).
    concept_values: raw values indexed by ecg_id with columns `names` (None when no concepts).
    summary: cohort-specific entries (cohort, sampling_rate, records_listed, ...); the rest is added here,
    including the complete-case counts. describe: more aggregate entries computed on the finished manifest.
    """
    records = records[list(BASE_COLUMNS) + list(extra_columns)].sort_values("ecg_id", kind="stable")
    records = records.reset_index(drop=True)
    df = records[list(BASE_COLUMNS)].copy()
    df["ecg_id"] = df["ecg_id"].astype(np.int64)
    if df["ecg_id"].duplicated().any():
        raise ManifestError(f"duplicate ecg_id {df.loc[df['ecg_id'].duplicated(), 'ecg_id'].head(5).tolist()}")
    names = list(names)
    raw = None
    if concept_values is not None and names:
        raw = concept_values.reindex(df["ecg_id"])
        extra = int((~concept_values.index.isin(df["ecg_id"])).sum())
        if extra:
            notes.append(f"{extra} concept rows have no usable record (not listed, or quarantined); ignored")
    train = (df["split"] == "train").to_numpy()
    stats: dict[str, dict[str, float]] = {}
    raw_cols: dict[str, np.ndarray] = {}
    std_cols: dict[str, np.ndarray] = {}
    for name in names:
        x = raw[name].to_numpy(np.float64) if raw is not None else np.full(len(df), np.nan)
        x = np.where(np.isfinite(x), x, np.nan)
        z, mean, std, n = standardize(x, train)
        raw_cols[f"raw_{name}"] = x
        std_cols[name] = z
        stats[name] = {"train_mean": mean, "train_std": std, "n_train_finite": n,
                       "missing_fraction": float(np.mean(~np.isfinite(x))) if len(x) else 0.0}
    df = pd.concat([df, pd.DataFrame(raw_cols, index=df.index), pd.DataFrame(std_cols, index=df.index),
                    records[list(extra_columns)]], axis=1)

    per_patient = df.groupby("patient_id")["split"].nunique()
    if (per_patient > 1).any():  # impossible when the split is a function of the patient; refuse, never leak
        raise ManifestError(f"patients in two splits: {per_patient[per_patient > 1].index[:5].tolist()}")
    if len(df) == 0:  # a manifest of nothing would let every later stage "succeed" on nothing
        reasons = Counter(str(q.get("reason", "?")) for q in quarantine).most_common(2)
        why = ("; ".join(f"{n} x {r}" for r, n in reasons) if reasons
               else f"the index lists no record ({summary.get('records_listed', 0)} rows)")
        raise ManifestError(f"{root}: no usable record for the manifest ({why}); point the command at the dataset "
                            "folder, and check --rate against the records folder it has (records100/ or records500/)")

    qdf = pd.DataFrame(list(quarantine), columns=list(MANIFEST_QUARANTINE_COLUMNS))
    qdf = qdf.sort_values("ecg_id", kind="stable")
    digest = manifest_hash(df)
    summary = {**summary, "root": str(root), "records": int(len(df)), "quarantined": int(len(qdf)),
               "quarantine_reasons": dict(Counter(qdf["reason"])),
               "splits": {s: {"records": int((df["split"] == s).sum()),
                              "patients": int(df.loc[df["split"] == s, "patient_id"].nunique())} for s in SPLITS},
               "complete_cases": complete_case_counts(df, names),
               "split_rule": split_rule, "concept_source": source, "concepts": names, "concept_stats": stats,
               **(describe(df) if describe is not None else {}), "notes": notes, "manifest_hash": digest}
    for note in notes:
        if note.startswith("WARNING"):
            log.warning(note)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "quarantine.csv") as tmp:
        qdf.to_csv(tmp, index=False)
    write_json(out_dir / "summary.json", summary)
    path = out_dir / "manifest.parquet"
    write_manifest(path, df, root, names, source)
    return path
