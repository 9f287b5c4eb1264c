"""PTB-XL (+ PTB-XL+ feature tables) and the PTB-XL-shaped synthetic cohort -> manifest.

Reads `ptbxl_database.csv` as text (patient_id stays "15709.0", the split key), refuses table-level
problems with a ManifestError, checks every record at the chosen rate (records500: 12 x 5000,
records100: 12 x 1000), takes concepts from PTB-XL+ tables or the waveform extractor, and hands
the rest to `finish_manifest`. The bad-input policy is documented in `raybench.cohorts.manifest`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.diagnostics import COLUMN, database_superclasses
from raybench.cohorts.manifest import (
    ManifestError,
    finish_manifest,
    read_csv_text,
    refuse_duplicate_ids,
    refuse_shared_files,
)
from raybench.cohorts.panel import (
    CONCEPTS,
    WAVEFORM_CONCEPTS,
    compute_panel,
    concept_names,
    find_column,
    required_columns,
)
from raybench.cohorts.record_checks import validate_records
from raybench.cohorts.split import PTBXL_SPLIT_RULE, ptbxl_split
from raybench.cohorts.waveform49 import waveform49_values
from raybench.cohorts.waveform_concepts import waveform_concept_values

DURATION_S = 10
CONCEPT_MODES: tuple[str, ...] = ("auto", "tables", "waveform", "waveform49", "none")


# ---------------------------------------------------------------- metadata table
def read_database(path: Path) -> pd.DataFrame:
    """`ptbxl_database.csv` as strings (patient_id stays '15709.0'), with ecg_id int64, checked."""
    db = read_csv_text(path, "pass the PTB-XL folder that holds ptbxl_database.csv")
    missing = [c for c in ("ecg_id", "patient_id", "filename_lr", "filename_hr") if c not in db.columns]
    if missing:
        raise ManifestError(f"{path} lacks columns {missing} (has {list(db.columns)[:8]}...); "
                            "use the PTB-XL ptbxl_database.csv, which has all of them")
    ids = pd.to_numeric(db["ecg_id"].str.strip(), errors="coerce")
    bad = np.flatnonzero(ids.isna().to_numpy() | (ids % 1 != 0).to_numpy())
    if bad.size:
        rows = [(int(r) + 2, db["ecg_id"].iloc[r]) for r in bad[:5]]
        raise ManifestError(f"{path}: non-integer ecg_id at (line, value) {rows}; fix those rows")
    db["ecg_id"] = ids.astype(np.int64)
    refuse_duplicate_ids(db, "ecg_id", path)
    return db


def _patient_key(pid: str) -> str:
    text = pid.strip()
    try:
        value = float(text)
    except ValueError:
        return text
    return repr(value) if np.isfinite(value) else text


def check_patient_spellings(db: pd.DataFrame, path: Path) -> None:
    """Refuse one patient written two ways: the split hashes the string, so both would get splits."""
    pids = db["patient_id"][db["patient_id"].str.strip() != ""]
    keys = pids.map(_patient_key)
    spellings = pd.DataFrame({"key": keys, "pid": pids}).drop_duplicates().groupby("key")["pid"].apply(list)
    clash = spellings[spellings.map(len) > 1]
    if len(clash):
        raise ManifestError(f"{path}: patient ids written in more than one way {clash.tolist()[:5]}; "
                            "write each patient_id identically in every row (the split hashes the text)")


# ---------------------------------------------------------------- concepts
def _read_feature_table(path: Path, source: str) -> tuple[pd.DataFrame, list[tuple[int, str, str]], int]:
    """Panel columns of one PTB-XL+ table as strings -> (table, bad-cell examples, bad-cell count)."""
    wanted = {c.lower() for c in required_columns(source)} | {"ecg_id"}
    try:
        table = pd.read_csv(path, dtype=str, usecols=lambda c: str(c).strip().lower() in wanted)
    except Exception as err:
        raise ManifestError(f"cannot read feature table {path} ({type(err).__name__}: {err}); "
                            "re-download PTB-XL+ features") from err
    table.columns = [str(c).strip() for c in table.columns]
    key = find_column(table.columns, "ecg_id")
    if key is None:
        raise ManifestError(f"{path} has no ecg_id column; use the PTB-XL+ features table")
    absent = [c for c in required_columns(source) if find_column(table.columns, c) is None]
    if absent:
        raise ManifestError(f"{path} lacks panel columns {absent[:6]}{'...' if len(absent) > 6 else ''} "
                            f"({len(absent)} in all); use the PTB-XL+ release table, which has every one")
    ids = pd.to_numeric(table[key], errors="coerce")
    if ids.isna().any():
        line = int(np.flatnonzero(ids.isna().to_numpy())[0]) + 2
        raise ManifestError(f"{path}: line {line} has ecg_id {table[key].iloc[line - 2]!r}; fix or drop the row")
    if ids.duplicated().any():
        lines = (np.flatnonzero(ids.duplicated(keep=False).to_numpy()) + 2)[:10].tolist()
        raise ManifestError(f"{path}: duplicate ecg_id {sorted(set(ids[ids.duplicated()].astype(int)))[:5]} at "
                            f"lines {lines}; keep one row per record")
    examples: list[tuple[int, str, str]] = []
    count = 0
    for col in table.columns:
        if col == key:
            continue
        text = table[col]
        num = pd.to_numeric(text.str.strip(), errors="coerce")
        bad = text.notna() & num.isna()  # pandas already read blank/NA/nan/None cells as missing
        if bad.any():
            count += int(bad.sum())
            for r in np.flatnonzero(bad.to_numpy())[: max(0, 10 - len(examples))]:
                examples.append((int(ids.iloc[r]), col, str(text.iloc[r])))
        table[col] = num
    return table, examples, count


def _table_concepts(features: Path, notes: list[str], summary: dict) -> tuple[pd.DataFrame, list[str]]:
    f12 = features / "12sl_features.csv"
    fdeli = features / "ecgdeli_features.csv"
    t12, ex12, n12 = _read_feature_table(f12, "12sl")
    names = concept_names()
    tdeli = None
    exd: list[tuple[int, str, str]] = []
    nd = 0
    if fdeli.exists():
        tdeli, exd, nd = _read_feature_table(fdeli, "ecgdeli")
    else:
        names = [c.name for c in CONCEPTS if c.source != "ecgdeli"]
        notes.append(f"WARNING: {fdeli} not found: the {49 - len(names)} ECGDeli concepts are left out "
                     f"({len(names)} concepts). Add PTB-XL+ ecgdeli_features.csv for the full 49-concept panel.")
    if n12 + nd:
        examples = (ex12 + exd)[:10]
        summary["bad_concept_cells"] = {"count": n12 + nd, "examples": [list(e) for e in examples]}
        notes.append(f"WARNING: {n12 + nd} non-numeric concept cells read as missing (e.g. ecg_id {examples[0][0]} "
                     f"{examples[0][1]}={examples[0][2]!r}); fix the feature tables to use them.")
    panel = compute_panel(t12, tdeli)
    return panel[names], names


def _resolve_concepts(mode: str, root: Path, features: Path, df: pd.DataFrame, num_cpus: int | None,
                      notes: list[str], summary: dict) -> tuple[str, list[str], pd.DataFrame | None]:
    has_tables = (features / "12sl_features.csv").exists()
    if mode == "tables" and not has_tables:
        raise ManifestError(f"concepts='tables' but {features / '12sl_features.csv'} is missing; add the PTB-XL+ "
                            "features folder or use concepts='waveform'")
    if mode == "tables" or (mode == "auto" and has_tables):
        values, names = _table_concepts(features, notes, summary)
        return "tables", names, values
    if mode == "none":
        return "none", [], None
    if mode == "auto":
        notes.append(f"PTB-XL+ feature tables not found under {features}: concepts are the 7 waveform-derived "
                     "ones (not the 49-concept panel). Add PTB-XL+ features/ for the full panel.")
    if mode == "waveform49":
        return "waveform49", concept_names(), waveform49_values(root, df, num_cpus, notes, summary)
    values = waveform_concept_values(root, df, num_cpus, notes, summary)
    return "waveform", list(WAVEFORM_CONCEPTS), values


def build_ptbxl_manifest(root: str | Path, out_dir: str | Path, sampling_rate: int = 500, concepts: str = "auto",
                         features_dir: str | Path | None = None, num_cpus: int | None = None,
                         cohort: str = "ptbxl") -> Path:
    """Validate every record, attach concepts, split by patient, standardize; write the manifest folder.

    concepts: auto | tables | waveform | waveform49 | none (CONCEPT_MODES). features_dir defaults to <root>/features.
    Returns the manifest.parquet path.
    """
    if sampling_rate not in (100, 500):
        raise ValueError(f"sampling_rate must be 100 or 500, got {sampling_rate}")
    if concepts not in CONCEPT_MODES:
        raise ValueError(f"concepts must be one of {list(CONCEPT_MODES)}, got {concepts!r}")
    root = Path(root).expanduser().resolve()
    db_path = root / "ptbxl_database.csv"
    db = read_database(db_path)
    file_col = "filename_hr" if sampling_rate == 500 else "filename_lr"
    check_patient_spellings(db, db_path)
    refuse_shared_files(db, "ecg_id", file_col, db_path)
    n_samples = DURATION_S * sampling_rate
    db[file_col] = db[file_col].str.strip()

    quarantine: list[dict] = []
    no_file = db[file_col] == ""
    no_patient = ~no_file & (db["patient_id"].str.strip() == "")
    for eid in db.loc[no_file, "ecg_id"]:
        quarantine.append({"ecg_id": int(eid), "path": "", "reason": "missing_filename",
                           "detail": f"empty {file_col}; fill it in ptbxl_database.csv"})
    for eid, rel in db.loc[no_patient, ["ecg_id", file_col]].itertuples(index=False):
        quarantine.append({"ecg_id": int(eid), "path": rel, "reason": "missing_patient_id",
                           "detail": "empty patient_id: cannot assign a patient-level split"})
    candidates = db[~no_file & ~no_patient]
    ok, bad = validate_records(root, list(zip(candidates["ecg_id"], candidates[file_col], strict=True)),
                               sampling_rate, n_samples)
    quarantine.extend(bad)
    good = candidates[np.asarray(ok, dtype=bool)]
    records = pd.DataFrame({
        "ecg_id": good["ecg_id"].to_numpy(np.int64),
        "patient_id": good["patient_id"].to_numpy(dtype=object),
        "split": [ptbxl_split(p) for p in good["patient_id"]],
        "site": good["site"].to_numpy(dtype=object) if "site" in good else "",
        "device": good["device"].to_numpy(dtype=object) if "device" in good else "",
        "path": good[file_col].to_numpy(dtype=object),
        "fs": np.full(len(good), sampling_rate, dtype=np.int64),
        "n_samples": np.full(len(good), n_samples, dtype=np.int64),
    })
    records[COLUMN] = database_superclasses(good, root)  # the provenance audit's target (docs/protocol.md §12)

    notes: list[str] = []
    summary: dict = {"cohort": cohort, "sampling_rate": sampling_rate, "records_listed": int(len(db))}
    features = Path(features_dir) if features_dir is not None else root / "features"
    source, names, values = _resolve_concepts(concepts, root, features, records, num_cpus, notes, summary)
    return finish_manifest(out_dir, records, root, values, names, source, quarantine, notes, summary,
                           PTBXL_SPLIT_RULE, extra_columns=(COLUMN,))


def build_synth_manifest(cohort_dir: str | Path, out_dir: str | Path, sampling_rate: int = 500,
                         concepts: str = "auto", num_cpus: int | None = None) -> Path:
    """The synthetic cohort is PTB-XL-shaped (tables included), so this is the PTB-XL builder."""
    cohort_dir = Path(cohort_dir)
    if not (cohort_dir / "ground_truth.csv").exists():
        raise ManifestError(f"{cohort_dir} is not a synthetic cohort (no ground_truth.csv); generate one with "
                            "`raybench cohort synth --out DIR`")
    return build_ptbxl_manifest(cohort_dir, out_dir, sampling_rate=sampling_rate, concepts=concepts,
                                num_cpus=num_cpus, cohort="synth")
