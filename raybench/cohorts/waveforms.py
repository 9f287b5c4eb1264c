"""Read one WFDB record as a validated 12 x T float32 array in the standard lead order.

Every failure raises `RecordError` naming the record and the fix; callers quarantine the record
(keeping the reason) instead of crashing the run.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raybench.errors import RaybenchError

LEADS: tuple[str, ...] = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
_CANON = {name.upper(): name for name in LEADS}


class RecordError(RaybenchError, ValueError):
    """A record cannot be used. `record` names it, `reason` is a short machine-readable tag."""

    def __init__(self, record: str, reason: str, detail: str):
        super().__init__(f"record {record}: {detail}")
        self.record = record
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Waveform:
    signal: np.ndarray  # [12, T] float32, millivolts, leads in LEADS order
    fs: float
    record: str


def canonical_lead(name: str) -> str | None:
    """Header lead name -> our name (real PTB-XL headers say AVR/AVL/AVF)."""
    return _CANON.get(name.strip().upper())


def resolve_record_path(root: str | Path, rel_path: str) -> Path:
    """Join a manifest path onto the data root, refusing paths that escape it."""
    root = Path(root).resolve()
    full = (root / rel_path).resolve()
    if root != full and root not in full.parents:
        raise RecordError(rel_path, "path_escapes_root",
                          f"path escapes the data root {root}; fix the manifest's filename column")
    return full


def check_header_files(root: str | Path, rel_path: str, _segment: bool = False) -> None:
    """Every file the record's header names must lie inside the data root, else RecordError `path_escapes_root`.

    A header names its signal files (and, for a multi-segment record, its segment records); a crafted one
    could name `../../etc/passwd`, an absolute path or a symlink leading out, and the record reader would
    read that file as a signal. Each name is joined onto the record's folder and resolved (symlinks
    followed) the way `resolve_record_path` resolves the record itself. Header text that cannot be read
    is left to the reader, which reports it as `unreadable`.
    """
    base = resolve_record_path(root, rel_path)
    folder = Path(rel_path).parent
    # the format-16 reader opens base.hea with the suffix replaced, wfdb appends ".hea": check both
    for hea in dict.fromkeys((base.with_suffix(".hea"), base.parent / (base.name + ".hea"))):
        if not hea.exists():
            continue
        _inside(root, rel_path, str(folder / hea.name), hea.name)
        try:
            text = hea.read_text(errors="replace")
        except OSError:
            continue
        lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not lines:
            continue
        multi_segment = "/" in lines[0][0]
        for fields in lines[1:]:
            name = fields[0]
            if multi_segment:
                if name.rstrip("~") == "":  # "~": a null segment, no file
                    continue
                for seg in (name, name + ".hea"):
                    _inside(root, rel_path, str(folder / seg), seg)
                if not _segment:  # a segment names its own signal files (segments do not nest)
                    try:
                        check_header_files(root, str(folder / name), _segment=True)
                    except RecordError as err:
                        raise RecordError(rel_path, err.reason, f"segment {name}: {err.detail}") from None
            else:
                _inside(root, rel_path, str(folder / name), name)


def _inside(root: str | Path, rel_path: str, target: str, name: str) -> None:
    try:
        resolve_record_path(root, target)
    except RecordError:
        raise RecordError(rel_path, "path_escapes_root",
                          f"its header names the file {name!r}, which lies outside the data root {Path(root).resolve()}"
                          "; the header is corrupt or crafted: re-download the record") from None


def parse_header(text: str) -> tuple[int, float, int | None, list[list[str]]]:
    """WFDB header -> (n_sig, fs, sig_len, the signal lines split into fields)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    head = lines[0]
    n_sig = int(head[1])
    fs = float(head[2].split("/")[0].split("(")[0]) if len(head) > 2 else 250.0
    sig_len = int(head[3]) if len(head) > 3 else None
    return n_sig, fs, sig_len, lines[1:1 + n_sig]


def _read_format16(base: Path) -> tuple[np.ndarray, float, int | None, list[str]] | None:
    """Fast path for the common layout (PTB-XL, MIMIC): one format-16 file holding every signal.

    Returns (physical signal [n, n_sig] float64 with NaN for invalid samples, fs, header sig_len, names),
    or None when the header is anything else (then wfdb's general reader runs).
    """
    try:
        n_sig, fs, sig_len, sigs = parse_header(base.with_suffix(".hea").read_text())
        if len(sigs) != n_sig or len({s[0] for s in sigs}) != 1 or any(s[1] != "16" for s in sigs):
            return None
        gains, baselines = [], []
        for s in sigs:
            gain_field = s[2] if len(s) > 2 else "200"
            gain_txt = gain_field.split("/")[0]
            baseline = None
            if "(" in gain_txt:
                gain_txt, baseline = gain_txt.rstrip(")").split("(")
            gain = float(gain_txt) or 200.0
            adc_zero = int(s[4]) if len(s) > 4 else 0
            gains.append(gain)
            baselines.append(int(baseline) if baseline is not None else adc_zero)
        names = [" ".join(s[8:]) for s in sigs]
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    digital = np.fromfile(base.parent / sigs[0][0], dtype="<i2")
    if digital.size % n_sig:
        return None  # truncated mid-frame: let wfdb report it
    digital = digital.reshape(-1, n_sig)
    physical = (digital - np.asarray(baselines, np.float64)) / np.asarray(gains, np.float64)
    physical[digital == -32768] = np.nan
    return physical, fs, sig_len, names


def read_record(root: str | Path, rel_path: str, expect_fs: float | None = None,
                expect_samples: int | None = None) -> Waveform:
    """Load `root/rel_path` (.hea/.dat), reorder leads, and check rate, shape and values."""
    base = resolve_record_path(root, rel_path)
    if not base.with_suffix(".hea").exists():
        raise RecordError(rel_path, "missing_header", f"header {base}.hea not found; check the data root")
    check_header_files(root, rel_path)  # before either reader opens a file the header names
    try:
        fast = _read_format16(base)
        if fast is not None:
            sig, fs, sig_len, sig_names = fast
        else:
            import wfdb

            rec = wfdb.rdrecord(str(base))
            sig, fs, sig_len, sig_names = rec.p_signal, float(rec.fs), rec.sig_len, list(rec.sig_name)
    except Exception as err:  # wfdb raises many types for corrupt/truncated files
        raise RecordError(rel_path, "unreadable",
                          f"cannot read WFDB files ({type(err).__name__}: {err}); re-download the record") from err
    if sig is None or sig.ndim != 2:
        raise RecordError(rel_path, "no_signal", "no physical signal in record; check the .dat file")
    if sig_len is not None and sig.shape[0] != sig_len:
        raise RecordError(rel_path, "shape_mismatch",
                          f"header says {sig_len} samples but data has {sig.shape[0]}; the .dat is truncated")
    if expect_fs is not None and abs(float(fs) - expect_fs) > 1e-6:
        raise RecordError(rel_path, "rate_mismatch",
                          f"sampling rate {fs} Hz, expected {expect_fs} Hz; use the matching records folder")
    if expect_samples is not None and sig.shape[0] != expect_samples:
        raise RecordError(rel_path, "length_mismatch",
                          f"{sig.shape[0]} samples, expected {expect_samples}; the record is truncated or mislabeled")
    index = {}
    for i, name in enumerate(sig_names):
        lead = canonical_lead(name)
        if lead is not None and lead not in index:
            index[lead] = i
    missing = [lead for lead in LEADS if lead not in index]
    if missing:
        raise RecordError(rel_path, "missing_leads", f"leads {missing} absent (header has {sig_names})")
    signal = np.stack([sig[:, index[lead]] for lead in LEADS]).astype(np.float32)
    bad = [LEADS[i] for i in range(12) if not np.all(np.isfinite(signal[i]))]
    if bad:
        raise RecordError(rel_path, "nan_lead", f"non-finite samples in leads {bad}")
    flat = [LEADS[i] for i in range(12) if float(np.ptp(signal[i])) == 0.0]
    if flat:
        raise RecordError(rel_path, "flat_lead", f"flat (constant) leads {flat}; electrode off or empty channel")
    return Waveform(signal=signal, fs=float(fs), record=rel_path)
