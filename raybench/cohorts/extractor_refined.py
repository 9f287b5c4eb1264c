"""The refined waveform-concept extractor (`refined`): raybench's measurement of the seven concepts.

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
  `SLOPE_FRACTION` of the beat's largest (`qrs_bounds`): the global QRS that 12SL/ECGDeli report as
  QRS_Dur_Global and MIMIC's machine measurements as qrs_onset/qrs_end. Lead II still locates the beats;
  detections are judged by their 12-lead steepness (a lead-II QRS near -30 deg axis can be smaller than
  its T wave). The R amplitude is read at lead II's R apex within these bounds (`r_apex`), not at the
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
"""

from __future__ import annotations

import math

import numpy as np

from raybench.cohorts.extractor_rules import (
    LEAD_II,
    PR_WINDOW,
    QRS_WINDOW,
    QT_WINDOW,
    RR_WINDOW,
    ST_OFFSET_MS,
    ConceptError,
    median,
    quiet,
)
from raybench.cohorts.waveforms import LEADS

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


def beat_points(waves: dict, key: str, n_beats: int) -> np.ndarray:
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
    """Savitzky-Golay first derivative over ~20 ms along the last axis (mV/sample), robust to sample noise."""
    from scipy.signal import savgol_filter

    window = max(5, int(round(0.020 * fs)) | 1)
    return savgol_filter(x, window, 2, deriv=1, axis=-1)


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


def spatial_slope(signal: np.ndarray, fs: float) -> np.ndarray:
    """Magnitude of the 12-lead slope vector, sqrt(sum over leads of slope^2) per sample (mV/sample).

    Differentiating removes baseline offsets and most of the wander, so the raw leads are used.
    """
    slopes = _smoothed_slope(signal, fs)
    return np.sqrt(np.einsum("lt,lt->t", slopes, slopes))


def qrs_bounds(mag: np.ndarray, r: int, lo_limit: int, hi_limit: int, fs: float) -> tuple[float, float]:
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


def r_apex(lead: np.ndarray, base: float, r: int, on: float, off: float) -> int:
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


def global_abs(signal: np.ndarray, baseline: np.ndarray, idx: float) -> float:
    """Largest |value| across leads at sample `idx`, relative to that beat's per-lead baseline."""
    if math.isnan(idx) or not 0 <= int(idx) < signal.shape[1] or not np.isfinite(baseline).all():
        return math.nan
    return float(np.max(np.abs(signal[:, int(idx)] - baseline)))


def beat_baseline(signal: np.ndarray, r: int, qrs_on: float, fs: float) -> np.ndarray:
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
        mag = spatial_slope(signal, fs) if refine_qrs else None
        slope = mag if mag is not None else np.abs(_smoothed_slope(cleaned, fs))
        rpeaks = _drop_close_peaks(np.sort(rpeaks[np.isfinite(rpeaks)]).astype(int), slope, fs)
        if rpeaks.size < MIN_BEATS:
            raise ConceptError("too_few_beats", f"{rpeaks.size} R peaks in lead II (need >= {MIN_BEATS})")
        try:
            _, waves = nk.ecg_delineate(cleaned, rpeaks, sampling_rate=fs, method="dwt")
        except Exception as err:
            raise ConceptError("delineation_failed", f"{type(err).__name__}: {err}") from err
        return concepts_from_points(signal, mag, rpeaks, waves, fs)


def concepts_from_points(signal: np.ndarray, mag: np.ndarray | None, rpeaks: np.ndarray, waves: dict,
                          fs: float) -> dict[str, float]:
    n = rpeaks.size
    ms = 1000.0 / fs
    r_on, r_off = beat_points(waves, "ECG_R_Onsets", n), beat_points(waves, "ECG_R_Offsets", n)
    p_on, t_off = beat_points(waves, "ECG_P_Onsets", n), beat_points(waves, "ECG_T_Offsets", n)
    t_peak = beat_points(waves, "ECG_T_Peaks", n)

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
            on, off = qrs_bounds(mag, int(r), lo_limit, hi_limit, fs)
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
        base = beat_baseline(signal, int(r), on, fs)
        apex = r_apex(signal[LEAD_II], float(base[LEAD_II]), int(r), on, off) if mag is not None else int(r)
        r_amp.append(global_abs(signal, base, float(apex)))
        tp = t_peak[i]
        if not math.isnan(tp) and r < tp < nxt:
            t_amp.append(global_abs(signal, base, tp))
        if not math.isnan(off):
            st_idx = off + round(ST_OFFSET_MS / ms)
            if st_idx < nxt:
                st_amp.append(global_abs(signal, base, float(st_idx)))

    def med(values: list[float]) -> float:
        return median([v for v in values if math.isfinite(v)])

    return {
        "rr_mean_ms": med(rr),
        "qrs_duration_ms": med(qrs),
        "pr_interval_ms": med(pr),
        "qt_like_ms": med(qt),
        "r_amp_global_mv": med(r_amp),
        "st_amp_global_mv": med(st_amp),
        "t_amp_global_mv": med(t_amp),
    }
