"""Record-level checks: is a WFDB record usable at the expected rate and length, and if not, why.

A record that fails is left out of the manifest with one quarantine row (ecg_id, path, reason, detail);
the reasons are listed in `raybench.cohorts.manifest`'s bad-input policy. The common layout (one
format-16 file holding every signal) is checked cheaply (header parse + one int16 read); other formats go
through wfdb's general reader (`raybench.cohorts.waveforms.read_record`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from raybench.cohorts.waveforms import (
    LEADS,
    RecordError,
    canonical_lead,
    check_header_files,
    parse_header,
    read_record,
    resolve_record_path,
)


@dataclass(frozen=True)
class RecordCheck:
    ok: bool
    reason: str = ""
    detail: str = ""


def check_record(root: Path, rel_path: str, fs: float, n_samples: int) -> RecordCheck:
    """Validate one record cheaply (header parse + one int16 read); never raises for bad records."""
    try:
        base = resolve_record_path(root, rel_path)
    except RecordError as err:
        return RecordCheck(False, reason=err.reason, detail=err.detail)
    hea = base.parent / (base.name + ".hea")
    if not hea.exists():
        return RecordCheck(False, reason="missing_header", detail=f"{hea} not found; check the data root and rate")
    try:
        check_header_files(root, rel_path)  # no file the header names may lie outside the data root
    except RecordError as err:
        return RecordCheck(False, reason=err.reason, detail=err.detail)
    try:
        n_sig, hfs, sig_len, sigs = parse_header(hea.read_text())
    except (ValueError, IndexError, UnicodeDecodeError) as err:
        return RecordCheck(False, reason="unreadable", detail=f"header {hea.name} cannot be parsed ({err})")
    if abs(hfs - fs) > 1e-6:
        return RecordCheck(False, reason="rate_mismatch",
                           detail=f"header rate {hfs:g} Hz, expected {fs:g} Hz; use the matching records folder")
    if sig_len != n_samples:
        return RecordCheck(False, reason="length_mismatch",
                           detail=f"header says {sig_len} samples, expected {n_samples}")
    leads = [canonical_lead(" ".join(s[8:])) if len(s) > 8 else None for s in sigs]
    missing = [lead for lead in LEADS if lead not in leads]
    if len(sigs) != n_sig or missing:
        return RecordCheck(False, reason="missing_leads",
                           detail=f"leads {missing} absent (header lists {[' '.join(s[8:]) for s in sigs]})")
    files = {s[0] for s in sigs}
    if len(files) != 1 or any(len(s) < 2 or s[1] != "16" for s in sigs):
        return _check_with_wfdb(root, rel_path, fs, n_samples)  # other formats: wfdb's general reader
    dat_rel = str(Path(rel_path).parent / files.pop())
    try:
        dat = resolve_record_path(root, dat_rel)
    except RecordError as err:
        return RecordCheck(False, reason=err.reason, detail=f"header data file: {err.detail}")
    try:
        size = dat.stat().st_size
    except OSError as err:
        return RecordCheck(False, reason="unreadable", detail=f"{dat.name}: {err}; re-download the record")
    expect = n_sig * n_samples * 2
    if size != expect:
        reason = "truncated" if size < expect else "shape_mismatch"
        return RecordCheck(False, reason=reason, detail=f"{dat.name} has {size} bytes, header implies {expect}; "
                           "re-download the record")
    try:
        data = np.fromfile(dat, dtype="<i2").reshape(n_samples, n_sig)
    except (OSError, ValueError) as err:
        return RecordCheck(False, reason="unreadable", detail=f"{dat.name}: {err}; re-download the record")
    index = [leads.index(lead) for lead in LEADS]
    data = data[:, index]
    nan = [LEADS[k] for k in np.flatnonzero((data == -32768).any(0))]
    if nan:
        return RecordCheck(False, reason="nan_lead", detail=f"missing (NaN) samples in leads {nan}")
    flat = [LEADS[k] for k in np.flatnonzero(data.max(0) == data.min(0))]
    if flat:
        return RecordCheck(False, reason="flat_lead", detail=f"flat (constant) leads {flat}; electrode off")
    return RecordCheck(True)


def _check_with_wfdb(root: Path, rel_path: str, fs: float, n_samples: int) -> RecordCheck:
    try:
        read_record(root, rel_path, expect_fs=fs, expect_samples=n_samples)
    except RecordError as err:
        return RecordCheck(False, reason=err.reason, detail=err.detail)
    return RecordCheck(True)


# the first records are checked in this thread; a thread pool takes the rest only when they took longer than this
# each: a record served from the page cache costs ~0.6 ms of Python (path checks, header parse) and threads only
# contend for the GIL (1,500 demo records: 1.3 s alone, 2.5 s on 4 threads); a slow disk or network folder spends
# its time waiting on I/O, which threads overlap
PROBE_RECORDS = 32
THREADS_ABOVE_S = 0.004


def validate_records(root: Path, items: Sequence[tuple[int, str]], fs: float, n_samples: int,
                     workers: int | None = None) -> tuple[list[bool], list[dict[str, Any]]]:
    """check_record over (ecg_id, rel_path) pairs -> (ok flags, quarantine rows). `workers` threads check them;
    None: this thread alone when the first PROBE_RECORDS were fast (cached files), else min(8, 2 x CPUs)."""
    def check(item: tuple[int, str]) -> RecordCheck:
        return check_record(root, item[1], fs, n_samples)

    probe = PROBE_RECORDS if workers is None else 0
    t0 = time.perf_counter()
    checks = [check(item) for item in items[:probe]]
    if workers is None:
        slow = time.perf_counter() - t0 > THREADS_ABOVE_S * max(1, len(checks))
        workers = min(8, (os.cpu_count() or 1) * 2) if slow else 1
    rest = items[probe:]
    if workers > 1 and len(rest) > 1:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            checks += pool.map(check, rest)
    else:
        checks += [check(item) for item in rest]
    rows = [{"ecg_id": int(eid), "path": rel, "reason": chk.reason, "detail": chk.detail}
            for (eid, rel), chk in zip(items, checks, strict=True) if not chk.ok]
    return [chk.ok for chk in checks], rows
