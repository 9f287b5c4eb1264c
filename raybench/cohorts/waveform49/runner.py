"""waveform49 over a manifest's records as Ray tasks (the per-record work of `cohort.concepts: waveform49`).

Why Ray tasks over chunks: measurement is per-record CPU work like encoding, so it spreads over a
cluster's CPUs; chunks of records amortise the task overhead (a record costs a few milliseconds). Each
chunk reads its records where the data lives and returns values only, never waveforms. One bad record
never stops the others: a record the reader refuses or the measurement cannot use keeps NaN concepts
and is counted with its reason; every concept's own NaNs are counted with their reasons too.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.cohorts.panel import concept_names
from raybench.cohorts.waveform49.measures import measure_signal49_reasons
from raybench.cohorts.waveforms import RecordError, prepare_records_run, read_record

Row = tuple  # (ecg_id, path, fs) or (ecg_id, path, fs, window, record_samples)


def measure_rows49(root: str, rows: list[Row]) -> tuple[list[tuple[Any, list[float], dict[str, str]]],
                                                       list[tuple[Any, str, str]], float]:
    """Measure a chunk of (ecg_id, path, fs[, window, record_samples]): (values as (ecg_id, 49 floats, reasons),
    failures, CPU seconds). A record longer than the window is measured on its central window, as encoders see it."""
    cpu0 = time.process_time()
    names = concept_names()
    values, failures = [], []
    for ecg_id, path, fs, *window in rows:
        try:
            wave = read_record(root, path, expect_fs=fs, expect_samples=window[0] if window else None,
                               record_samples=window[1] if window else None)
            got, why = measure_signal49_reasons(wave.signal, wave.fs)
            values.append((ecg_id, [got[n] for n in names], why))
        except RecordError as err:
            failures.append((ecg_id, err.reason, err.detail))
        except Exception as err:  # never lose the rest of the chunk to one unexpected error
            failures.append((ecg_id, "unexpected_error", f"{type(err).__name__}: {err}"))
    return values, failures, time.process_time() - cpu0


def measure49(root: str | Path, records: pd.DataFrame, num_cpus: int | None = None, chunk_size: int | None = None
              ) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, Counter], float]:
    """Every record of `records` (ecg_id, path, fs; optionally n_samples and record_samples) as Ray tasks.

    Returns (values indexed by ecg_id in input order, the 49 concept columns, NaN where unmeasured;
    record failures with ecg_id, reason, detail; per concept a Counter of the reasons of its NaNs,
    record failures included; the CPU seconds the tasks spent reading and measuring, which unlike the
    wall time does not depend on what else the machine runs).
    """
    import ray

    prepare_records_run(records, num_cpus)
    ids = records["ecg_id"].tolist()
    rows = [(i, str(p), None if f is None or pd.isna(f) else float(f))
            for i, p, f in zip(ids, records["path"], records["fs"], strict=True)]
    if "record_samples" in records.columns:  # a wfdb cohort's records longer than the window: the central window
        rows = [(*r, int(n), int(full)) for r, n, full in zip(rows, records["n_samples"], records["record_samples"],
                                                              strict=True)]
    slots = max(1, int(num_cpus or ray.cluster_resources().get("CPU", 1)))
    if chunk_size is None:  # ~3 chunks per slot for balance, at most 128 records each
        chunk_size = max(1, min(128, math.ceil(len(rows) / (3 * slots))))
    task = ray.remote(num_cpus=1, max_retries=1)(measure_rows49)
    pending, results = [], []
    for lo in range(0, len(rows), chunk_size):
        if len(pending) >= slots:
            done, pending = ray.wait(pending, num_returns=1)
            results.extend(ray.get(done))
        pending.append(task.remote(str(root), rows[lo:lo + chunk_size]))
    results.extend(ray.get(pending))

    names = concept_names()
    table = np.full((len(ids), len(names)), np.nan)
    where = {e: k for k, e in enumerate(ids)}
    why: dict[str, Counter] = {n: Counter() for n in names}
    fails, cpu_s = [], 0.0
    for values, failures, cpu in results:
        cpu_s += cpu
        for ecg_id, vals, reasons in values:
            table[where[ecg_id]] = vals
            for name, reason in reasons.items():
                why[name][reason] += 1
        for ecg_id, reason, detail in failures:
            fails.append((ecg_id, reason, detail))
            for name in names:
                why[name][f"record:{reason}"] += 1
    fails.sort(key=lambda f: where[f[0]])
    out = pd.DataFrame(table, index=pd.Index(ids, name="ecg_id"), columns=names)
    return out, pd.DataFrame(fails, columns=["ecg_id", "reason", "detail"]), why, cpu_s


def waveform49_values(root: Path, records: pd.DataFrame, num_cpus: int | None, notes: list[str],
                      summary: dict[str, Any]) -> pd.DataFrame:
    """The 49 waveform concepts of `records` (ecg_id, path, fs), indexed by ecg_id, for a manifest builder.

    summary gains `waveform49_missing` ({concept: {count, reasons}} for each concept with NaNs), `waveform49_cpu`
    (records, CPU seconds, records per CPU second) and, when
    records fail as a whole, `waveform_concept_failures` ({count, reasons}); a note says both.
    """
    names = concept_names()
    if len(records) == 0:
        return pd.DataFrame(columns=names, index=pd.Index([], name="ecg_id"), dtype=np.float64)
    columns = ["ecg_id", "path", "fs", *(["n_samples", "record_samples"] if "record_samples" in records else [])]
    values, failures, why, cpu_s = measure49(root, records[columns].reset_index(drop=True), num_cpus)
    summary["waveform49_cpu"] = {"records": int(len(records)), "cpu_s": round(cpu_s, 3),
                                 "records_per_cpu_s": round(len(records) / cpu_s, 1) if cpu_s > 0 else None}
    missing = {n: {"count": int(sum(c.values())), "reasons": dict(c)} for n, c in why.items() if c}
    summary["waveform49_missing"] = missing
    if len(failures):
        reasons = dict(Counter(failures["reason"].astype(str)))
        summary["waveform_concept_failures"] = {"count": int(len(failures)), "reasons": reasons}
        notes.append(f"waveform49 could not measure {len(failures)} records (kept, concepts missing): {reasons}")
    if missing:
        worst = sorted(missing.items(), key=lambda kv: -kv[1]["count"])[:3]
        notes.append("waveform49 concepts missing on some records (most: "
                     + ", ".join(f"{n} {m['count']}" for n, m in worst) + "); reasons in waveform49_missing")
    return values
