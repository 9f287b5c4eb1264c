"""The published waveform-concept extractor (`published`): the protocol's extraction as its code ran.

The protocol's own extraction as its published code ran it on MIMIC-IV-ECG
(JayDuan123/2027-kdd-ECG-InterpBench: scripts/build_waveform_extraction_smoke.py `extract_record`, used by
build_track_f_full_waveform_concepts.py). Lead II (NaN -> 0) is cleaned, R peaks are the detector's marks as
returned (no steepness or spacing filter), every beat is delineated with the DWT. Each fiducial list is
stripped of missing points and then paired by position (`zip(onsets, offsets)`, kept when offset > onset):
QRS = R onset -> R offset, PR = P onset -> R onset, QT-like = R onset -> T offset, so a point the DWT misses
shifts the pairing onto the next beat's point (where it usually fails offset > onset or the window). The
same plausibility windows apply. Amplitudes are raw: the largest |value| across the 12 leads at the
detector's R mark, at the T peak and 60 ms after the (DWT) R offset, with no baseline reference (a DC offset
or baseline wander adds to them). Values are rounded to 6 significant digits, as the published CSV stored
them. A record fails (`ConceptError`, the published `status != "ok"`) on fewer than 3 R peaks or any error
in neurokit.

Documented differences from `refined` (`raybench.cohorts.extractor_refined`): wider lead-II DWT QRS
(~110-120 ms for narrow complexes), a PR/QT lost or shifted where a P onset / T offset / R onset is missed,
T waves counted as beats where the detector marks them, and amplitudes shifted by the baseline offset at the
sample read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

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
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.waveforms import LEADS

PUBLISHED_DIGITS = 6  # the published extractor wrote f"{value:.6g}"


def _finite_ints(values: Iterable[object]) -> list[int]:
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


def _raw_global_abs(signal: np.ndarray, indices: list[int]) -> float:
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
    return median(vals)


def _as_published(value: float) -> float:
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

    def window(pairs: Iterable[tuple[int, int]], lo: float, hi: float) -> float:
        return median([x for x in ((b - a) / fs * 1000.0 for a, b in pairs) if lo <= x <= hi])

    values = {
        "rr_mean_ms": window(zip(rpeaks[:-1], rpeaks[1:], strict=True), *RR_WINDOW),
        "qrs_duration_ms": window(((a, b) for a, b in zip(r_on, r_off, strict=False) if b > a), *QRS_WINDOW),
        "pr_interval_ms": window(((a, b) for a, b in zip(p_on, r_on, strict=False) if b > a), *PR_WINDOW),
        "qt_like_ms": window(((a, b) for a, b in zip(r_on, t_off, strict=False) if b > a), *QT_WINDOW),
        "r_amp_global_mv": _raw_global_abs(signal, list(rpeaks)),
        "st_amp_global_mv": _raw_global_abs(signal, [i + int(round(ST_OFFSET_MS / 1000.0 * fs)) for i in r_off]),
        "t_amp_global_mv": _raw_global_abs(signal, t_peak),
    }
    return {name: _as_published(values[name]) for name in WAVEFORM_CONCEPTS}


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
