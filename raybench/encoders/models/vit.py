"""Pieces shared by the ViT-style adapters (CSFM, ECG-JEPA, ST-MEM).

The parameter *names* differ per upstream checkpoint, so each adapter defines its own modules; what is
shared is the arithmetic (multi-head attention over a fused qkv projection, token-mean pooling), the
FFT resampling the three upstream pipelines and the published protocol use, and the checkpoint plumbing
(key report, strict load).

Numerics follow the code being reproduced: the upstream native pipelines read WFDB records as float64
(`wfdb.rdsamp`) and resample in float64; ST-MEM stores its 10-s windows as float32 before resampling; the
published protocol read `.mat` files into float32 and resampled in float32. `fft_resample_to` takes the
dtype so each adapter can compute in the precision its reference did (scipy's FFT keeps float32 inputs in
single precision).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from scipy import signal as sps
from torch import nn

from raybench.encoders.base import CheckpointError, key_report
from raybench.encoders.preprocess import note, note_pad, note_resample, zscore_leads

# The protocol's shared 12-lead loader resamples every record to this many samples before z-scoring it
# (benchmark_v1/adapters/ecg_fm.py:21, 64-68: ECG_FM_TARGET_SAMPLES); CSFM and ST-MEM start from its output.
PUBLISHED_12LEAD_SAMPLES = 5000


def fft_resample_to(x: np.ndarray, n: int, dtype: type = np.float64, always: bool = False) -> np.ndarray:
    """`scipy.signal.resample(x, n, axis=-1)` computed in `dtype`; skipped when the length is already n
    (the references test `shape != n` first) unless `always` (ST-MEM's published loader resamples
    unconditionally)."""
    x = np.asarray(x, dtype=dtype)
    if x.shape[-1] == n and not always:
        return x
    return sps.resample(x, n, axis=-1)


def resample_rate(x: np.ndarray, fs_in: float, fs_out: float, n: int, dtype: type = np.float64) -> np.ndarray:
    """FFT resampling from fs_in to fs_out with an explicit output length n (each upstream computes n with its
    own expression, e.g. `int(T * fs_out / fs_in)`: truncation, not rounding). No-op when the rates agree."""
    x = np.asarray(x, dtype=dtype)
    if fs_in == fs_out:
        return x
    note_resample(fs_in, fs_out)
    return sps.resample(x, n, axis=-1)


def pad_end(x: np.ndarray, n: int) -> np.ndarray:
    """Zero-pad at the end to n samples (a record shorter than the model's window; recorded as a note)."""
    t = x.shape[-1]
    if t >= n:
        return x
    note_pad(t, n)
    return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - t)])


def crop_center(x: np.ndarray, n: int) -> np.ndarray:
    """The n samples starting at (T - n) // 2 (ST-MEM's `CenterCrop` rule); x must hold at least n."""
    start = (x.shape[-1] - n) // 2
    return x[..., start:start + n]


def note_published_window(t: int, fs: float, seconds: float = 10.0) -> None:
    """The published loaders resample a record to a fixed sample count whatever its duration: a record that is
    not 10 s long is stretched or squeezed in time (recorded as a note, never silently)."""
    if abs(t / fs - seconds) > 1e-9:
        note(f"published loader: a {t / fs:.2f}-s record resampled to the {seconds:g}-s window "
             f"(time stretched by {seconds * fs / t:.3f}, as the protocol's code did)")


def published_12lead(signal: np.ndarray) -> np.ndarray:
    """The protocol's shared 12-lead loader after reading a record (benchmark_v1/adapters/ecg_fm.py:60-69):
    float32, FFT-resampled to 5,000 samples when it has another length (whatever its rate or duration),
    per-lead z-score with the std floored at 1e-6."""
    return zscore_leads(fft_resample_to(signal, PUBLISHED_12LEAD_SAMPLES, np.float32))


def fused_attention(qkv: torch.Tensor, heads: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention from a fused projection laid out [q | k | v], each (heads x head_dim).

    qkv: [B, N, 3 * inner]; mask: bool [N, N], True = may attend. Returns [B, N, inner].
    Scale is head_dim ** -0.5, as in all three upstream models.
    """
    b, n, three_inner = qkv.shape
    inner = three_inner // 3
    q, k, v = qkv.view(b, n, 3, heads, inner // heads).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return out.transpose(1, 2).reshape(b, n, inner)


def check_input(x: torch.Tensor, leads: int, samples: int, model: str) -> None:
    if x.ndim != 3 or x.shape[1] != leads or x.shape[2] != samples:
        raise ValueError(f"{model} expects native inputs [B, {leads}, {samples}] (use its preprocess), "
                         f"got {list(x.shape)}")


def stack_means(states: list[torch.Tensor], keep: torch.Tensor | slice | None = None) -> torch.Tensor:
    """Per-layer token states [B, N, d] -> [L, B, d] means over tokens (`keep` selects token indices)."""
    return torch.stack([(h if keep is None else h[:, keep]).mean(dim=1) for h in states])


# ---------------------------------------------------------------- checkpoints


def require_tensors(state: Mapping[str, object], source: str) -> dict[str, torch.Tensor]:
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{source}: entries are not tensors: {bad[:8]}")
    return dict(state)  # type: ignore[arg-type]


def listing(keys: list[str], n: int = 40) -> str:
    more = f", ... ({len(keys)} in all)" if len(keys) > n else ""
    return "[" + ", ".join(keys[:n]) + more + "]"


def raise_on_mismatch(report: dict, source: str, model_name: str, hint: str) -> None:
    """A CheckpointError listing every missing / unexpected key (up to 40 each) and shape mismatch."""
    if report["missing"] or report["extra"]:
        raise CheckpointError(
            f"{source}: checkpoint keys do not match {model_name}: missing {listing(report['missing'])}, "
            f"unexpected {listing(report['extra'])}. {hint}")
    if report["shape_mismatch"]:
        raise CheckpointError(f"{source}: tensor shapes do not match the model: {listing(report['shape_mismatch'])}")


def load_reported(model: nn.Module, state: Mapping[str, torch.Tensor], source: str, hint: str) -> None:
    """Strict load after a key report: any missing or unexpected key or shape mismatch is a CheckpointError
    naming the keys; random weights are never kept."""
    raise_on_mismatch(key_report(model.state_dict(), state), source, type(model).__name__, hint)
    model.load_state_dict(dict(state), strict=True)


def build_sized(cls: Callable, full: object, demo: object, spec, load: Callable[[nn.Module, str], None]) -> nn.Module:
    """The shared factory body: the published (full) or demo config, then the checkpoint if one is given."""
    model = cls(full if spec.size == "full" else demo)
    if spec.checkpoint:
        load(model, spec.checkpoint)
    model.profile = spec.profile
    return model


def require_dict_entry(obj: object, key: str, source: str, fmt: str) -> Mapping[str, torch.Tensor]:
    """`obj[key]` when obj is a dict holding a state dict there; else a CheckpointError naming the format."""
    if not isinstance(obj, Mapping) or key not in obj or not isinstance(obj[key], Mapping):
        found = sorted(obj)[:8] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(f"{source}: expected {fmt} (a dict with a {key!r} state dict), found {found}")
    return obj[key]
