"""ST-MEM encoder (ViT-B/75): 75-sample patches per lead, bracketed by SEP tokens, plus lead embeddings.

Our own module; parameter names follow the published encoder checkpoint `{'model': state_dict}` (no head
entries: the pre-trained encoder has none). Each lead becomes [SEP, patch 1..N, SEP]; position embedding
index 0 / N+1 goes to the left / right SEP, 1..N to the patches; the lead's embedding is added to all N+2
tokens; the leads are concatenated into one sequence. Blocks are pre-norm (`PreNorm(norm, fn)`).

Audited states: the output of each of the 12 blocks (before the final norm), token-mean pooled: over the
patch tokens (native, as upstream's own pooling drops SEP) or over all tokens incl. SEP (published).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import signal as sps
from torch import nn

from raybench.encoders.base import ECGEncoder, EncoderSpec, register_encoder
from raybench.encoders.models._vit import (
    build_sized,
    check_input,
    fft_resample,
    fused_attention,
    load_extracted,
    require_dict_entry,
    stack_means,
)
from raybench.encoders.preprocess import center_crop_or_pad, zscore_joint, zscore_leads

FS = 250
SAMPLES = 2250
HIGHPASS_HZ = 0.67
LOWPASS_HZ = 40.0
FILTER_ORDER = 5


@dataclass(frozen=True)
class STMEMConfig:
    dim: int = 768
    depth: int = 12
    heads: int = 12
    dim_head: int = 64
    mlp_dim: int = 3072
    patch: int = 75
    signal_len: int = SAMPLES
    leads: int = 12

    @property
    def patches(self) -> int:
        return self.signal_len // self.patch


FULL = STMEMConfig()
# Demo: d=64 like every demo encoder; 225-sample patches (10 per lead) keep a record at a few ms.
DEMO = STMEMConfig(dim=64, heads=4, dim_head=16, mlp_dim=128, patch=225)


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class Attention(nn.Module):
    def __init__(self, cfg: STMEMConfig):
        super().__init__()
        inner = cfg.heads * cfg.dim_head
        self.heads = cfg.heads
        self.to_qkv = nn.Linear(cfg.dim, 3 * inner, bias=True)
        self.to_out = nn.Sequential(nn.Linear(inner, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.to_out(fused_attention(self.to_qkv(x), self.heads))


class FeedForward(nn.Module):
    def __init__(self, cfg: STMEMConfig):
        super().__init__()
        # indices 0 and 3 carry weights in the checkpoint (1: GELU, 2: dropout)
        self.net = nn.Sequential(nn.Linear(cfg.dim, cfg.mlp_dim), nn.GELU(), nn.Identity(),
                                 nn.Linear(cfg.mlp_dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    def __init__(self, cfg: STMEMConfig):
        super().__init__()
        self.attn = PreNorm(cfg.dim, Attention(cfg))
        self.ff = PreNorm(cfg.dim, FeedForward(cfg))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn(x) + x
        return self.ff(x) + x


class PatchEmbed(nn.Module):
    """[B, C, T] -> [B, C, N, dim]; indices 1-3 match the checkpoint (0 is the reshape)."""

    def __init__(self, cfg: STMEMConfig):
        super().__init__()
        self.patch = cfg.patch
        self.add_module("1", nn.LayerNorm(cfg.patch))
        self.add_module("2", nn.Linear(cfg.patch, cfg.dim))
        self.add_module("3", nn.LayerNorm(cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        x = x.reshape(b, c, t // self.patch, self.patch)
        for i in ("1", "2", "3"):
            x = self._modules[i](x)
        return x


class STMEMEncoder(ECGEncoder):
    name = "st_mem"
    n_layers = 12
    d = 768

    def __init__(self, cfg: STMEMConfig = FULL):
        super().__init__()
        self.cfg = cfg
        self.d = cfg.dim
        self.n_layers = cfg.depth
        self.to_patch_embedding = PatchEmbed(cfg)
        self.pos_embedding = nn.Parameter(torch.randn(1, cfg.patches + 2, cfg.dim))
        self.sep_embedding = nn.Parameter(torch.randn(cfg.dim))
        self.lead_embeddings = nn.ParameterList(nn.Parameter(torch.randn(cfg.dim)) for _ in range(cfg.leads))
        for i in range(cfg.depth):
            self.add_module(f"block{i}", TransformerBlock(cfg))
        self.norm = nn.LayerNorm(cfg.dim)  # final norm: in the checkpoint, not part of the audited states

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        """native: 250 Hz (FFT), centre 2,250 samples, 0.67 Hz high-pass + 40 Hz low-pass (order-5
        Butterworth, zero-phase), one joint z-score. published: per-lead z-score at the source rate,
        250 Hz (FFT), centre 2,250 samples."""
        x = np.asarray(signal, dtype=np.float32)
        if self.profile == "published":
            return center_crop_or_pad(fft_resample(zscore_leads(x), fs, FS), SAMPLES).astype(np.float32)
        x = center_crop_or_pad(fft_resample(x, fs, FS), SAMPLES)
        return zscore_joint(_highpass_lowpass(x, FS))

    @torch.no_grad()
    def block_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Native inputs [B, 12, 2250] -> token states [B, 12 (N + 2), dim] after each block."""
        cfg = self.cfg
        check_input(x, cfg.leads, cfg.signal_len, "ST-MEM")
        tokens = self.to_patch_embedding(x.float())  # [B, C, N, dim]
        b, c, n, dim = tokens.shape
        tokens = tokens + self.pos_embedding[:, None, 1:n + 1]
        left = (self.sep_embedding + self.pos_embedding[0, 0]).expand(b, c, 1, dim)
        right = (self.sep_embedding + self.pos_embedding[0, n + 1]).expand(b, c, 1, dim)
        leads = torch.stack(list(self.lead_embeddings))[None, :, None, :]
        h = (torch.cat([left, tokens, right], dim=2) + leads).reshape(b, c * (n + 2), dim)
        out = []
        for i in range(cfg.depth):
            h = self._modules[f"block{i}"](h)
            out.append(h)
        return out

    def patch_token_index(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Positions of the non-SEP tokens in the [C (N + 2)] sequence."""
        n = self.cfg.patches
        pos = torch.arange(self.cfg.leads * (n + 2), device=device) % (n + 2)
        return torch.nonzero((pos > 0) & (pos <= n)).squeeze(1)

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        keep = None if self.profile == "published" else self.patch_token_index(x.device)
        return stack_means(self.block_outputs(x), keep)


def _highpass_lowpass(x: np.ndarray, fs: float) -> np.ndarray:
    """Upstream ST-MEM filtering: two separate order-5 zero-phase Butterworth passes (high, then low).
    Not `preprocess.bandpass` (one order-4 band-pass), whose response differs."""
    hp = sps.butter(FILTER_ORDER, HIGHPASS_HZ, btype="highpass", fs=fs, output="sos")
    lp = sps.butter(FILTER_ORDER, LOWPASS_HZ, btype="lowpass", fs=fs, output="sos")
    return sps.sosfiltfilt(lp, sps.sosfiltfilt(hp, x, axis=-1), axis=-1).astype(np.float32)


def extract_encoder_state(obj: object, source: str):
    return require_dict_entry(obj, "model", source, "the ST-MEM encoder checkpoint {'model': state_dict}")


def load_checkpoint(model: STMEMEncoder, path: str) -> None:
    load_extracted(model, path, extract_encoder_state)


@register_encoder("st_mem")
def build(spec: EncoderSpec) -> STMEMEncoder:
    return build_sized(STMEMEncoder, FULL, DEMO, spec, load_checkpoint)
