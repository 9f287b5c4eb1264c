"""Signal operations the adapters compose into each model's native preprocessing (numpy, per record)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from scipy import signal as sps


def resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """Polyphase resampling along time ([C, T] -> [C, T * fs_out / fs_in])."""
    if fs_in == fs_out:
        return x.astype(np.float32, copy=False)
    ratio = Fraction(fs_out / fs_in).limit_denominator(1000)
    return sps.resample_poly(x, ratio.numerator, ratio.denominator, axis=-1).astype(np.float32)


def bandpass(x: np.ndarray, fs: float, low: float, high: float, order: int = 4) -> np.ndarray:
    """Zero-phase Butterworth band-pass (second-order sections for stability)."""
    sos = sps.butter(order, [low, min(high, 0.45 * fs)], btype="bandpass", fs=fs, output="sos")
    return sps.sosfiltfilt(sos, x, axis=-1).astype(np.float32)


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
    left = (n - t) // 2
    pad = [(0, 0)] * (x.ndim - 1) + [(left, n - t - left)]
    return np.pad(x, pad)


def crop_or_pad_start(x: np.ndarray, n: int) -> np.ndarray:
    """Keep the first n samples, or zero-pad at the end."""
    t = x.shape[-1]
    if t >= n:
        return x[..., :n]
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - t)])
