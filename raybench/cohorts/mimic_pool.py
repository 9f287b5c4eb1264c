"""Which MIMIC-IV-ECG studies enter the manifest: the record pool (config `cohort.record_pool`).

- `published`: the protocol's 100k pool (its public code, JayDuan123/2027-kdd-ECG-InterpBench:
  scripts/build_mimic_external_main_plan.py). A study is eligible when it has a waveform path, is ICD-linked
  (its ecg_time lies within one of the subject's MIMIC-IV hospital admissions [admittime, dischtime]:
  benchmark_v1/multicohort.py `find_hadm_for_ecg`; needs MIMIC-IV `hosp/admissions.csv[.gz]`, `admissions=`)
  and its concept extraction succeeds; the `max_records` eligible studies with the smallest
  sha256('mimic-main-v1:' + study_id) form the pool. Studies are examined in that order until the pool is
  full. raybench's record checks (`raybench.cohorts.record_checks`) also apply, so a study they reject is
  passed over like an extraction failure. Without an admissions table the ICD link cannot be applied; the
  summary says so.
- `all`: the `max_records` smallest-ranked listed studies; extraction failures stay (concepts NaN).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.mimic_tables import FS, N_SAMPLES, TIME_FORMAT, read_admissions
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.record_checks import validate_records
from raybench.cohorts.waveform_concepts import extract_concepts

SELECTION_SALT = "mimic-main-v1"  # the protocol's deterministic record ranking (sha256 of salt:study_id)
RECORD_POOLS: tuple[str, ...] = ("published", "all")


def selection_rank(study_id: int) -> int:
    """The protocol's deterministic order for sub-sampling studies (smaller first)."""
    return int.from_bytes(hashlib.sha256(f"{SELECTION_SALT}:{study_id}".encode()).digest()[:8], "big")


def published_order(study_ids: np.ndarray) -> np.ndarray:
    """[n] int64: each study's position in the published records.csv order, ascending selection_rank (ties by
    study_id). scripts/build_mimic_external_main_plan.py writes its pool in that order and
    scripts/materialize_mimic_source_atlas.py keeps it, so the selection draw picks positions in it
    (manifest column RECORD_ORDER; docs/protocol.md §2.3)."""
    ids = np.asarray(study_ids, dtype=np.int64)
    ranks = np.array([selection_rank(int(s)) for s in ids], dtype=np.uint64)
    position = np.empty(len(ids), dtype=np.int64)
    position[np.lexsort((ids, ranks))] = np.arange(len(ids))
    return position


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


def check_studies(root: Path, rl: pd.DataFrame) -> tuple[pd.DataFrame, list[dict]]:
    """raybench's record checks over `rl` (rows kept in order) -> (good rows, quarantine rows)."""
    empty = (rl["path"] == "").to_numpy()
    quarantine = [{"ecg_id": int(sid), "path": "", "reason": "missing_filename",
                   "detail": "empty path in record_list.csv; restore the row from the release"}
                  for sid in rl.loc[empty, "study_id"]]
    candidates = rl[~empty]
    ok, bad = validate_records(root, list(zip(candidates["study_id"], candidates["path"], strict=True)), FS,
                               N_SAMPLES)
    return candidates[np.asarray(ok, dtype=bool)], quarantine + bad


def published_pool(root: Path, listed: pd.DataFrame, max_records: int | None, admissions: str | Path | None,
                   extractor: str, num_cpus: int | None, notes: list[str], summary: dict
                   ) -> tuple[pd.DataFrame, pd.DataFrame, list[dict]]:
    """The published pool (module doc) -> (pool rows, their concept values by study_id, quarantine rows).

    Adds the pool's counts (`record_pool`), the selection and any extraction failures to `summary`, and
    what the reader must know to `notes`.
    """
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
        good, bad = check_studies(root, batch)
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
