"""my_conv: the example built-in adapter of docs/architecture.md §4.2 (copy to raybench/encoders/models/my_conv.py
and add its ModelInfo line to raybench/core/models.py REGISTRY).

A small convolutional ECG encoder that keeps the adapter contract every built-in keeps:
- two sizes from one class: `full` is the published architecture (the class attributes n_layers and d, equal to
  the registry line's `layers` and `d`), `demo` is a small seeded stand-in with the registry's `demo_layers` and
  the shared DEMO_WIDTH, so the demo grid trains small SAEs for every model;
- `preprocess`: one record (12 x T millivolts in LEADS order at fs) to the native input, float32 numpy;
- `layer_states`: a batch of native inputs to [n_layers, B, d] token-mean-pooled states, and a ValueError that
  names the native shape ("expects native inputs ...") for anything else, so a wrong preprocessing fails loudly;
- weights in the upstream format through `load_torch_checkpoint` (weights_only) + `load_state_dict_strict`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from raybench.core.models import DEMO_WIDTH, INFO
from raybench.encoders.base import (
    ECGEncoder,
    EncoderSpec,
    load_state_dict_strict,
    load_torch_checkpoint,
    register_encoder,
)
from raybench.encoders.preprocess import center_crop_or_pad, resample, zscore_leads

NAME = "my_conv"
FS = 100  # Hz: the model's native sampling rate
SAMPLES = 1000  # 10 s at FS: the registry line's native window (native_window_s)


class MyConv(ECGEncoder):
    """Strided 1-D convolutions over the 12 leads, then residual blocks; each block's tokens are mean-pooled into
    one audited state per layer."""

    name = NAME
    n_layers = INFO[NAME].layers  # full size (the published architecture)
    d = INFO[NAME].d

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.d, self.n_layers = width, layers
        self.stem = nn.Conv1d(12, width, kernel_size=10, stride=10)  # 1000 samples -> 100 tokens
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv1d(width, width, 5, padding=2), nn.GELU())
                                    for _ in range(layers))

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        x = resample(np.asarray(signal, dtype=np.float32), fs, FS)
        return zscore_leads(center_crop_or_pad(x, SAMPLES)).astype(np.float32)

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        if x.ndim != 3 or tuple(x.shape[1:]) != (12, SAMPLES):
            raise ValueError(f"{self.name} expects native inputs [B, 12, {SAMPLES}], got {tuple(x.shape)}")
        h = self.stem(x)
        states = []
        for block in self.blocks:
            h = h + block(h)
            states.append(h.mean(dim=2))  # mean over tokens: [B, d]
        return torch.stack(states)


@register_encoder(NAME)
def build(spec: EncoderSpec) -> MyConv:
    """raybench seeds torch with spec.init_seed before calling this and freezes the result (build_with)."""
    info = INFO[NAME]
    model = MyConv(info.d, info.layers) if spec.size == "full" else MyConv(DEMO_WIDTH, info.demo_layers)
    if spec.checkpoint:
        load_state_dict_strict(model, load_torch_checkpoint(spec.checkpoint), spec.checkpoint)
    return model
