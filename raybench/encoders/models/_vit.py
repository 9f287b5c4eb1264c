"""Pieces shared by the ViT-style adapters (CSFM, ECG-JEPA, ST-MEM).

The parameter *names* differ per upstream checkpoint, so each adapter defines its own modules; what is
shared is the arithmetic (multi-head attention over a fused qkv projection, token-mean pooling), the
FFT resampling the three upstream pipelines use, and the checkpoint plumbing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy import signal as sps
from torch import nn

from raybench.encoders.base import CheckpointError, load_state_dict_strict, load_torch_checkpoint


def fft_resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """FFT resampling along time (`scipy.signal.resample`), as CSFM, ECG-JEPA and ST-MEM do upstream.

    Output length is round(T * fs_out / fs_in). Kept beside the polyphase `preprocess.resample` because
    the upstream pipelines (and the published protocol) use the FFT method and the two differ slightly.
    """
    x = np.asarray(x, dtype=np.float32)
    if fs_in == fs_out:
        return x
    n = int(round(x.shape[-1] * fs_out / fs_in))
    return sps.resample(x, n, axis=-1).astype(np.float32)


def crop_center_or_pad_end(x: np.ndarray, n: int) -> np.ndarray:
    """Centre-crop longer records (deterministic stand-in for upstream random crops); zero-pad the end."""
    if x.shape[-1] > n:
        start = (x.shape[-1] - n) // 2
        return x[..., start:start + n]
    if x.shape[-1] < n:
        return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, n - x.shape[-1])])
    return x


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


def load_extracted(model: nn.Module, path: str | Path, extract: Callable[[object, str], Mapping[str, torch.Tensor]]
                   ) -> None:
    """Load `path` safely, pull the encoder state out with `extract(obj, source)`, load it strictly."""
    source = str(path)
    obj = load_torch_checkpoint(path)
    state = extract(obj, source)
    bad = [k for k, v in state.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{source}: entries are not tensors: {bad[:8]}")
    load_state_dict_strict(model, state, source)


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
