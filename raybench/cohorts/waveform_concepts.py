"""The seven waveform-derived concepts (MIMIC replication; any WFDB cohort without PTB-XL+ tables).

Method (docs/protocol.md §4.1): lead II is cleaned (`nk.ecg_clean`), R peaks
are found (`nk.ecg_peaks`) and every beat is delineated (`nk.ecg_delineate(method="dwt")`).

Choices this module makes, and why:
- R peaks far less steep than the record's typical beat are dropped, and peaks closer than 250 ms
  (the RR window's floor) resolved to the steeper one: neurokit's detector marks tall lead-II T waves
  as beats (seen on generated records), which would halve rr_mean_ms.
- QRS bounds are re-measured after the DWT, globally. The DWT's lead-II QRS onset/offset sit where a
  coarse-scale wavelet slope falls to half its peak; that kernel is ~60 ms wide at 2 kHz, so every QRS
  narrower than ~110 ms comes out ~110-120 ms wide, and the DWT bounds sometimes land on the P wave.
  Lead II alone also cannot see a QRS end carried by other leads (a lead II without an s wave).
  So the bounds are the cluster of samples around the R peak where the 12-lead slope magnitude exceeds
  `SLOPE_FRACTION` of the beat's largest (`_qrs_bounds`): the global QRS that 12SL/ECGDeli report as
  QRS_Dur_Global and MIMIC's machine measurements as qrs_onset/qrs_end. Lead II still locates the beats;
  detections are judged by their 12-lead steepness (a lead-II QRS near -30 deg axis can be smaller than
  its T wave). The R amplitude is read at lead II's R apex within these bounds (`_r_apex`), not at the
  detector's mark, which can sit on the S of an rS complex. `refine_qrs=False` gives the protocol's
  plain lead-II DWT bounds and detector marks.
- Intervals are per-beat differences (points of one beat are paired with that beat's R peak, never
  zipped across beats), kept when inside the plausibility windows, then the median over beats.
  qt_like_ms is QRS onset -> T offset; pr_interval_ms is P onset -> QRS onset.
- Amplitudes are read on the raw 12-lead signal relative to each beat's isoelectric level: per lead,
  the median of the PR segment just before the QRS onset (`BASELINE_WINDOW_MS`). Clinical ST and
  amplitude measurements are referenced to the PR/PQ junction, and this removes baseline wander
  without the ST distortion a high-pass filter causes. The value per beat is the largest |value|
  across the 12 leads (an unsigned magnitude, as in the protocol's extraction code); the concept is
  the median over beats. ST is read `ST_OFFSET_MS` after the (refined) QRS offset.

`measure_record` raises `ConceptError` (a `RecordError`) with a short reason when a record cannot be
measured at all; concepts that cannot be measured on an otherwise usable record come back as NaN.
`extract_concepts` runs it as Ray tasks and never lets one bad record stop the others.

Two extractors (`EXTRACTORS`, chosen by `extractor=`; config `cohort.concept_extractor`):
- `refined` (`measure_record`): everything above.
- `published` (`measure_record_published`): the protocol's own extraction as its published code ran it on
  MIMIC-IV-ECG (JayDuan123/2027-kdd-ECG-InterpBench: scripts/build_waveform_extraction_smoke.py
  `extract_record`, used by build_track_f_full_waveform_concepts.py). Lead II (NaN -> 0) is cleaned, R peaks
  are the detector's marks as returned (no steepness or spacing filter), every beat is delineated with the
  DWT. Each fiducial list is stripped of missing points and then paired by position (`zip(onsets, offsets)`,
  kept when offset > onset): QRS = R onset -> R offset, PR = P onset -> R onset, QT-like = R onset -> T
  offset, so a point the DWT misses shifts the pairing onto the next beat's point (where it usually fails
  offset > onset or the window). The same plausibility windows apply. Amplitudes are raw: the largest |value|
  across the 12 leads at the detector's R mark, at the T peak and 60 ms after the (DWT) R offset, with no
  baseline reference (a DC offset or baseline wander adds to them). Values are rounded to 6 significant
  digits, as the published CSV stored them. A record fails (`ConceptError`, the published `status != "ok"`) on
  fewer than 3 R peaks or any error in neurokit.
  Documented differences from `refined`: wider lead-II DWT QRS (~110-120 ms for narrow complexes), a
  PR/QT lost or shifted where a P onset / T offset / R onset is missed, T waves counted as beats where
  the detector marks them, and amplitudes shifted by the baseline offset at the sample read.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.waveforms import LEADS, RecordError, read_record

LEAD_II = LEADS.index("II")
# plausibility windows (ms), docs/protocol.md §4.1
RR_WINDOW = (250.0, 2500.0)
QRS_WINDOW = (40.0, 220.0)
PR_WINDOW = (60.0, 320.0)
QT_WINDOW = (180.0, 700.0)
ST_OFFSET_MS = 60.0
BASELINE_WINDOW_MS = (30.0, 6.0)  # PR-segment window: from 30 ms to 6 ms before the QRS onset
BASELINE_FALLBACK_MS = (110.0, 80.0)  # before the R peak, for beats without a QRS onset
SLOPE_FRACTION = 0.10  # QRS bound = first/last sample with spatial slope >= this fraction of the beat's max
SEARCH_MS = 150.0  # QRS bounds are searched this far either side of the R peak
CORE_MS = 60.0  # the beat's largest slope is taken this close to the R peak
GAP_MS = 16.0  # significant-slope runs closer than this belong to one QRS ...
JOIN_FRACTION = 0.2  # ... and, after the R peak, only if this steep (module doc)
MIN_BEATS = 3
MIN_PEAK_SCORE = 0.3  # a detection this much less steep than the typical beat is not a QRS
MIN_SECONDS = 2.0
EXTRACTORS: tuple[str, ...] = ("published", "refined")
PUBLISHED_DIGITS = 6  # the published extractor wrote f"{value:.6g}"


class ConceptError(RecordError):
    """A record that cannot be measured; `reason` is a short tag (too_few_beats, delineation_failed...)."""

    def __init__(self, reason: str, detail: str, record: str = "<signal>"):
        super().__init__(record, reason, detail)


@contextmanager
def quiet() -> Iterator[None]:
    """neurokit2 and numpy warn on every short or noisy record; the reasons are reported instead."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def _nan_concepts() -> dict[str, float]:
    return {name: math.nan for name in WAVEFORM_CONCEPTS}


def _median(values: list[float]) -> float:
    return float(np.median(values)) if values else math.nan


def _point(waves: dict, key: str, n_beats: int) -> np.ndarray:
    """Per-beat sample index (float, NaN when missing), aligned with the R peaks.

    neurokit drops points at sample <= 0 from its lists (only possible for the first beats), so a
    short list is padded at the front; per-beat geometry checks then reject any misfit.
    """
    arr = np.asarray(waves.get(key, []), dtype=float)
    if arr.size > n_beats:
        arr = arr[:n_beats]
    if arr.size < n_beats:
        arr = np.concatenate([np.full(n_beats - arr.size, np.nan), arr])
    return arr


def _smoothed_slope(x: np.ndarray, fs: float) -> np.ndarray:
    """Savitzky-Golay first derivative over ~20 ms (mV/sample), robust to sample-level noise."""
    from scipy.signal import savgol_filter

    window = max(5, int(round(0.020 * fs)) | 1)
    return savgol_filter(x, window, 2, deriv=1)


def _runs(mask: np.ndarray) -> np.ndarray:
    """Starts of two-sample runs in `mask`, so a single noisy sample never decides a bound."""
    idx = np.flatnonzero(mask)
    return idx[np.flatnonzero(np.diff(idx) == 1)]


def _drop_close_peaks(rpeaks: np.ndarray, slope: np.ndarray, fs: float) -> np.ndarray:
    """Drop detections that are not QRS complexes, judged by their steepness.

    neurokit's detector sometimes marks a tall lead-II T wave as a beat (R-T-R-T...). T waves are far
    less steep than QRS complexes, so with score = max |slope| within +-40 ms: peaks scoring below
    `MIN_PEAK_SCORE` x the median score of the steeper half are dropped, and of two peaks closer than
    the shortest plausible RR the steeper one is kept.
    """
    if rpeaks.size < 2:
        return rpeaks
    half = int(round(0.040 * fs))
    score = np.array([np.abs(slope[max(0, r - half):r + half + 1]).max() for r in rpeaks])
    steep = np.sort(score)[score.size // 2:]
    strong = score >= MIN_PEAK_SCORE * float(np.median(steep))
    rpeaks, score = rpeaks[strong], score[strong]
    min_gap = RR_WINDOW[0] * fs / 1000.0
    keep: list[int] = []
    for i in range(rpeaks.size):
        if keep and rpeaks[i] - rpeaks[keep[-1]] < min_gap:
            if score[i] > score[keep[-1]]:
                keep[-1] = i
            continue
        keep.append(i)
    return rpeaks[keep]


def _spatial_slope(signal: np.ndarray, fs: float) -> np.ndarray:
    """Magnitude of the 12-lead slope vector, sqrt(sum over leads of slope^2) per sample (mV/sample).

    Differentiating removes baseline offsets and most of the wander, so the raw leads are used.
    """
    from scipy.signal import savgol_filter

    window = max(5, int(round(0.020 * fs)) | 1)
    slopes = savgol_filter(signal, window, 2, deriv=1, axis=1)
    return np.sqrt(np.einsum("lt,lt->t", slopes, slopes))


def _qrs_bounds(mag: np.ndarray, r: int, lo_limit: int, hi_limit: int, fs: float) -> tuple[float, float]:
    """Global QRS onset and offset of the beat at R peak `r` from the spatial slope magnitude `mag`.

    Significant samples (>= SLOPE_FRACTION of the largest slope within `CORE_MS` of r, in two-sample runs
    so one noisy sample never decides) are searched within `SEARCH_MS` of r and inside
    [lo_limit, hi_limit) (halfway to the neighbouring beats). Starting from the run nearest r, runs
    closer than `GAP_MS` are joined (the slope's zero crossings at the q, R and S apices); after the R a
    run joins only if it is also steep (peak >= `JOIN_FRACTION` of the largest), so an ST segment that
    slopes up from the J point ends the QRS there. Returns (onset, offset) sample positions, offset just
    past the last significant sample; NaN when nothing is significant.
    """
    ms = fs / 1000.0
    lo = max(lo_limit, int(r - SEARCH_MS * ms), 0)
    hi = min(hi_limit, int(r + SEARCH_MS * ms) + 1, mag.size)
    core = mag[max(lo, int(r - CORE_MS * ms)):min(hi, int(r + CORE_MS * ms) + 1)]
    if hi - lo < 4 or core.size == 0 or not np.isfinite(core).all() or core.max() <= 0:
        return math.nan, math.nan
    top = float(core.max())
    starts = _runs(mag[lo:hi] >= SLOPE_FRACTION * top)
    if starts.size == 0:
        return math.nan, math.nan
    sig = np.unique(np.concatenate([starts, starts + 1])) + lo  # both samples of each run
    runs = np.split(sig, np.flatnonzero(np.diff(sig) > 1) + 1)
    dist = [0 if c[0] <= r <= c[-1] else min(abs(c[0] - r), abs(c[-1] - r)) for c in runs]
    first = last = int(np.argmin(dist))
    gap = GAP_MS * ms
    while first > 0 and runs[first][0] - runs[first - 1][-1] <= gap:
        first -= 1
    while (last + 1 < len(runs) and runs[last + 1][0] - runs[last][-1] <= gap
           and (runs[last + 1][0] < r or mag[runs[last + 1]].max() >= JOIN_FRACTION * top)):
        last += 1
    return float(runs[first][0]), float(runs[last][-1] + 1)


def _r_apex(lead: np.ndarray, base: float, r: int, on: float, off: float) -> int:
    """The R peak as the apex of lead II's positive QRS deflection within the QRS bounds.

    neurokit's detector may mark the S nadir of an rS complex (left-axis records) or a point on the
    slope; the R amplitude is defined at the R apex. Falls back to `r` when the bounds are missing or
    lead II has no positive deflection (QS complex).
    """
    if math.isnan(on) or math.isnan(off) or not math.isfinite(base):
        return r
    lo, hi = int(on), int(off) + 1
    seg = lead[lo:hi] - base
    if seg.size == 0 or seg.max() <= 0:
        return r
    return lo + int(np.argmax(seg))


def _global_abs(signal: np.ndarray, baseline: np.ndarray, idx: float) -> float:
    """Largest |value| across leads at sample `idx`, relative to that beat's per-lead baseline."""
    if math.isnan(idx) or not 0 <= int(idx) < signal.shape[1] or not np.isfinite(baseline).all():
        return math.nan
    return float(np.max(np.abs(signal[:, int(idx)] - baseline)))


def _baseline(signal: np.ndarray, r: int, qrs_on: float, fs: float) -> np.ndarray:
    """Per-lead isoelectric level of one beat: median of the PR segment before the QRS onset."""
    if not math.isnan(qrs_on):
        start, stop = qrs_on - BASELINE_WINDOW_MS[0] * fs / 1000.0, qrs_on - BASELINE_WINDOW_MS[1] * fs / 1000.0
    else:
        start, stop = r - BASELINE_FALLBACK_MS[0] * fs / 1000.0, r - BASELINE_FALLBACK_MS[1] * fs / 1000.0
    start, stop = max(0, int(round(start))), int(round(stop))
    if stop - start < 2:
        return np.full(signal.shape[0], np.nan)
    return np.median(signal[:, start:stop], axis=1)


def measure_record(signal: np.ndarray, fs: float, refine_qrs: bool = True) -> dict[str, float]:
    """The seven concepts of one record. signal: [12, T] mV in LEADS order; fs in Hz.

    Returns {concept: value} with NaN for concepts no beat could measure; raises `ConceptError`
    when the record as a whole cannot be measured.
    """
    import neurokit2 as nk

    signal = np.asarray(signal, dtype=np.float64)
    if signal.ndim != 2 or signal.shape[0] != len(LEADS):
        raise ConceptError("bad_shape", f"expected a [12, T] signal, got shape {signal.shape}")
    if not np.isfinite(signal).all():
        raise ConceptError("nan_signal", "non-finite samples; read records with waveforms.read_record")
    if not fs > 0 or signal.shape[1] < MIN_SECONDS * fs:
        raise ConceptError("too_short", f"{signal.shape[1]} samples at {fs} Hz; need >= {MIN_SECONDS} s")
    lead = signal[LEAD_II]
    if float(np.ptp(lead)) == 0.0:
        raise ConceptError("flat_lead_ii", "lead II is constant; no beats to measure")
    with quiet():
        try:
            cleaned = np.asarray(nk.ecg_clean(lead, sampling_rate=fs), dtype=np.float64)
            _, info = nk.ecg_peaks(cleaned, sampling_rate=fs)
        except Exception as err:  # neurokit raises bare ValueError/IndexError on odd signals
            raise ConceptError("peak_detection_failed", f"{type(err).__name__}: {err}") from err
        rpeaks = np.asarray(info.get("ECG_R_Peaks", []), dtype=float)
        # steepness judged on the 12-lead slope when refining: a lead-II QRS can be tiny (axis near -30)
        mag = _spatial_slope(signal, fs) if refine_qrs else None
        slope = mag if mag is not None else np.abs(_smoothed_slope(cleaned, fs))
        rpeaks = _drop_close_peaks(np.sort(rpeaks[np.isfinite(rpeaks)]).astype(int), slope, fs)
        if rpeaks.size < MIN_BEATS:
            raise ConceptError("too_few_beats", f"{rpeaks.size} R peaks in lead II (need >= {MIN_BEATS})")
        try:
            _, waves = nk.ecg_delineate(cleaned, rpeaks, sampling_rate=fs, method="dwt")
        except Exception as err:
            raise ConceptError("delineation_failed", f"{type(err).__name__}: {err}") from err
        return _concepts_from_points(signal, mag, rpeaks, waves, fs)


def _concepts_from_points(signal: np.ndarray, mag: np.ndarray | None, rpeaks: np.ndarray, waves: dict,
                          fs: float) -> dict[str, float]:
    n = rpeaks.size
    ms = 1000.0 / fs
    r_on, r_off = _point(waves, "ECG_R_Onsets", n), _point(waves, "ECG_R_Offsets", n)
    p_on, t_off = _point(waves, "ECG_P_Onsets", n), _point(waves, "ECG_T_Offsets", n)
    t_peak = _point(waves, "ECG_T_Peaks", n)

    rr, qrs, pr, qt, r_amp, st_amp, t_amp = ([] for _ in range(7))
    for i in range(1, n):
        d = (rpeaks[i] - rpeaks[i - 1]) * ms
        if RR_WINDOW[0] <= d <= RR_WINDOW[1]:
            rr.append(d)
    for i, r in enumerate(rpeaks):
        on, off = r_on[i], r_off[i]
        if not (math.isnan(on) or math.isnan(off)) and not on < r < off:
            on = off = math.nan  # points of another beat
        if mag is not None:
            lo_limit = (int(rpeaks[i - 1]) + int(r)) // 2 if i else 0
            hi_limit = (int(r) + int(rpeaks[i + 1])) // 2 if i + 1 < n else signal.shape[1]
            on, off = _qrs_bounds(mag, int(r), lo_limit, hi_limit, fs)
        nxt = rpeaks[i + 1] if i + 1 < n else signal.shape[1]
        if not math.isnan(on) and not math.isnan(off):
            d = (off - on) * ms
            if QRS_WINDOW[0] <= d <= QRS_WINDOW[1]:
                qrs.append(d)
        if not math.isnan(on) and not math.isnan(p_on[i]) and p_on[i] < on:
            d = (on - p_on[i]) * ms
            if PR_WINDOW[0] <= d <= PR_WINDOW[1]:
                pr.append(d)
        if not math.isnan(on) and not math.isnan(t_off[i]) and t_off[i] > max(r, off if not math.isnan(off) else r):
            d = (t_off[i] - on) * ms
            if QT_WINDOW[0] <= d <= QT_WINDOW[1] and t_off[i] <= nxt:
                qt.append(d)
        base = _baseline(signal, int(r), on, fs)
        apex = _r_apex(signal[LEAD_II], float(base[LEAD_II]), int(r), on, off) if mag is not None else int(r)
        r_amp.append(_global_abs(signal, base, float(apex)))
        tp = t_peak[i]
        if not math.isnan(tp) and r < tp < nxt:
            t_amp.append(_global_abs(signal, base, tp))
        if not math.isnan(off):
            st_idx = off + round(ST_OFFSET_MS / ms)
            if st_idx < nxt:
                st_amp.append(_global_abs(signal, base, float(st_idx)))

    def med(values: list[float]) -> float:
        return _median([v for v in values if math.isfinite(v)])

    return {
        "rr_mean_ms": med(rr),
        "qrs_duration_ms": med(qrs),
        "pr_interval_ms": med(pr),
        "qt_like_ms": med(qt),
        "r_amp_global_mv": med(r_amp),
        "st_amp_global_mv": med(st_amp),
        "t_amp_global_mv": med(t_amp),
    }


# ---------------------------------------------------------------- the published extractor


def _finite_ints(values) -> list[int]:  # noqa: ANN001 - neurokit lists / arrays
    """The published `[int(x) for x in finite_values(...)]`: missing points dropped, not kept in place."""
    out = []
    for value in values:
        try:
            x = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(x):
            out.append(int(x))
    return out


def _published_median(values: list[float]) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def _published_global_abs(signal: np.ndarray, indices: list[int]) -> float:
    """Median over `indices` of the largest |raw value| across leads (no baseline reference)."""
    vals = []
    n = signal.shape[1]
    for idx in indices:
        if idx < 0 or idx >= n:
            continue
        col = signal[:, idx]
        if not np.isfinite(col).any():
            continue
        vals.append(float(np.nanmax(np.abs(col))))
    return _published_median(vals)


def _published_round(value: float) -> float:
    return float(f"{value:.{PUBLISHED_DIGITS}g}") if math.isfinite(value) else math.nan


def published_concepts(signal: np.ndarray, rpeaks: list[int], waves: dict, fs: float) -> dict[str, float]:
    """The seven concepts from detector marks and DWT points exactly as the published code pairs them.

    signal: [12, T] raw mV; rpeaks: the detector's R marks; waves: `nk.ecg_delineate` output.
    """
    r_on = _finite_ints(waves.get("ECG_R_Onsets", []))
    r_off = _finite_ints(waves.get("ECG_R_Offsets", []))
    p_on = _finite_ints(waves.get("ECG_P_Onsets", []))
    t_off = _finite_ints(waves.get("ECG_T_Offsets", []))
    t_peak = _finite_ints(waves.get("ECG_T_Peaks", []))

    def window(pairs, lo: float, hi: float) -> float:  # noqa: ANN001
        return _published_median([x for x in ((b - a) / fs * 1000.0 for a, b in pairs) if lo <= x <= hi])

    values = {
        "rr_mean_ms": window(zip(rpeaks[:-1], rpeaks[1:], strict=True), *RR_WINDOW),
        "qrs_duration_ms": window(((a, b) for a, b in zip(r_on, r_off, strict=False) if b > a), *QRS_WINDOW),
        "pr_interval_ms": window(((a, b) for a, b in zip(p_on, r_on, strict=False) if b > a), *PR_WINDOW),
        "qt_like_ms": window(((a, b) for a, b in zip(r_on, t_off, strict=False) if b > a), *QT_WINDOW),
        "r_amp_global_mv": _published_global_abs(signal, list(rpeaks)),
        "st_amp_global_mv": _published_global_abs(signal, [i + int(round(0.06 * fs))  # ST_OFFSET_MS
                                                           for i in r_off]),
        "t_amp_global_mv": _published_global_abs(signal, t_peak),
    }
    return {name: _published_round(values[name]) for name in WAVEFORM_CONCEPTS}


def measure_record_published(signal: np.ndarray, fs: float) -> dict[str, float]:
    """The published extractor on one record (module doc). signal: [12, T] mV in LEADS order."""
    import neurokit2 as nk

    signal = np.asarray(signal, dtype=np.float64)
    if signal.ndim != 2 or signal.shape[0] != len(LEADS):
        raise ConceptError("bad_shape", f"expected a [12, T] signal with lead II, got shape {signal.shape}")
    lead = signal[LEAD_II]
    if not np.isfinite(lead).all():
        lead = np.nan_to_num(lead, nan=0.0)
    with quiet():
        try:
            cleaned = nk.ecg_clean(lead, sampling_rate=fs)
            _, info = nk.ecg_peaks(cleaned, sampling_rate=fs)
            rpeaks = _finite_ints(info.get("ECG_R_Peaks", []))
            if len(rpeaks) < 3:
                raise ConceptError("too_few_beats", f"{len(rpeaks)} R peaks in lead II (need >= 3)")
            _, waves = nk.ecg_delineate(cleaned, rpeaks, sampling_rate=fs, method="dwt")
            return published_concepts(signal, rpeaks, waves, fs)
        except ConceptError:
            raise
        except Exception as err:  # the published code marks any error as a failed record
            raise ConceptError("extraction_failed", f"{type(err).__name__}: {err}") from err


def measure_signal(signal: np.ndarray, fs: float, extractor: str = "refined", refine_qrs: bool = True
                   ) -> dict[str, float]:
    """Dispatch to the chosen extractor (`refine_qrs` applies to `refined` only)."""
    if extractor == "published":
        return measure_record_published(signal, fs)
    if extractor == "refined":
        return measure_record(signal, fs, refine_qrs=refine_qrs)
    raise ValueError(f"unknown concept extractor {extractor!r}; expected one of {list(EXTRACTORS)}")


def measure_path(root: str | Path, rel_path: str, fs: float | None, refine_qrs: bool = True,
                 extractor: str = "refined") -> dict[str, float]:
    """Read one WFDB record (validated, LEADS order) and measure it; errors name the record."""
    wave = read_record(root, rel_path, expect_fs=fs)
    try:
        return measure_signal(wave.signal, wave.fs, extractor, refine_qrs)
    except ConceptError as err:
        raise ConceptError(err.reason, err.detail, record=rel_path) from err


def measure_rows(root: str, rows: list[tuple[int, str, float | None]], refine_qrs: bool = True,
                 extractor: str = "refined"
                 ) -> tuple[list[tuple[int, dict[str, float]]], list[tuple[int, str, str]]]:
    """Measure a chunk of (ecg_id, path, fs); returns (values, failures as (ecg_id, reason, detail))."""
    values, failures = [], []
    for ecg_id, path, fs in rows:
        try:
            values.append((ecg_id, measure_path(root, path, fs, refine_qrs, extractor)))
        except RecordError as err:
            failures.append((ecg_id, err.reason, err.detail))
        except Exception as err:  # never lose the rest of the chunk to one unexpected error
            failures.append((ecg_id, "unexpected_error", f"{type(err).__name__}: {err}"))
    return values, failures


def extract_concepts(root: Path, records: pd.DataFrame, num_cpus: int | None = None, chunk_size: int | None = None,
                     refine_qrs: bool = True, extractor: str = "refined") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Measure every record as Ray tasks over chunks (`extractor`: refined | published, module doc).

    records: columns ecg_id, path (relative to root, no extension), fs (expected Hz; NaN/None skips
    the check). num_cpus: at most this many tasks in flight (default: the cluster's CPUs); also used
    when Ray must be started here. Returns (concepts indexed by ecg_id in input order with the seven
    WAVEFORM_CONCEPTS columns, NaN where unmeasured; failures with ecg_id, reason, detail).
    Runs where the data lives: concept values are record-level and stay in the user's environment.
    """
    import ray

    missing = {"ecg_id", "path", "fs"} - set(records.columns)
    if missing:
        raise ValueError(f"records table lacks columns {sorted(missing)}; expected ecg_id, path, fs")
    if extractor not in EXTRACTORS:
        raise ValueError(f"unknown concept extractor {extractor!r}; expected one of {list(EXTRACTORS)}")
    if records["ecg_id"].duplicated().any():
        dup = records.loc[records["ecg_id"].duplicated(), "ecg_id"].head(5).tolist()
        raise ValueError(f"duplicate ecg_id values {dup}; each record needs a unique id")
    if not ray.is_initialized():
        from raybench.config import ResourceConfig
        from raybench.ray_session import init_ray

        init_ray(ResourceConfig(num_cpus=num_cpus))
    ids = records["ecg_id"].to_numpy()
    rows = [(_as_id(e), str(p), None if f is None or pd.isna(f) else float(f))
            for e, p, f in zip(ids, records["path"], records["fs"], strict=True)]
    slots = max(1, int(num_cpus or ray.cluster_resources().get("CPU", 1)))
    if chunk_size is None:  # ~4 chunks per slot for balance, at most 64 records each
        chunk_size = max(1, min(64, math.ceil(len(rows) / (4 * slots))))
    chunks = [rows[i:i + chunk_size] for i in range(0, len(rows), chunk_size)]
    task = ray.remote(num_cpus=1, max_retries=1)(_measure_rows_task)
    root_s = str(root)
    pending, results = [], []
    for chunk in chunks:
        if len(pending) >= slots:
            done, pending = ray.wait(pending, num_returns=1)
            results.extend(ray.get(done))
        pending.append(task.remote(root_s, chunk, refine_qrs, extractor))
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


def _measure_rows_task(root: str, rows: list, refine_qrs: bool, extractor: str = "refined"):
    return measure_rows(root, rows, refine_qrs, extractor)


def _as_id(value):
    return int(value) if isinstance(value, (int, np.integer)) else value

