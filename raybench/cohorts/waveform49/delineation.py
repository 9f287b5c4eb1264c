"""Delineation of the representative beat: P, QRS and T onsets, peaks and offsets (docs/protocol.md §4.4).

Why global boundaries from the leads together: a wave starts when it starts in any lead, and one lead
seen alone may show a wave's first milliseconds as flat (its dipole is perpendicular to the lead).
The combined curves are
  slope       v(t) = sum over the 12 leads of |dx/dt| (smoothed over 10 ms): QRS onset and J point
  magnitude   m(t) = sqrt(sum over the 12 leads of (x - ref)^2): P and T, where `ref` is the
              isoelectric level (the PR segment) or, for the T onset, the ST level
Each boundary is where the combined curve falls below a fixed fraction of its wave's peak (QRS: slope;
P, T: magnitude), searched outward from that peak inside a physiological window. Per-lead wave peaks
(`raybench.cohorts.waveform49.measures`) are read inside these global boundaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.ndimage import uniform_filter1d

from raybench.cohorts.waveform49.beats import Beats, ms

QRS_SEARCH_MS = 160.0  # QRS onset/offset searched this far around the energy peak
QRS_FRACTION = 0.06  # boundary: slope below this fraction of the QRS's steepest slope
P_FRACTION, T_FRACTION = 0.15, 0.08  # boundary: magnitude below this fraction of the wave's peak
BASELINE_MS = (-24.0, -8.0)  # isoelectric window relative to QRS onset (the PR segment's end)
ST_MS = 40.0  # ST level: J point + this (mean over +-4 ms); ST elevation: J point (mean over J..J+10 ms)
T_PEAK_MAX_MS, T_END_MAX_MS = 520.0, 650.0  # T peak / T end searched up to QRS onset + this x sqrt(RR in s)
P_HALF_MAX_MS = 120.0  # P onset / end searched at most this far from the P peak
P_MIN_UV = 25.0  # a P wave's magnitude must reach this ...
P_MIN_CONSISTENCY = 0.65  # ... and the median beat's P window must match the template's (cosine similarity)
SMOOTH_MS = 20.0  # P and T are read on the template low-passed by a moving mean of this width


@dataclass(frozen=True)
class Delineation:
    """Sample indices into the template (NaN-free ints; P fields None when no P wave was found)."""

    qrs_on: int
    qrs_off: int
    baseline: np.ndarray  # [12] mV, subtracted from every amplitude
    st_level: np.ndarray  # [12] mV at J + ST_MS (above baseline)
    st_j: np.ndarray  # [12] mV at the J point (above baseline)
    t_on: int | None
    t_peak: int | None
    t_off: int | None
    p_on: int | None
    p_peak: int | None
    p_off: int | None
    p_consistency: float  # median over beats of the P window's cosine similarity with the template's


def _smooth(x: np.ndarray, n_ms: float) -> np.ndarray:
    k = max(1, ms(n_ms))
    return np.convolve(x, np.ones(k) / k, mode="same")


def _last_below(curve: np.ndarray, level: float, start: int, stop: int) -> int | None:
    """Last index in [start, stop) whose value is below level, or None."""
    start = max(start, 0)
    below = np.flatnonzero(curve[start:stop] < level)
    return int(start + below[-1]) if below.size else None


def _first_below(curve: np.ndarray, level: float, start: int, stop: int) -> int | None:
    """First index in [start, stop) whose value is below level, or None."""
    stop = min(stop, curve.size)
    below = np.flatnonzero(curve[start:stop] < level)
    return int(start + below[0]) if below.size else None


def qrs_bounds(template: np.ndarray, fid: int) -> tuple[int, int]:
    """QRS onset and J point from the 12-lead slope curve (module doc)."""
    v = _smooth(np.abs(np.diff(template, axis=1)).sum(0), 10.0)
    lo, hi = fid - ms(QRS_SEARCH_MS), fid + ms(QRS_SEARCH_MS)
    core = slice(fid - ms(60.0), fid + ms(60.0))
    peak = int(core.start + np.argmax(v[core]))
    level = QRS_FRACTION * float(v[peak])
    on = _last_below(v, level, lo, peak)
    # the J point follows the QRS's last steep slope (>= 30 % of the steepest) within the search window
    steep = np.flatnonzero(v[peak:hi] >= 0.3 * v[peak])
    last_steep = peak + int(steep[-1]) if steep.size else peak
    off = _first_below(v, level, last_steep, hi)
    return (lo if on is None else on + 1), (hi if off is None else off)


def delineate(b: Beats) -> Delineation:
    """All boundaries of one record's representative beat."""
    tpl = b.template
    width = tpl.shape[1]
    qrs_on, qrs_off = qrs_bounds(tpl, b.fid)
    base = tpl[:, max(0, qrs_on + ms(BASELINE_MS[0])):max(1, qrs_on + ms(BASELINE_MS[1]))].mean(1)
    y = tpl - base[:, None]
    st_at = min(qrs_off + ms(ST_MS), width - ms(4.0) - 1)
    st_level = y[:, st_at - ms(4.0):st_at + ms(4.0) + 1].mean(1)
    st_j = y[:, qrs_off:min(width, qrs_off + ms(10.0) + 1)].mean(1)
    rr = float(np.median(b.rr_ms))
    t_on, t_peak, t_off = _t_wave(y, st_level, qrs_on, qrs_off, rr)
    p_on, p_peak, p_off, consistency = _p_wave(b, y, qrs_on, t_off, rr)
    return Delineation(qrs_on, qrs_off, base, st_level, st_j, t_on, t_peak, t_off, p_on, p_peak, p_off, consistency)


def _t_wave(y: np.ndarray, st: np.ndarray, qrs_on: int, qrs_off: int, rr: float
            ) -> tuple[int | None, int | None, int | None]:
    """T onset, peak and end: peak of |y - ST level| after J + 40 ms; bounds where the magnitude fades."""
    width = y.shape[1]
    root_rr = math.sqrt(max(rr, 250.0) / 1000.0)  # QT scales with sqrt(RR): the windows do too (Bazett)
    peak_end = min(width, qrs_on + ms(min(600.0, T_PEAK_MAX_MS * root_rr)))
    end = min(width, qrs_on + ms(min(700.0, T_END_MAX_MS * root_rr)))
    start = qrs_off + ms(ST_MS)
    if peak_end - start < ms(40.0):
        return None, None, None
    ys = uniform_filter1d(y, ms(SMOOTH_MS), axis=1)
    rel = np.sqrt(((ys - st[:, None]) ** 2).sum(0))
    peak = int(start + np.argmax(rel[start:peak_end]))
    mag = np.sqrt((ys ** 2).sum(0))
    if rel[peak] <= 0:
        return None, None, None
    on = _last_below(rel, T_FRACTION * float(rel[peak]), qrs_off, peak)
    return (qrs_off if on is None else on + 1), peak, _t_end(mag, peak, end)


def _t_end(mag: np.ndarray, peak: int, end: int) -> int | None:
    """T end: where the magnitude falls to T_FRACTION of the way from the level it settles at after the T
    wave (its 10th percentile up to `end`) to its T peak; the settled level absorbs a small offset."""
    if end - peak < 3:
        return None
    floor = float(np.percentile(mag[peak:end], 10))
    return _first_below(mag, floor + T_FRACTION * (float(mag[peak]) - floor), peak, end)


def _p_wave(b: Beats, y: np.ndarray, qrs_on: int, t_off: int | None, rr: float
            ) -> tuple[int | None, int | None, int | None, float]:
    """P onset, peak and end before the QRS, or Nones when no consistent P wave is there (module doc)."""
    stop = qrs_on + ms(BASELINE_MS[0])
    start = qrs_on - ms(min(350.0, 0.7 * rr))
    if t_off is not None:  # not into the previous beat's T wave
        start = max(start, qrs_on - ms(rr) + (t_off - qrs_on) + ms(40.0))
    start = max(start, 0)
    if stop - start < ms(40.0):
        return None, None, None, math.nan
    window = slice(start, stop)
    ys = _detrended(uniform_filter1d(y[:, window], ms(SMOOTH_MS), axis=1))
    mag = np.zeros(y.shape[1])
    mag[window] = np.sqrt((ys ** 2).sum(0))
    peak = int(start + np.argmax(mag[window]))
    singles = _detrended(uniform_filter1d(b.beats[:, :, window], ms(SMOOTH_MS), axis=2))
    tpl = np.median(singles, axis=1)
    # per beat: cosine similarity of its P window with the template's (all leads at once); the median beat's
    dots = np.einsum("lbw,lw->b", singles, tpl)
    norms = np.sqrt(np.einsum("lbw,lbw->b", singles, singles) * float((tpl ** 2).sum()))
    consistency = float(np.median(np.where(norms > 0, dots / np.where(norms > 0, norms, 1.0), 0.0)))
    if mag[peak] * 1000.0 < P_MIN_UV or not consistency >= P_MIN_CONSISTENCY:
        return None, None, None, consistency
    # the level before the P wave (TP segment: noise, atrial activity) is the floor the threshold starts from
    tp = mag[start:max(start + 1, peak - ms(P_HALF_MAX_MS / 2))]
    floor = float(np.median(tp)) if tp.size >= ms(10.0) else float(mag[start:peak + 1].min())
    level = floor + P_FRACTION * (float(mag[peak]) - floor)
    lo = max(start, peak - ms(P_HALF_MAX_MS))
    on = _last_below(mag, level, lo, peak)
    off = _first_below(mag, level, peak, min(stop, peak + ms(P_HALF_MAX_MS)))
    return (lo if on is None else on + 1), peak, (min(stop, peak + ms(P_HALF_MAX_MS)) if off is None else off), \
        consistency


def _detrended(x: np.ndarray) -> np.ndarray:
    """x [..., W] (a P search window) minus the line from its first 10 ms to its last 10 ms (per lead and beat).

    Why: the band-pass's 0.5 Hz high-pass leaves the TP segment after a large T wave off the PR level
    (its slow recovery), which a P boundary threshold would read as P wave.
    """
    k = ms(10.0)
    head, tail = x[..., :k].mean(-1, keepdims=True), x[..., -k:].mean(-1, keepdims=True)
    frac = np.clip((np.arange(x.shape[-1]) - k / 2) / max(x.shape[-1] - k, 1), 0.0, 1.0)
    return x - (head + (tail - head) * frac)
