"""A test encoder that exposes ECG concepts far more directly than the demo encoders.

It sees only the waveform: `preprocess` measures a median beat (band-pass, R peaks on the summed slope
envelope, beats aligned on those peaks) and returns 64 measurements - per lead the R maximum, QRS
minimum, ST level, T extreme and P extreme (12 x 5), plus the mean RR, QRS width, QT-like and PR-like
intervals. `layer_states` mixes them into d=64 with a fixed random matrix per layer plus a small
deterministic nonlinear perturbation, so no state coordinate is a concept by itself: the SAE still
has to find the directions, it just has an easier job than on a random transformer.

Ray workers cannot import test modules, so this module ships its code by value (cloudpickle); pass
`build_oracle` as `builder` to `extract_activations`.
"""

from __future__ import annotations

import sys

import numpy as np
import ray.cloudpickle
import torch
from scipy import signal as sps

from raybench.encoders.base import ECGEncoder, EncoderSpec, freeze, register_encoder
from raybench.encoders.preprocess import bandpass

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

NAME = "oracle"
N_FEATURES = 64
PRE_MS, POST_MS = 350.0, 650.0  # median-beat window around the envelope peak
# fixed nominal scales that bring the measurements to O(1) before mixing (no data-dependent fit)
RR_MS, QRS_MS, QT_MS, PR_MS = 1000.0, 100.0, 400.0, 150.0


def _ms(ms: float, fs: float) -> int:
    return int(round(ms * fs / 1000.0))


def _envelope(x: np.ndarray, fs: float) -> np.ndarray:
    """Summed absolute slope over leads, smoothed over 20 ms: peaks once per QRS."""
    env = np.abs(np.diff(x, axis=-1, prepend=x[..., :1])).sum(0)
    width = max(1, _ms(20.0, fs))
    return np.convolve(env, np.ones(width) / width, mode="same")


def beat_features(signal: np.ndarray, fs: float) -> np.ndarray:
    """[12, T] mV at fs -> [64] float32 measurements of the median beat (see the module doc)."""
    x = bandpass(np.asarray(signal, dtype=np.float64), fs, 0.5, 40.0).astype(np.float64)
    env = _envelope(x, fs)
    peaks, _ = sps.find_peaks(env, distance=max(1, _ms(300.0, fs)), height=0.4 * np.percentile(env, 99.5))
    pre, post = _ms(PRE_MS, fs), _ms(POST_MS, fs)
    rr_ms = np.diff(peaks) * 1000.0 / fs
    rr_mean = float(rr_ms.mean()) if rr_ms.size else RR_MS
    full = peaks[(peaks >= pre) & (peaks + post <= x.shape[-1])]
    if full.size == 0:  # no usable beat: a flat, finite description (never NaN)
        return np.zeros(N_FEATURES, dtype=np.float32)
    tpl = np.median(np.stack([x[:, p - pre:p + post] for p in full]), axis=0)  # [12, W], peak at index pre
    base = np.median(tpl, axis=-1, keepdims=True)
    tpl = tpl - base
    tenv = np.abs(np.diff(tpl, axis=-1, prepend=tpl[:, :1])).sum(0)

    def idx(ms: float) -> int:
        return int(np.clip(pre + _ms(ms, fs), 0, tpl.shape[-1] - 1))

    # QRS: where the template slope envelope stays above 20% of its peak around the aligned peak
    lo, hi = idx(-120.0), idx(120.0)
    active = np.flatnonzero(tenv[lo:hi] >= 0.2 * tenv[lo:hi].max()) + lo
    on, off = (int(active[0]), int(active[-1])) if active.size else (idx(-40.0), idx(40.0))
    qrs = tpl[:, on:off + 1]
    r_max, qrs_min = qrs.max(-1), qrs.min(-1)
    st = tpl[:, min(off + _ms(60.0, fs), tpl.shape[-1] - 1)]

    # T: signed extreme (relative to the ST level) after the ST segment; its end = last strong deviation
    t0, t1 = min(off + _ms(80.0, fs), tpl.shape[-1] - 2), tpl.shape[-1]
    t_dev = tpl[:, t0:t1] - st[:, None]
    t_ext = np.take_along_axis(t_dev, np.abs(t_dev).argmax(-1)[:, None], -1)[:, 0]
    t_act = np.abs(t_dev).sum(0)
    t_end = t0 + int(np.flatnonzero(t_act >= 0.25 * t_act.max())[-1]) if t_act.max() > 0 else t1 - 1

    # P: signed extreme before the QRS; its onset = first strong deviation
    p0, p1 = 0, max(1, on - _ms(20.0, fs))
    p_seg = tpl[:, p0:p1]
    p_ext = np.take_along_axis(p_seg, np.abs(p_seg).argmax(-1)[:, None], -1)[:, 0]
    p_act = np.abs(p_seg).sum(0)
    p_on = int(np.flatnonzero(p_act >= 0.25 * p_act.max())[0]) if p_act.max() > 0 else p0

    to_ms = 1000.0 / fs
    timing = np.array([rr_mean / RR_MS, (off - on) * to_ms / QRS_MS, (t_end - on) * to_ms / QT_MS,
                       (on - p_on) * to_ms / PR_MS])
    out = np.concatenate([r_max, qrs_min, st, t_ext, p_ext, timing]).astype(np.float32)
    return np.nan_to_num(out, nan=0.0, posinf=0.0, neginf=0.0)


class OracleEncoder(ECGEncoder):
    """Two audited states: a random linear mix of the beat measurements, plus a small fixed perturbation."""

    name = NAME
    n_layers = 2
    d = 64

    def __init__(self, seed: int = 0, noise: float = 0.05):
        super().__init__()
        rng = np.random.default_rng(seed)
        mix = rng.standard_normal((self.n_layers, self.d, N_FEATURES)) / np.sqrt(N_FEATURES)
        pert = rng.standard_normal((self.n_layers, self.d, N_FEATURES)) / np.sqrt(N_FEATURES)
        # buffers: part of the fingerprint, built with numpy so a meta-device build still works
        self.register_buffer("mix", torch.from_numpy(mix.astype(np.float32)))
        self.register_buffer("pert", torch.from_numpy(pert.astype(np.float32)))
        self.noise = noise

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        return beat_features(signal, fs)

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        lin = torch.einsum("ldf,bf->lbd", self.mix, x)
        return lin + self.noise * torch.tanh(torch.einsum("ldf,bf->lbd", self.pert, x))


@register_encoder(NAME)
def build_oracle(spec: EncoderSpec) -> ECGEncoder:
    model = OracleEncoder(seed=spec.init_seed)
    model.profile = spec.profile
    return freeze(model)
