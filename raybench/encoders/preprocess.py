"""Signal operations the adapters compose into each model's native preprocessing (numpy, per record).

Two things here are about the encoder boundary rather than one model:
  * `SignalError(reason, detail)`: a record this model cannot take (too short for its filter, a rate its
    filter cannot run at). `raybench.encoders.loading.native_input` turns it into a quarantine with that reason.
  * record notes: what preprocessing changed beyond the model's fixed pipeline (a rate resampled, a record
    shorter than the window zero-padded). Helpers call `note(text)`; `collect_notes()` gathers them per
    record, and extraction writes them into the store's index.json. Outside `collect_notes` `note` is a no-op.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator
from fractions import Fraction

import numpy as np
from scipy import signal as sps

from raybench.core.errors import RaybenchError

_NOTES: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("raybench_record_notes", default=None)


class SignalError(RaybenchError, ValueError):
    """A record the model's preprocessing cannot take; `reason` is a short machine-readable tag."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def note(text: str) -> None:
    """Record what preprocessing changed in the current record (kept once; no-op outside `collect_notes`)."""
    notes = _NOTES.get()
    if notes is not None and text not in notes:
        notes.append(text)


@contextlib.contextmanager
def collect_notes() -> Iterator[list[str]]:
    """Collect the `note`s of the preprocessing run inside the block into the yielded list."""
    notes: list[str] = []
    token = _NOTES.set(notes)
    try:
        yield notes
    finally:
        _NOTES.reset(token)


def note_resample(fs_in: float, fs_out: float) -> None:
    if fs_in != fs_out:
        note(f"resampled {fs_in:g} Hz -> {fs_out:g} Hz")


def note_pad(t: int, n: int) -> None:
    if t < n:
        note(f"zero-padded {t} -> {n} samples (record shorter than the model's window)")


def resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """Polyphase resampling along time ([C, T] -> [C, T * fs_out / fs_in])."""
    if fs_in == fs_out:
        return x.astype(np.float32, copy=False)
    note_resample(fs_in, fs_out)
    ratio = Fraction(fs_out / fs_in).limit_denominator(1000)
    return sps.resample_poly(x, ratio.numerator, ratio.denominator, axis=-1).astype(np.float32)


def butter_sos(order: int, wn: float | tuple[float, float], btype: str, fs: float) -> np.ndarray:
    """`scipy.signal.butter(order, wn, btype, fs=fs, output="sos")`, designed once per process: a design costs
    about as much as filtering one 12-lead record, and every record asks for the same one. A fresh copy each
    call (scipy's filters want a writable array)."""
    return _butter_sos(order, wn, btype, fs).copy()


@functools.lru_cache(maxsize=64)
def _butter_sos(order: int, wn: float | tuple[float, float], btype: str, fs: float) -> np.ndarray:
    return sps.butter(order, list(wn) if isinstance(wn, tuple) else wn, btype=btype, fs=fs, output="sos")


@functools.lru_cache(maxsize=16)
def _decimation_sos(q: int) -> np.ndarray:
    return sps.cheby1(8, 0.05, 0.8 / q, output="sos")  # scipy.signal.decimate's default IIR filter


def decimate(x: np.ndarray, q: int) -> np.ndarray:
    """`scipy.signal.decimate(x, q)` (order-8 Chebyshev I, zero phase, last axis) for float64 `x`, with its filter
    designed once per process; the same numbers (tests compare with scipy)."""
    x = np.asarray(x, dtype=np.float64)
    return sps.sosfiltfilt(_decimation_sos(int(q)).copy(), x, axis=-1)[..., ::q]


def bandpass(x: np.ndarray, fs: float, low: float, high: float, order: int = 4) -> np.ndarray:
    """Zero-phase Butterworth band-pass (second-order sections for stability)."""
    sos = butter_sos(order, (low, min(high, 0.45 * fs)), "bandpass", fs)
    return sps.sosfiltfilt(sos, x, axis=-1).astype(np.float32)


def fir_bandpass(x: np.ndarray, fs: float, low: float, high: float, order_per_hz: float = 0.3) -> np.ndarray:
    """Zero-phase FIR band-pass as biosppy's `filter_signal(ftype='FIR', band='bandpass', order=...)` builds it.

    `int(order_per_hz * fs)` taps, made odd; `scipy.signal.firwin(taps, [low, high] / (fs / 2),
    pass_zero=False)` (Hamming window, scaled); `scipy.signal.filtfilt(b, [1], x)` (odd padding of 3 x taps).
    float64 in and out. No clipping of the band: the upper edge must lie below Nyquist, as firwin requires
    (SignalError `rate_unsupported` otherwise), and the record must be longer than filtfilt's padding
    (SignalError `too_short`).
    """
    taps = int(order_per_hz * fs)
    if taps % 2 == 0:
        taps += 1
    if not 0 < low < high < fs / 2:
        raise SignalError("rate_unsupported", f"a {low:g}-{high:g} Hz band-pass cannot run at {fs:g} Hz (its upper "
                          f"edge must lie below Nyquist, {fs / 2:g} Hz); the model needs a rate above {2 * high:g} Hz")
    t = np.shape(x)[-1]
    if t <= 3 * taps:
        raise SignalError("too_short", f"{t} samples at {fs:g} Hz is too short for the model's {taps}-tap band-pass "
                          f"(needs more than {3 * taps} samples, {3 * taps / fs:.2f} s)")
    b = sps.firwin(numtaps=taps, cutoff=2.0 * np.asarray([low, high], dtype=float) / float(fs), pass_zero=False)
    return sps.filtfilt(b, np.array([1.0]), np.asarray(x, dtype=np.float64), axis=-1)


def zscore_leads(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Per-lead z-score (each lead's own mean/std)."""
    mean = x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, keepdims=True)
    return ((x - mean) / np.maximum(std, eps)).astype(np.float32)


def zscore_joint(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """One z-score over all leads and samples together (keeps relative lead amplitudes)."""
    return ((x - x.mean()) / max(float(x.std()), eps)).astype(np.float32)


def center_crop_or_pad(x: np.ndarray, n: int) -> np.ndarray:
    """Centre-crop to n samples, or zero-pad symmetrically when shorter."""
    t = x.shape[-1]
    if t == n:
        return x
    if t > n:
        start = (t - n) // 2
        return x[..., start:start + n]
    note_pad(t, n)
    left = (n - t) // 2
    pad = [(0, 0)] * (x.ndim - 1) + [(left, n - t - left)]
    return np.pad(x, pad)


def crop_or_pad_start(x: np.ndarray, n: int) -> np.ndarray:
    """Keep the first n samples, or zero-pad at the end."""
    t = x.shape[-1]
    if t >= n:
        return x[..., :n]
    note_pad(t, n)
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - t)])
