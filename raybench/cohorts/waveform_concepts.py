"""The seven waveform-derived concepts (MIMIC replication; any WFDB cohort without PTB-XL+ tables).

Two extractors (`EXTRACTORS`, chosen by `extractor=`; config `cohort.concept_extractor`;
docs/protocol.md §4.3):
- `refined` (`raybench.cohorts.extractor_refined.measure_record`): raybench's, with 12-lead QRS bounds,
  per-beat pairing of fiducial points and PR-baseline-referenced amplitudes at the lead-II R apex.
- `published` (`raybench.cohorts.extractor_published.measure_record_published`): the protocol's own
  extraction as its published code ran it on MIMIC-IV-ECG.
Both share lead II, the plausibility windows and `ConceptError` (`raybench.cohorts.extractor_rules`).

This module reads records and measures them: `measure_signal` dispatches one signal to an extractor,
`measure_path` reads and measures one record, `extract_concepts` runs chunks of records as Ray tasks and
never lets one bad record stop the others, and `waveform_concept_values` does that for a manifest builder,
recording the failures in its summary and notes.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.cohorts.extractor_published import measure_record_published
from raybench.cohorts.extractor_refined import measure_record
from raybench.cohorts.extractor_rules import ConceptError
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.waveforms import RecordError, prepare_records_run, read_record

EXTRACTORS: tuple[str, ...] = ("published", "refined")


def check_extractor(extractor: str) -> None:
    """Refuse a name that is not one of `EXTRACTORS` (ValueError naming the choices)."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"unknown concept extractor {extractor!r}; expected one of {list(EXTRACTORS)}")


def measure_signal(signal: np.ndarray, fs: float, extractor: str = "refined") -> dict[str, float]:
    """The seven concepts of one signal ([12, T] mV in LEADS order) by the chosen extractor."""
    check_extractor(extractor)
    if extractor == "published":
        return measure_record_published(signal, fs)
    return measure_record(signal, fs)


def measure_path(root: str | Path, rel_path: str, fs: float | None, extractor: str = "refined",
                 window: int | None = None, record_samples: int | None = None) -> dict[str, float]:
    """Read one WFDB record (validated, LEADS order) and measure it; errors name the record. window and
    record_samples: a record longer than the window is measured on its central window, as encoders see it."""
    wave = read_record(root, rel_path, expect_fs=fs, expect_samples=window, record_samples=record_samples)
    try:
        return measure_signal(wave.signal, wave.fs, extractor)
    except ConceptError as err:
        raise ConceptError(err.reason, err.detail, record=rel_path) from err


def measure_rows(root: str, rows: list[tuple], extractor: str = "refined"
                 ) -> tuple[list[tuple[int, dict[str, float]]], list[tuple[int, str, str]]]:
    """Measure a chunk of (ecg_id, path, fs[, window, record_samples]); returns (values, failures as (ecg_id,
    reason, detail))."""
    values, failures = [], []
    for ecg_id, path, fs, *window in rows:
        try:
            values.append((ecg_id, measure_path(root, path, fs, extractor, *window)))
        except RecordError as err:
            failures.append((ecg_id, err.reason, err.detail))
        except Exception as err:  # never lose the rest of the chunk to one unexpected error
            failures.append((ecg_id, "unexpected_error", f"{type(err).__name__}: {err}"))
    return values, failures


def extract_concepts(root: Path, records: pd.DataFrame, num_cpus: int | None = None, chunk_size: int | None = None,
                     extractor: str = "refined") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure every record as Ray tasks over chunks (`extractor`: refined | published, module doc).

    records: columns ecg_id, path (relative to root, no extension), fs (expected Hz; NaN/None skips
    the check), optionally n_samples and record_samples (a longer record is measured on its central
    window). num_cpus: at most this many tasks in flight (default: the cluster's CPUs); also used
    when Ray must be started here. Returns (concepts indexed by ecg_id in input order with the seven
    WAVEFORM_CONCEPTS columns, NaN where unmeasured; failures with ecg_id, reason, detail).
    Runs where the data lives: concept values are record-level and stay in the user's environment.
    """
    import ray

    check_extractor(extractor)
    prepare_records_run(records, num_cpus)
    ids = records["ecg_id"].to_numpy()
    rows = [(_as_id(e), str(p), None if f is None or pd.isna(f) else float(f))
            for e, p, f in zip(ids, records["path"], records["fs"], strict=True)]
    if "record_samples" in records.columns:  # records longer than the window: measured on the central window
        rows = [(*r, int(n), int(full)) for r, n, full in zip(rows, records["n_samples"], records["record_samples"],
                                                              strict=True)]
    slots = max(1, int(num_cpus or ray.cluster_resources().get("CPU", 1)))
    if chunk_size is None:  # ~4 chunks per slot for balance, at most 64 records each
        chunk_size = max(1, min(64, math.ceil(len(rows) / (4 * slots))))
    chunks = [rows[i:i + chunk_size] for i in range(0, len(rows), chunk_size)]
    task = ray.remote(num_cpus=1, max_retries=1)(measure_rows)
    root_s = str(root)
    pending, results = [], []
    for chunk in chunks:
        if len(pending) >= slots:
            done, pending = ray.wait(pending, num_returns=1)
            results.extend(ray.get(done))
        pending.append(task.remote(root_s, chunk, extractor))
    results.extend(ray.get(pending))

    table = pd.DataFrame(np.nan, index=pd.Index(ids, name="ecg_id"), columns=list(WAVEFORM_CONCEPTS))
    fails = []
    for values, failures in results:
        for ecg_id, vals in values:
            table.loc[ecg_id, list(WAVEFORM_CONCEPTS)] = [vals[c] for c in WAVEFORM_CONCEPTS]
        fails.extend(failures)
    failures_df = pd.DataFrame(fails, columns=["ecg_id", "reason", "detail"])
    order = {e: i for i, e in enumerate(ids.tolist())}
    failures_df = failures_df.sort_values("ecg_id", key=lambda s: s.map(order)).reset_index(drop=True)
    return table.astype("float64"), failures_df


def waveform_concept_values(root: Path, records: pd.DataFrame, num_cpus: int | None, notes: list[str],
                            summary: dict[str, Any], extractor: str = "refined") -> pd.DataFrame:
    """The seven waveform concepts of `records` (ecg_id, path, fs), indexed by ecg_id.

    Records the extractor fails on keep NaN concepts; the failures are counted in `summary`
    (`waveform_concept_failures`) and a note.
    """
    if len(records) == 0:
        return pd.DataFrame(columns=list(WAVEFORM_CONCEPTS), index=pd.Index([], name="ecg_id"), dtype=np.float64)
    columns = ["ecg_id", "path", "fs", *(["n_samples", "record_samples"] if "record_samples" in records else [])]
    values, failures = extract_concepts(root, records[columns].reset_index(drop=True),
                                        num_cpus=num_cpus, extractor=extractor)
    if len(failures):
        reasons = dict(Counter(failures["reason"].astype(str)))
        summary["waveform_concept_failures"] = {"count": int(len(failures)), "reasons": reasons}
        notes.append(f"waveform concepts failed on {len(failures)} records (kept, concepts missing): {reasons}")
    return values[list(WAVEFORM_CONCEPTS)]


def _as_id(value):
    return int(value) if isinstance(value, (int, np.integer)) else value
