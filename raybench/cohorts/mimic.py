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

Record pool (`record_pool`, config `cohort.record_pool`):
- `published`: the protocol's 100k pool (its public code, JayDuan123/2027-kdd-ECG-InterpBench:
  scripts/build_mimic_external_main_plan.py). A study is eligible when it has a waveform path, is ICD-linked
  (its ecg_time lies within one of the subject's MIMIC-IV hospital admissions [admittime, dischtime]:
  benchmark_v1/multicohort.py `find_hadm_for_ecg`; needs MIMIC-IV `hosp/admissions.csv[.gz]`, `admissions=`)
  and its concept extraction succeeds; the `max_records` eligible studies with the smallest
  sha256('mimic-main-v1:' + study_id) form the pool. Studies are examined in that order until the pool is
  full. raybench's record checks (quarantine reasons above) also apply, so a study they reject is passed over
  like an extraction failure. Without an admissions table the ICD link cannot be applied; the summary says so.
- `all`: the `max_records` smallest-ranked listed studies; extraction failures stay (concepts NaN).
The summary names the pool rule, the ICD link, the extractor (`concept_extractor`, config
`cohort.concept_extractor`: published | refined, raybench.cohorts.waveform_concepts) and the
complete-case counts per split (records with all seven concepts; what `eval.missing_concepts:
complete_case` evaluates on).

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
RECORD_POOLS: tuple[str, ...] = ("published", "all")
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # record_list.csv ecg_time and admissions admittime/dischtime
EXTRACTOR_NOTES = {
    "published": "the protocol's published extractor: lead-II detector marks and DWT points paired by position "
                 "after dropping missing points, raw (unreferenced) 12-lead amplitudes, 6 significant digits",
    "refined": "raybench's refined extractor: 12-lead QRS bounds, per-beat pairing, PR-baseline-referenced "
               "amplitudes at the lead-II R apex",
}


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
    if "ecg_time" in rl.columns:  # for the ICD link of the published record pool
        out["ecg_time"] = rl["ecg_time"].str.strip()
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

    This is the `all` pool. The published 100k manifest ranked the same way but only among eligible
    studies (ICD-linked, extraction ok): the `published` pool (`build_mimic_manifest(record_pool=...)`).
    """
    if max_records is None or max_records >= len(rl):
        return rl
    if max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    rank = rl["study_id"].map(selection_rank)
    return rl.loc[rank.nsmallest(max_records).index].sort_index()


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


def icd_linked(records: pd.DataFrame, admissions: pd.DataFrame) -> np.ndarray:
    """[n] bool: the study's ecg_time lies in [admit, disch] of one of its subject's admissions.

    records: subject_id, ecg_time (text); admissions: read_admissions. Equivalent to the published
    `find_hadm_for_ecg(...) is not None`: some admission with admit <= t has disch >= t, i.e. the running
    maximum of disch over the subject's admissions with admit <= t reaches t.
    """
    linked = np.zeros(len(records), dtype=bool)
    if "ecg_time" not in records.columns or len(records) == 0 or len(admissions) == 0:
        return linked
    t = pd.to_datetime(records["ecg_time"].astype(str).str.strip(), format=TIME_FORMAT, errors="coerce")
    left = pd.DataFrame({"pos": np.arange(len(records)), "subject_id": records["subject_id"].to_numpy(np.int64),
                         "t": t.to_numpy()})
    left = left[left["t"].notna()].sort_values("t", kind="stable")
    adm = admissions.sort_values(["subject_id", "admit", "disch"], kind="stable").reset_index(drop=True)
    adm["reach"] = adm.groupby("subject_id")["disch"].cummax()
    adm = adm.sort_values("admit", kind="stable")  # ties keep the larger reach last (asof takes the last)
    merged = pd.merge_asof(left, adm[["subject_id", "admit", "reach"]], left_on="t", right_on="admit",
                           by="subject_id", direction="backward")
    linked[merged["pos"].to_numpy()] = (merged["reach"] >= merged["t"]).to_numpy()
    return linked


def complete_case_counts(df: pd.DataFrame, names: list[str] | tuple[str, ...]) -> dict:
    """Records with every concept present (finite raw_<name>), overall and per split (records, patients)."""
    raw = df[[f"raw_{c}" for c in names]].to_numpy(np.float64) if len(names) else np.zeros((len(df), 0))
    complete = np.isfinite(raw).all(axis=1)
    out = {"records": int(complete.sum()), "fraction": float(complete.mean()) if len(df) else 0.0, "splits": {}}
    for s in SPLITS:
        m = complete & (df["split"] == s).to_numpy()
        out["splits"][s] = {"records": int(m.sum()), "patients": int(df.loc[m, "patient_id"].nunique()),
                            "of_records": int((df["split"] == s).sum())}
    return out


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


def _check_studies(root: Path, rl: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """raybench's record checks over `rl` (rows kept in order) -> (good rows, quarantine rows)."""
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
    return rl.iloc[keep], quarantine


def _published_pool(root: Path, listed: pd.DataFrame, max_records: int | None, admissions: str | Path | None,
                    extractor: str, num_cpus: int | None, notes: list[str], summary: dict
                    ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """The published pool (module doc) -> (pool rows, their concept values by study_id, quarantine rows)."""
    from raybench.cohorts.waveform_concepts import extract_concepts

    if max_records is not None and max_records < 1:
        raise ValueError(f"max_records must be >= 1, got {max_records}")
    eligible = listed[listed["path"] != ""]
    pool_info: dict = {"rule": "published", "listed": int(len(listed)), "with_path": int(len(eligible))}
    if admissions is not None:
        linked = icd_linked(eligible, read_admissions(admissions))
        eligible = eligible[linked]
        pool_info.update(icd_link="applied: ecg_time within a MIMIC-IV hospital admission of the subject",
                         icd_linked=int(linked.sum()))
    else:
        pool_info.update(icd_link="not applied: no MIMIC-IV admissions table given (cohort.admissions)",
                         icd_linked=None)
        notes.append("record pool: the ICD link (ecg_time within a hospital admission) was not applied - pass "
                     "MIMIC-IV hosp/admissions.csv.gz as cohort.admissions to reproduce the published pool")
    ranks = eligible["study_id"].map(selection_rank).to_numpy()
    order = eligible.iloc[np.lexsort((eligible["study_id"].to_numpy(), ranks))]
    target = len(order) if max_records is None else min(max_records, len(order))
    chosen: list[int] = []  # positions into order
    values_parts, quarantine, failures = [], [], []
    pos = 0
    while len(chosen) < target and pos < len(order):
        need = target - len(chosen)
        batch = order.iloc[pos:pos + need + max(16, need // 10)]  # headroom for failures
        good, bad = _check_studies(root, batch)
        values = pd.DataFrame(columns=list(WAVEFORM_CONCEPTS), dtype=np.float64)
        fails = pd.DataFrame(columns=["ecg_id", "reason", "detail"])
        if len(good):
            values, fails = extract_concepts(root, pd.DataFrame({"ecg_id": good["study_id"].to_numpy(np.int64),
                                                                 "path": good["path"].to_numpy(), "fs": float(FS)}),
                                             num_cpus=num_cpus, extractor=extractor)
        bad_by_id = {int(q["ecg_id"]): q for q in bad}
        fail_by_id = {int(e): (str(r), str(d)) for e, r, d in fails.itertuples(index=False)}
        for j, sid in enumerate(batch["study_id"].to_numpy(np.int64)):
            if len(chosen) == target:
                break  # later studies were not needed: neither in the pool nor quarantined
            sid = int(sid)
            if sid in bad_by_id:
                quarantine.append(bad_by_id[sid])
            elif sid in fail_by_id:
                reason, detail = fail_by_id[sid]
                failures.append(reason)
                quarantine.append({"ecg_id": sid, "path": batch["path"].iat[j], "reason": "extraction_failed",
                                   "detail": f"{reason}: {detail} (the published pool keeps extraction-ok studies)"})
            else:
                chosen.append(pos + j)
                values_parts.append(values.loc[[sid]])
        pos += len(batch)
    pool = order.iloc[sorted(chosen)]
    values = pd.concat(values_parts) if values_parts else pd.DataFrame(columns=list(WAVEFORM_CONCEPTS),
                                                                       dtype=np.float64)
    record_check_failed = sum(1 for q in quarantine if q["reason"] != "extraction_failed")
    pool_info.update(eligible_ranked=int(len(order)), examined=int(len(chosen) + len(quarantine)),
                     record_check_failed=int(record_check_failed), extraction_failed=int(len(failures)),
                     selected=int(len(pool)), target=max_records)
    if failures:
        reasons = dict(Counter(failures))
        summary["waveform_concept_failures"] = {"count": int(len(failures)), "reasons": reasons}
        notes.append(f"record pool: {len(failures)} studies passed over because concept extraction failed: {reasons}")
    if record_check_failed:
        notes.append(f"record pool: {record_check_failed} studies passed over by raybench's record checks "
                     "(see quarantine.csv); the published pool did not run these checks")
    if max_records is not None and len(pool) < max_records:
        notes.append(f"record pool: only {len(pool)} eligible studies (asked for {max_records})")
    summary["record_pool"] = pool_info
    summary["records_selected"] = pool_info["examined"]
    summary["selection"] = (f"{len(pool)} eligible studies (with path{', ICD-linked' if admissions else ''}, "
                            f"extraction ok) with the smallest sha256('{SELECTION_SALT}:' + study_id)")
    return pool, values, quarantine


def build_mimic_manifest(root: str | Path, out_dir: str | Path, max_records: int | None = None,
                         num_cpus: int | None = None, concept_extractor: str = "refined",
                         record_pool: str = "all", admissions: str | Path | None = None) -> Path:
    """Validate the studies, measure the seven concepts, split by subject, standardize; write out_dir.

    concept_extractor: refined | published (raybench.cohorts.waveform_concepts); record_pool: all |
    published, with `admissions` (MIMIC-IV hosp/admissions.csv[.gz]) for the ICD link (module doc).
    Writes out_dir/manifest.parquet (ordered by ecg_id = study_id), summary.json (aggregates only) and
    quarantine.csv (ecg_id, path, reason, detail). The manifest and quarantine hold record-level
    identifiers and stay in the user's environment (see module doc). Returns the manifest path.
    """
    from raybench.cohorts.waveform_concepts import EXTRACTORS

    if concept_extractor not in EXTRACTORS:
        raise ValueError(f"concept_extractor must be one of {list(EXTRACTORS)}, got {concept_extractor!r}")
    if record_pool not in RECORD_POOLS:
        raise ValueError(f"record_pool must be one of {list(RECORD_POOLS)}, got {record_pool!r}")
    root = Path(root).expanduser().resolve()
    out_dir = Path(out_dir)
    listed = read_record_list(root)
    mm = read_machine_measurements(root)
    notes: list[str] = []
    summary: dict = {}
    if record_pool == "published":
        good, pool_values, quarantine = _published_pool(root, listed, max_records, admissions, concept_extractor,
                                                        num_cpus, notes, summary)
        rl = good
    else:
        rl = select_studies(listed, max_records)
        good, quarantine = _check_studies(root, rl)
        pool_values = None
        summary["record_pool"] = {"rule": "all", "listed": int(len(listed)), "selected": int(len(rl)),
                                  "target": max_records, "icd_link": "not applied (record_pool: all)",
                                  "icd_linked": None}
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
    if mm is not None:
        matched = mm.reindex(df["ecg_id"])
        df["device"] = matched["cart_id"].fillna("").astype(str).to_numpy()
        unmatched = int(matched["cart_id"].isna().sum())
        if unmatched:
            notes.append(f"{unmatched} studies have no machine_measurements.csv row (mm_ columns NaN)")
    else:
        matched = None
        notes.append(f"{MEASUREMENTS} not found: no mm_ cross-check columns (concepts are unaffected)")

    if pool_values is None:
        raw = _measure(root, df, num_cpus, notes, summary, concept_extractor)
    else:
        raw = pool_values.reindex(df["ecg_id"])[list(WAVEFORM_CONCEPTS)].reset_index(drop=True)
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
        "records_selected": summary.get("records_selected", int(len(rl))),
        "selection": summary.get("selection") or ("all" if len(rl) == len(listed) else
                                                  f"{len(rl)} smallest sha256('{SELECTION_SALT}:' + study_id)"),
        "records": int(len(df)), "records_all_concepts": int(complete.sum()),
        "complete_cases": complete_case_counts(df, WAVEFORM_CONCEPTS),
        "concept_extractor": {"name": concept_extractor, "description": EXTRACTOR_NOTES[concept_extractor]},
        "quarantined": int(len(qdf)),
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


def _measure(root: Path, df: pd.DataFrame, num_cpus: int | None, notes: list[str], summary: dict,
             extractor: str = "refined") -> pd.DataFrame:
    from raybench.cohorts.waveform_concepts import extract_concepts

    if len(df) == 0:
        return pd.DataFrame(columns=list(WAVEFORM_CONCEPTS), dtype=np.float64)
    values, failures = extract_concepts(root, df[["ecg_id", "path", "fs"]], num_cpus=num_cpus, extractor=extractor)
    if len(failures):
        reasons = dict(Counter(failures["reason"].astype(str)))
        summary["waveform_concept_failures"] = {"count": int(len(failures)), "reasons": reasons}
        notes.append(f"waveform concepts failed on {len(failures)} records (kept, concepts missing): {reasons}")
    return values.reindex(df["ecg_id"])[list(WAVEFORM_CONCEPTS)].reset_index(drop=True)
