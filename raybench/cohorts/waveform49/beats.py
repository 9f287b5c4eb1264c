"""Beats of one record: filter, find the QRS complexes from all 12 leads, build one median beat per lead.

Why this shape: every waveform49 measurement is read from a representative beat, not from single beats,
because the median of ~10 aligned beats removes most noise and ectopic beats without a per-beat
delineator (docs/protocol.md §4.4). Everything here is vectorised over leads and beats: one record costs a
few milliseconds, so a 1,500-record manifest measures in seconds.

  rate      the signal is resampled to `FS` (500 Hz) so every window and threshold is in one unit
  filter    zero-phase 45 Hz low-pass (2nd-order Butterworth, forward-backward) against noise and mains hum
  QRS       the 12-lead slope energy (sum of squared first differences, smoothed over 80 ms) peaks once
            per QRS; peaks above 30 % of its 99th percentile, at least 250 ms apart, are the beats
  baseline  per beat, the flattest 20 ms (least 12-lead slope) 40-140 ms before the energy peak is the PR
            segment; its level per lead, joined by a cubic spline from beat to beat, is subtracted. Unlike a
            high-pass filter this leaves no undershoot after large waves, which would read as P or T wave
  template  per lead, the sample-wise median of the beats' windows [-PRE_MS, +POST_MS] around each peak
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy import signal as sps
from scipy.interpolate import CubicSpline
from scipy.ndimage import uniform_filter1d

from raybench.cohorts.extractor_rules import ConceptError

FS = 500.0  # working rate (Hz)
PRE_MS, POST_MS = 450.0, 700.0  # template window around each QRS energy peak
MIN_RR_MS = 250.0  # refractory distance between detected beats (240 bpm)
ENERGY_SMOOTH_MS = 80.0
PEAK_FRACTION = 0.3  # of the energy's 99th percentile
LOWPASS_HZ = 45.0
KNOT_MS = (-140.0, -40.0)  # where each beat's PR-segment knot is searched, relative to its energy peak


@dataclass(frozen=True)
class Beats:
    """A record's beats at `FS`. `template` [12, W] mV (median beat), `fid` its fiducial sample, `beats`
    [12, n, W] the windows it was built from, `rr_ms` every RR interval of the record, `peaks` the samples."""

    template: np.ndarray
    fid: int
    beats: np.ndarray
    rr_ms: np.ndarray
    peaks: np.ndarray

    @property
    def n_beats(self) -> int:
        return int(self.beats.shape[1])


def ms(n_ms: float) -> int:
    """Milliseconds -> samples at FS."""
    return int(round(n_ms * FS / 1000.0))


@lru_cache(maxsize=4)
def _lowpass(fs: float) -> np.ndarray:
    return sps.butter(2, LOWPASS_HZ, btype="lowpass", fs=fs, output="sos")


def to_working_rate(sig: np.ndarray, fs: float) -> np.ndarray:
    """[12, T] at any rate -> [12, T'] at FS (polyphase resampling; unchanged at FS)."""
    if abs(fs - FS) < 1e-9:
        return sig
    ratio = Fraction(FS / fs).limit_denominator(1000)
    return sps.resample_poly(sig, ratio.numerator, ratio.denominator, axis=1)


def filtered(sig: np.ndarray, fs: float) -> np.ndarray:
    """Resample to FS and low-pass (module doc); float64 [12, T']."""
    x = to_working_rate(np.asarray(sig, dtype=np.float64), fs)
    if x.shape[1] < ms(1500.0):
        raise ConceptError("too_short", f"{x.shape[1] / FS:.2f} s of signal; waveform49 needs at least 1.5 s")
    x = x - np.median(x, axis=1, keepdims=True)
    return sps.sosfiltfilt(_lowpass(FS), x, axis=1)


def qrs_peaks(x: np.ndarray) -> np.ndarray:
    """Sample indices of the QRS complexes of a filtered [12, T] signal (module doc)."""
    d = np.diff(x, axis=1)
    energy = np.einsum("ij,ij->j", d, d)
    k = ms(ENERGY_SMOOTH_MS)
    smooth = np.convolve(energy, np.ones(k) / k, mode="same")
    ref = float(np.quantile(smooth, 0.99))
    if not ref > 0:
        return np.zeros(0, dtype=np.int64)
    peaks, _ = sps.find_peaks(smooth, height=PEAK_FRACTION * ref, distance=ms(MIN_RR_MS))
    return peaks.astype(np.int64)


def remove_baseline(x: np.ndarray, peaks: np.ndarray) -> np.ndarray:
    """x minus the spline through each beat's PR-segment level (module doc), per lead."""
    slope = uniform_filter1d(np.abs(np.diff(x, axis=1)).sum(0), ms(20.0))
    lo, hi = ms(KNOT_MS[0]), ms(KNOT_MS[1])
    ok = peaks[(peaks + lo - ms(10.0) >= 0)]
    if ok.size == 0:
        return x - np.median(x, axis=1, keepdims=True)
    cand = ok[:, None] + np.arange(lo, hi)[None, :]
    knots = cand[np.arange(cand.shape[0]), slope[cand].argmin(1)]
    win = knots[:, None] + np.arange(-ms(10.0), ms(10.0))[None, :]
    levels = x[:, win].mean(2)  # [12, knots]
    if knots.size == 1:
        return x - levels
    t = np.clip(np.arange(x.shape[1]), knots[0], knots[-1])  # constant beyond the first and last knot
    return x - CubicSpline(knots, levels, axis=1)(t)


def record_beats(sig: np.ndarray, fs: float) -> Beats:
    """Filter, detect and average one record ([12, T] mV); ConceptError when it has fewer than 2 beats."""
    x = filtered(sig, fs)
    peaks = qrs_peaks(x)
    if peaks.size < 2:
        raise ConceptError("too_few_beats", f"{peaks.size} QRS complexes found; at least 2 are needed")
    rr = np.diff(peaks) * (1000.0 / FS)
    x = remove_baseline(x, peaks)
    pre, post = ms(PRE_MS), ms(POST_MS)
    inside = peaks[(peaks - pre >= 0) & (peaks + post < x.shape[1])]
    if inside.size == 0:  # short record: pad so the beats nearest the middle still give a window
        x = np.pad(x, ((0, 0), (pre, post)), mode="edge")
        peaks, inside = peaks + pre, peaks + pre
    idx = inside[:, None] + np.arange(-pre, post)[None, :]
    beats = x[:, idx]  # [12, n, W]
    template = np.median(beats, axis=1)
    return Beats(template=template, fid=pre, beats=beats, rr_ms=rr, peaks=peaks)
