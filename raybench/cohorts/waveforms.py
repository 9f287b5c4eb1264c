"""Read one WFDB record as a validated 12 x T float32 array in millivolts, in the standard lead order.

Every failure raises `RecordError` naming the record and the fix; callers quarantine the record
(keeping the reason) instead of crashing the run. What the reader changes in a usable record is never
silent: `Waveform.notes` says it (the extraction writes the notes into the store's index.json).

  leads       found by name (case-insensitive; AVR = aVR), put in `LEADS` order: a header in another order
              is reordered (note); signals that are not one of the 12 leads are left out (note); a lead absent
              -> `missing_leads`; a lead named twice -> `duplicate_leads` (which one is meant is unknowable)
  units       the header's units are read per signal (WFDB default mV when absent): uV / V / nV are scaled
              to mV (note); anything else (mmHg, NU, ...) -> `bad_units`
  values      NaN (WFDB's invalid sample) -> `nan_lead`; +-Inf (e.g. a corrupt gain overflowing float32)
              -> `inf_lead`; a constant lead, all-zero included (an empty or unconnected channel) ->
              `flat_lead`; no samples -> `no_signal`
  rate/length against what the manifest says: `rate_mismatch`, `length_mismatch`. Any rate and length
              the manifest agrees with is read as is; each model's preprocessing resamples / pads it (and
              notes that).
  window      a record longer than the protocol's window (a `wfdb` cohort's 60 s record) is read whole,
              checked against its full length (`record_samples`), and cut to the central window
              (`window_start`, docs/protocol.md §2.7), with a note.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raybench.core.errors import RaybenchError

LEADS: tuple[str, ...] = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
_CANON = {name.upper(): name for name in LEADS}
# header units -> factor to millivolts (compared case-insensitively; WFDB's default unit is mV)
UNIT_TO_MV: dict[str, float] = {"mv": 1.0, "millivolt": 1.0, "millivolts": 1.0, "uv": 1e-3, "\u00b5v": 1e-3,
                                "\u03bcv": 1e-3, "microvolt": 1e-3, "microvolts": 1e-3, "v": 1e3, "volt": 1e3,
                                "volts": 1e3, "nv": 1e-6}


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
    notes: tuple[str, ...] = ()  # what the reader changed (leads reordered or left out, units scaled)


def canonical_lead(name: str) -> str | None:
    """Header lead name -> our name (real PTB-XL headers say AVR/AVL/AVF)."""
    return _CANON.get(name.strip().upper())


def resolve_record_path(root: str | Path, rel_path: str) -> Path:
    """Join a manifest path onto the data root, refusing paths that escape it."""
    return _resolve_under(Path(root).resolve(), rel_path)


def _resolve_under(root: Path, rel_path: str) -> Path:
    """resolve_record_path for a root already resolved (resolving costs an lstat per path component)."""
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
    root = Path(root).resolve()
    base = _resolve_under(root, rel_path)
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
        for name in dict.fromkeys(fields[0] for fields in lines[1:]):  # 12 signals usually name one file
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


def _inside(root: Path, rel_path: str, target: str, name: str) -> None:
    """`target` (relative to the resolved `root`) lies inside it, else RecordError naming the header's `name`."""
    try:
        _resolve_under(root, target)
    except RecordError:
        raise RecordError(rel_path, "path_escapes_root",
                          f"its header names the file {name!r}, which lies outside the data root {root}"
                          "; the header is corrupt or crafted: re-download the record") from None


def parse_header(text: str) -> tuple[int, float, int | None, list[list[str]]]:
    """WFDB header -> (n_sig, fs, sig_len, the signal lines split into fields)."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    head = lines[0]
    n_sig = int(head[1])
    fs = float(head[2].split("/")[0].split("(")[0]) if len(head) > 2 else 250.0
    sig_len = int(head[3]) if len(head) > 3 else None
    return n_sig, fs, sig_len, lines[1:1 + n_sig]


def _read_format16(base: Path) -> tuple[np.ndarray, float, int | None, list[str], list[str]] | None:
    """Fast path for the common layout (PTB-XL, MIMIC): one format-16 file holding every signal.

    Returns (physical signal [n, n_sig] float64 with NaN for invalid samples, fs, header sig_len, names,
    units), or None when the header is anything else (then wfdb's general reader runs).
    """
    try:
        n_sig, fs, sig_len, sigs = parse_header(base.with_suffix(".hea").read_text())
        if len(sigs) != n_sig or len({s[0] for s in sigs}) != 1 or any(s[1] != "16" for s in sigs):
            return None
        gains, baselines, units = [], [], []
        for s in sigs:
            gain_field = s[2] if len(s) > 2 else "200"
            gain_txt, _, unit = gain_field.partition("/")
            units.append(unit or "mV")
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
    return physical, fs, sig_len, names, units


def window_start(total: int, window: int) -> int:
    """Where the protocol's window starts in a longer record: the central `window` samples (docs/protocol.md
    §2.7), so the filters' settling at the start and an electrode lifted at the end fall outside it."""
    if not 0 < window <= total:
        raise ValueError(f"window {window} must be in 1..{total} (the record's length)")
    return (total - window) // 2


def read_record(root: str | Path, rel_path: str, expect_fs: float | None = None,
                expect_samples: int | None = None, record_samples: int | None = None) -> Waveform:
    """Load `root/rel_path` (.hea/.dat), reorder leads, and check rate, shape and values.

    record_samples: the record's full length when it is longer than `expect_samples` (the manifest's window);
    the record must hold exactly that many and is cut to its central `expect_samples` (`window_start`)."""
    base = resolve_record_path(root, rel_path)
    if not base.with_suffix(".hea").exists():
        raise RecordError(rel_path, "missing_header", f"header {base}.hea not found; check the data root")
    check_header_files(root, rel_path)  # before either reader opens a file the header names
    try:
        fast = _read_format16(base)
        if fast is not None:
            sig, fs, sig_len, sig_names, sig_units = fast
        else:
            import wfdb

            rec = wfdb.rdrecord(str(base))
            sig, fs, sig_len, sig_names = rec.p_signal, float(rec.fs), rec.sig_len, list(rec.sig_name)
            sig_units = [u or "mV" for u in (rec.units or ["mV"] * len(sig_names))]
    except Exception as err:  # wfdb raises many types for corrupt/truncated files
        raise RecordError(rel_path, "unreadable",
                          f"cannot read WFDB files ({type(err).__name__}: {err}); re-download the record") from err
    if sig is None or sig.ndim != 2:
        raise RecordError(rel_path, "no_signal", "no physical signal in record; check the .dat file")
    if sig_len is not None and sig.shape[0] != sig_len:
        raise RecordError(rel_path, "shape_mismatch",
                          f"header says {sig_len} samples but data has {sig.shape[0]}; the .dat is truncated")
    if sig.shape[0] == 0:
        raise RecordError(rel_path, "no_signal", "the record holds no samples; check the .dat file")
    if expect_fs is not None and abs(float(fs) - expect_fs) > 1e-6:
        raise RecordError(rel_path, "rate_mismatch",
                          f"sampling rate {fs} Hz, expected {expect_fs} Hz; use the matching records folder")
    notes: list[str] = []
    cropped = expect_samples is not None and record_samples is not None and record_samples > expect_samples
    full = record_samples if cropped else expect_samples
    if full is not None and sig.shape[0] != full:
        raise RecordError(rel_path, "length_mismatch",
                          f"{sig.shape[0]} samples, expected {full}; the record is truncated or mislabeled")
    if cropped:
        start = window_start(sig.shape[0], int(expect_samples))
        sig = sig[start:start + int(expect_samples)]
        notes.append(f"cropped {full} -> {expect_samples} samples (the central window, from sample {start})")
    index = _lead_index(rel_path, sig_names, notes)
    factors = _mv_factors(rel_path, [sig_units[index[lead]] for lead in LEADS], notes)
    with np.errstate(over="ignore", invalid="ignore"):
        signal = np.stack([sig[:, index[lead]] * factors[k] for k, lead in enumerate(LEADS)]).astype(np.float32)
    nan = [LEADS[i] for i in range(12) if np.isnan(signal[i]).any()]
    inf = [LEADS[i] for i in range(12) if np.isinf(signal[i]).any()]
    if nan:
        raise RecordError(rel_path, "nan_lead", f"non-finite samples in leads {nan} (NaN: missing samples)"
                          + (f"; infinite samples in leads {inf}" if inf else ""))
    if inf:
        raise RecordError(rel_path, "inf_lead", f"infinite samples in leads {inf} (values beyond float32 after the "
                          "header's gain and units; the header's gain is corrupt)")
    zero = [LEADS[i] for i in range(12) if not signal[i].any()]
    flat = [LEADS[i] for i in range(12) if float(np.ptp(signal[i])) == 0.0 and LEADS[i] not in zero]
    if zero or flat:
        what = [f"all-zero leads {zero} (an empty or unconnected channel: nothing was recorded)"] if zero else []
        what += [f"flat (constant) leads {flat}; electrode off or empty channel"] if flat else []
        raise RecordError(rel_path, "flat_lead", "; ".join(what))
    return Waveform(signal=signal, fs=float(fs), record=rel_path, notes=tuple(notes))


def _lead_index(rel_path: str, sig_names: list[str], notes: list[str]) -> dict[str, int]:
    """Header signal names -> {lead: column}; reordering and left-out signals are noted, gaps/duplicates refused."""
    index: dict[str, int] = {}
    duplicate, extra = [], []
    for i, name in enumerate(sig_names):
        lead = canonical_lead(str(name))
        if lead is None:
            extra.append(str(name))
        elif lead in index:
            duplicate.append(lead)
        else:
            index[lead] = i
    missing = [lead for lead in LEADS if lead not in index]
    if duplicate:  # before `missing`: a lead named twice is usually the other lead mislabeled
        raise RecordError(rel_path, "duplicate_leads", f"leads {sorted(set(duplicate))} appear more than once "
                          f"(header has {sig_names}" + (f"; {missing} absent" if missing else "")
                          + "); which signal is the lead cannot be told")
    if missing:
        raise RecordError(rel_path, "missing_leads", f"leads {missing} absent (header has {sig_names})")
    order = [index[lead] for lead in LEADS]
    if order != sorted(order):
        header_order = [canonical_lead(str(n)) for n in sig_names if canonical_lead(str(n)) is not None]
        notes.append(f"leads reordered to the standard order (header order {', '.join(header_order)})")
    if extra:
        notes.append(f"signals {extra} left out (not one of the 12 standard leads)")
    return index


def _mv_factors(rel_path: str, units: list[str], notes: list[str]) -> list[float]:
    """Each lead's header unit -> factor to mV; scaled units are noted, non-voltage units refused."""
    factors: list[float] = []
    bad: dict[str, list[str]] = {}
    scaled: dict[str, list[str]] = {}
    for lead, unit in zip(LEADS, units, strict=True):
        factor = UNIT_TO_MV.get(str(unit).strip().lower())
        if factor is None:
            bad.setdefault(str(unit), []).append(lead)
            factor = 1.0
        elif factor != 1.0:
            scaled.setdefault(str(unit), []).append(lead)
        factors.append(factor)
    if bad:
        raise RecordError(rel_path, "bad_units", "leads in units that are not a voltage: "
                          + "; ".join(f"{u!r} in {leads}" for u, leads in bad.items())
                          + f"; expected mV, uV or V (known: {sorted(UNIT_TO_MV)})")
    for unit, leads in scaled.items():
        which = "all leads" if len(leads) == len(LEADS) else f"leads {leads}"
        notes.append(f"units {unit} -> mV (x{UNIT_TO_MV[unit.strip().lower()]:g}) in {which}")
    return factors


def prepare_records_run(records, num_cpus: int | None) -> None:
    """Refuse a records table the concept runners cannot measure (columns ecg_id, path, fs; unique ids), then start
    Ray here when nothing has (at most num_cpus CPUs): both runners (seven and 49 concepts) start this way."""
    import ray

    missing = {"ecg_id", "path", "fs"} - set(records.columns)
    if missing:
        raise ValueError(f"records table lacks columns {sorted(missing)}; expected ecg_id, path, fs")
    if records["ecg_id"].duplicated().any():
        dup = records.loc[records["ecg_id"].duplicated(), "ecg_id"].head(5).tolist()
        raise ValueError(f"duplicate ecg_id values {dup}; each record needs a unique id")
    if not ray.is_initialized():
        from raybench.core.config import ResourceConfig
        from raybench.infra.ray_session import init_ray

        init_ray(ResourceConfig(num_cpus=num_cpus))
