"""A tiny convolutional ECG encoder behind raybench's ECGEncoder interface: the smallest complete adapter.

Replace the network with your own model; keep the three parts raybench relies on: `preprocess` (one record,
12 x T millivolts in raybench's lead order, to the model's native input), `layer_states` (a batch of native
inputs to [n_layers, B, d] token-mean-pooled states) and a factory `build(spec)` registered in the
`raybench.encoders` entry-point group (pyproject.toml).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from raybench.encoders.base import ECGEncoder, EncoderSpec, load_state_dict_strict, load_torch_checkpoint
from raybench.encoders.preprocess import center_crop_or_pad, resample, zscore_leads

FS = 100  # Hz: the model's native sampling rate
SAMPLES = 1000  # 10 s at FS


class MyEncoder(ECGEncoder):
    """Strided 1-D convolutions over the 12 leads, then `n_layers` residual blocks; each block's tokens are
    mean-pooled into one audited state per layer."""

    name = "my_encoder"
    n_layers = 3
    d = 32

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv1d(12, self.d, kernel_size=10, stride=10)  # 1000 samples -> 100 tokens
        self.blocks = nn.ModuleList(nn.Sequential(nn.Conv1d(self.d, self.d, 5, padding=2), nn.GELU())
                                    for _ in range(self.n_layers))

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


def build(spec: EncoderSpec) -> MyEncoder:
    """The registered factory: raybench seeds torch (spec.init_seed) before calling it and freezes the result."""
    model = MyEncoder()
    if spec.checkpoint:
        load_state_dict_strict(model, load_torch_checkpoint(spec.checkpoint), spec.checkpoint)
    return model
