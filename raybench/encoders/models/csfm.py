"""CSFM (Cardiac Sensing Foundation Model, tiny variant): patch-25 ViT over 12 leads + a CLS token.

Our own module; parameter names follow the published `.pth` (a flat state dict whose encoder entries carry
an `encoder.` prefix; the classification head `encoder.mlp_head.*` and any non-encoder entries are not
part of the audited encoder). Tokens: CLS, then lead-major patches (lead c, patch n) each embedded as
LN -> Linear -> LN plus a channel-type embedding (channel index = lead index 0..11) and a per-patch position
embedding. Blocks are pre-norm (the norm lives inside the attention and the MLP). The text branch of the
multimodal model is kept as parameters (so the checkpoint loads strictly) but never used: ECG only.

Audited states: the output of each of the 6 blocks (before the final norm), token-mean pooled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raybench.encoders.base import CheckpointError, ECGEncoder, EncoderSpec, register_encoder
from raybench.encoders.models._vit import (
    build_sized,
    check_input,
    crop_center_or_pad_end,
    fft_resample,
    fused_attention,
    load_extracted,
    stack_means,
)
from raybench.encoders.preprocess import zscore_leads

FS = 250
SAMPLES = 2500
PREFIX = "encoder."
HEAD_PREFIX = "encoder.mlp_head."


@dataclass(frozen=True)
class CSFMConfig:
    dim: int = 768
    depth: int = 6
    heads: int = 8
    dim_head: int = 64
    mlp_dim: int = 1024
    patch_size: int = 25
    signal_len: int = SAMPLES
    channels: int = 13  # 12 ECG leads + PPG
    vocab_size: int = 30522
    text_len: int = 64

    @property
    def num_patches(self) -> int:
        return self.signal_len // self.patch_size


FULL = CSFMConfig()
# Demo: d=64 like every demo encoder; patches of 125 samples (20 per lead) keep a record at a few ms.
DEMO = CSFMConfig(dim=64, heads=2, dim_head=32, mlp_dim=128, patch_size=125, vocab_size=16, text_len=4)


class Attention(nn.Module):
    def __init__(self, cfg: CSFMConfig):
        super().__init__()
        inner = cfg.heads * cfg.dim_head
        self.heads = cfg.heads
        self.norm = nn.LayerNorm(cfg.dim)
        self.to_qkv = nn.Linear(cfg.dim, 3 * inner, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_out(fused_attention(self.to_qkv(self.norm(x)), self.heads))


class FeedForward(nn.Module):
    def __init__(self, cfg: CSFMConfig):
        super().__init__()
        # indices 0, 1, 4 carry weights in the checkpoint (2: GELU, 3: dropout)
        self.net = nn.Sequential(nn.LayerNorm(cfg.dim), nn.Linear(cfg.dim, cfg.mlp_dim), nn.GELU(), nn.Identity(),
                                 nn.Linear(cfg.mlp_dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Transformer(nn.Module):
    def __init__(self, cfg: CSFMConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.dim)  # final norm: in the checkpoint, not part of the audited states
        self.layers = nn.ModuleList(nn.ModuleList([Attention(cfg), FeedForward(cfg)]) for _ in range(cfg.depth))


class PatchEmbed(nn.Module):
    """[B, C, T] -> [B, C, N, dim]; indices 1-3 match the checkpoint (0 is the reshape)."""

    def __init__(self, cfg: CSFMConfig):
        super().__init__()
        self.patch_size = cfg.patch_size
        self.add_module("1", nn.LayerNorm(cfg.patch_size))
        self.add_module("2", nn.Linear(cfg.patch_size, cfg.dim))
        self.add_module("3", nn.LayerNorm(cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        x = x.reshape(b, c, t // self.patch_size, self.patch_size)
        for i in ("1", "2", "3"):
            x = self._modules[i](x)
        return x


class CSFMEncoder(ECGEncoder):
    name = "csfm"
    n_layers = 6
    d = 768

    def __init__(self, cfg: CSFMConfig = FULL):
        super().__init__()
        self.cfg = cfg
        self.d = cfg.dim
        self.n_layers = cfg.depth
        self.ts_to_patch_embedding = PatchEmbed(cfg)
        self.text_to_embedding = nn.Sequential(nn.Embedding(cfg.vocab_size, cfg.dim), nn.LayerNorm(cfg.dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, cfg.dim))
        self.ts_channel_type_embedding = nn.Parameter(torch.randn(1, cfg.channels, cfg.dim))
        self.text_type_embedding = nn.Parameter(torch.randn(1, 1, cfg.dim))
        self.ts_pos_embedding = nn.Parameter(torch.randn(1, cfg.num_patches, cfg.dim))
        self.text_pos_embedding = nn.Parameter(torch.randn(1, cfg.text_len, cfg.dim))
        self.transformer = Transformer(cfg)

    # ------------------------------------------------------------ preprocessing
    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        """native: 250 Hz (FFT), neurokit2 `ecg_clean` per lead, 2,500 samples, per-lead z-score.
        published: per-lead z-score at the source rate, 250 Hz (FFT), 2,500 samples; no cleaning."""
        x = np.asarray(signal, dtype=np.float32)
        if self.profile == "published":
            return crop_center_or_pad_end(fft_resample(zscore_leads(x), fs, FS), SAMPLES).astype(np.float32)
        x = _nk_clean(fft_resample(x, fs, FS), FS)
        return zscore_leads(crop_center_or_pad_end(x, SAMPLES))

    # ------------------------------------------------------------ forward
    @torch.no_grad()
    def block_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Native inputs [B, 12, 2500] -> token states [B, 1 + 12 N, dim] after each block."""
        check_input(x, 12, self.cfg.signal_len, "CSFM")
        tokens = self.ts_to_patch_embedding(x.float())  # [B, C, N, dim]
        b, c, n, _ = tokens.shape
        tokens = tokens + self.ts_channel_type_embedding[:, :c, None, :] + self.ts_pos_embedding[:, None, :n, :]
        h = torch.cat([self.cls_token.expand(b, -1, -1), tokens.reshape(b, c * n, -1)], dim=1)
        out = []
        for attn, ff in self.transformer.layers:
            h = attn(h) + h
            h = ff(h) + h
            out.append(h)
        return out

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        """[n_layers, B, dim]: mean over ECG patch tokens (native) or over all tokens incl. CLS (published)."""
        keep = None if self.profile == "published" else slice(1, None)
        return stack_means(self.block_outputs(x), keep)


def _nk_clean(x: np.ndarray, fs: int, powerline: float = 50.0) -> np.ndarray:
    """Upstream cleaning, neurokit2's default `ecg_clean`: order-5 Butterworth 0.5 Hz high-pass (zero phase),
    then its powerline filter (a zero-phase moving average over fs/50 samples). Written out with scipy so
    all 12 leads are filtered in one call; tests check it equals `nk.ecg_clean` lead by lead."""
    from scipy import signal as sps

    sos = sps.butter(5, 0.5, btype="highpass", output="sos", fs=fs)
    clean = sps.sosfiltfilt(sos, x.astype(np.float64), axis=-1)
    taps = np.ones(int(fs / powerline) if fs >= 100 else 2)
    clean = sps.filtfilt(taps, [len(taps)], clean, axis=-1, method="pad")
    return clean.astype(np.float32)


def extract_encoder_state(obj: object, source: str) -> dict[str, torch.Tensor]:
    """Published `.pth`: flat dict; keep `encoder.*` minus the head, strip the prefix."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{source}: expected the CSFM flat state dict, found {type(obj).__name__}")
    state = {k[len(PREFIX):]: v for k, v in obj.items() if k.startswith(PREFIX) and not k.startswith(HEAD_PREFIX)}
    if not state:
        raise CheckpointError(f"{source}: no {PREFIX!r} entries; expected the published CSFM .pth "
                              f"(flat dict, keys like 'encoder.cls_token'), found {sorted(obj)[:8]}")
    return state


def load_checkpoint(model: CSFMEncoder, path: str) -> None:
    load_extracted(model, path, extract_encoder_state)


@register_encoder("csfm")
def build(spec: EncoderSpec) -> CSFMEncoder:
    return build_sized(CSFMEncoder, FULL, DEMO, spec, load_checkpoint)
