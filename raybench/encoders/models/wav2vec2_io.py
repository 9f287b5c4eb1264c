"""Input and output helpers of the wav2vec-family adapters (ECG-FM, CARDIAC-FM, HuBERT-ECG) beyond
`raybench.encoders.preprocess`: the batch shape check, the upstream resamplers and lead standardization, token
pooling, and HuBERT-ECG's min-max scaling."""

from __future__ import annotations

import numpy as np
import torch
from scipy import signal as sps


def check_batch(x: torch.Tensor, shape: tuple[int, ...], model: str, profile: str) -> None:
    """x must be [B, *shape]; the message names the model, the profile and the fix."""
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise ValueError(f"{model} ({profile} profile) expects native inputs [B, {', '.join(map(str, shape))}] "
                         f"from its preprocess(), got {list(x.shape)}")


def fft_resample_to(x: np.ndarray, n: int) -> np.ndarray:
    """Resample the whole record to exactly n samples (`scipy.signal.resample`, FFT), whatever its duration.

    This is what the published protocol's adapters did (its 10-s records: n / 10 Hz); kept separate from
    the polyphase `preprocess.resample` so the `published` profile reproduces that code.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] == n:
        return x
    return sps.resample(x, n, axis=-1).astype(np.float32)


def linear_resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """fairseq-signals' ECG resampling (scripts/preprocess/ecg/preprocess.py `resample`): int(T * (fs_out / fs_in))
    samples - truncated, not rounded - by linear interpolation, the first and last samples kept in place (the
    original grid is stretched over the new one). float64 in and out, as upstream computes it."""
    x = np.asarray(x, dtype=np.float64)
    if fs_in == fs_out:
        return x
    t = x.shape[-1]
    n = int(t * (fs_out / fs_in))  # upstream's expression, operand order included
    src = np.linspace(0, n - 1, t)
    dst = np.arange(n)
    flat = x.reshape(-1, t)
    return np.stack([np.interp(dst, src, row) for row in flat]).reshape(*x.shape[:-1], n)


def standardize_leads(x: np.ndarray) -> np.ndarray:
    """fairseq-signals' per-lead standardization (preprocess.py `preprocess_mat` + `lead_std_divide` with its
    default constant_lead_strategy='zero'): subtract each lead's mean, divide by its std; a lead whose std
    is exactly 0 becomes 0. float64, no epsilon (a near-constant lead is divided by its tiny std, as upstream)."""
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, keepdims=True)
    zero = std == 0
    out = x / np.where(zero, 1.0, std)
    return np.where(zero, 0.0, out) if zero.any() else out


def nonzero_mean(h: torch.Tensor) -> torch.Tensor:
    """[B, T, D] -> [B, D]: fairseq-signals' pooling of encoder tokens, `x.sum(dim=1) / (x != 0).sum(dim=1)` -
    each feature summed over tokens and divided by the number of tokens where it is non-zero (padded tokens
    are zeroed upstream, so this is the mean over real tokens). ECG-FM's scripts/embs.py and CARDIAC-FM's
    MMCL.forward_ecg both pool this way. On unpadded inputs no post-LayerNorm output is exactly 0, so this
    equals the plain mean up to rounding. A feature that is 0 in every token gives 0 here (upstream: 0/0 = NaN)."""
    return torch.div(h.sum(dim=1), (h != 0).sum(dim=1).clamp(min=1))


def pool_tokens(h: torch.Tensor, profile: str) -> torch.Tensor:
    """native: upstream's `nonzero_mean`; published: the protocol's plain token mean (its
    scripts/build_probe_features.py: `values.mean(axis=1, dtype=np.float32)`)."""
    return h.mean(dim=1) if profile == "published" else nonzero_mean(h)


def scale_minus1_1(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Per-lead min-max scaling to [-1, 1] (HuBERT-ECG's upstream `scaling`)."""
    lo = x.min(axis=-1, keepdims=True)
    hi = x.max(axis=-1, keepdims=True)
    return (2.0 * (x - lo) / (hi - lo + eps) - 1.0).astype(np.float32)
