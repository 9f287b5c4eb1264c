"""Beats of one record: filter, find the QRS complexes from all 12 leads, build one median beat per lead.

Why this shape: every waveform49 measurement is read from a representative beat, not from single beats,
because the median of ~10 aligned beats removes most noise and ectopic beats without a per-beat
delineator (docs/protocol.md §4.4). Everything here is vectorised over leads and beats: one record costs a
few milliseconds, so a 1,500-record manifest measures in seconds.

  rate      the signal is resampled to `FS` (500 Hz) so every window and threshold is in one unit
  filter    zero-phase 0.5-45 Hz band-pass (2nd-order Butterworth, forward-backward): removes baseline
            wander and mains hum, keeps the ST level (0.5 Hz filtered both ways shifts it by < 10 uV)
  QRS       the 12-lead slope energy (sum of squared first differences, smoothed over 80 ms) peaks once
            per QRS; peaks above 30 % of its 99th percentile, at least 250 ms apart, are the beats
  template  per lead, the sample-wise median of the beats' windows [-PRE_MS, +POST_MS] around each peak
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy import signal as sps

from raybench.cohorts.extractor_rules import ConceptError

FS = 500.0  # working rate (Hz)
PRE_MS, POST_MS = 450.0, 700.0  # template window around each QRS energy peak
MIN_RR_MS = 250.0  # refractory distance between detected beats (240 bpm)
ENERGY_SMOOTH_MS = 80.0
PEAK_FRACTION = 0.3  # of the energy's 99th percentile
BAND_HZ = (0.5, 45.0)


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
def _band(fs: float) -> np.ndarray:
    return sps.butter(2, BAND_HZ, btype="bandpass", fs=fs, output="sos")


def to_working_rate(sig: np.ndarray, fs: float) -> np.ndarray:
    """[12, T] at any rate -> [12, T'] at FS (polyphase resampling; unchanged at FS)."""
    if abs(fs - FS) < 1e-9:
        return sig
    ratio = Fraction(FS / fs).limit_denominator(1000)
    return sps.resample_poly(sig, ratio.numerator, ratio.denominator, axis=1)


def filtered(sig: np.ndarray, fs: float) -> np.ndarray:
    """Resample to FS and band-pass (module doc); float64 [12, T']."""
    x = to_working_rate(np.asarray(sig, dtype=np.float64), fs)
    if x.shape[1] < ms(1500.0):
        raise ConceptError("too_short", f"{x.shape[1] / FS:.2f} s of signal; waveform49 needs at least 1.5 s")
    return sps.sosfiltfilt(_band(FS), x, axis=1)


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


def record_beats(sig: np.ndarray, fs: float) -> Beats:
    """Filter, detect and average one record ([12, T] mV); ConceptError when it has fewer than 2 beats."""
    x = filtered(sig, fs)
    peaks = qrs_peaks(x)
    if peaks.size < 2:
        raise ConceptError("too_few_beats", f"{peaks.size} QRS complexes found; at least 2 are needed")
    rr = np.diff(peaks) * (1000.0 / FS)
    pre, post = ms(PRE_MS), ms(POST_MS)
    inside = peaks[(peaks - pre >= 0) & (peaks + post < x.shape[1])]
    if inside.size == 0:  # short record: pad so the beats nearest the middle still give a window
        x = np.pad(x, ((0, 0), (pre, post)), mode="edge")
        peaks, inside = peaks + pre, peaks + pre
    idx = inside[:, None] + np.arange(-pre, post)[None, :]
    beats = x[:, idx]  # [12, n, W]
    template = np.median(beats, axis=1)
    return Beats(template=template, fid=pre, beats=beats, rr_ms=rr, peaks=peaks)
