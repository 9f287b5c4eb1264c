"""ECG-JEPA encoder: linear 50-sample patches of 8 leads (I, II, V1-V6), lead/time-masked attention.

Our own module; parameter names follow the published checkpoint `{'encoder': state_dict}` (the context
encoder of the JEPA). Tokens are lead-major (lead c, patch p), embedded by one Linear(50 -> dim)
(`W_P`); a fixed 2-D sin-cos table (`pos_embed`, [c * p, dim], stored in the checkpoint) is added to the
input of *every* block. A token attends only to tokens of the same lead or the same time patch.

Audited states: the output of each of the 12 blocks (before the final norm), mean over all tokens (the
model has no special tokens, so both profiles pool the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raybench.encoders.base import ECGEncoder, EncoderSpec, register_encoder
from raybench.encoders.models._vit import (
    build_sized,
    check_input,
    crop_center_or_pad_end,
    fft_resample,
    fused_attention,
    load_extracted,
    require_dict_entry,
    stack_means,
)
from raybench.encoders.preprocess import zscore_leads

FS = 250
SAMPLES = 2500
LEAD_INDEX = (0, 1, 6, 7, 8, 9, 10, 11)  # I, II, V1-V6 within LEADS


@dataclass(frozen=True)
class JEPAConfig:
    dim: int = 768
    depth: int = 12
    heads: int = 16
    mlp_ratio: float = 4.0
    leads: int = 8
    patch: int = 50
    signal_len: int = SAMPLES

    @property
    def patches(self) -> int:
        return self.signal_len // self.patch


FULL = JEPAConfig()
# Demo: d=64 like every demo encoder; 250-sample patches (10 per lead) keep a record at a few ms.
DEMO = JEPAConfig(dim=64, heads=4, mlp_ratio=2.0, patch=250)


class Attention(nn.Module):
    def __init__(self, cfg: JEPAConfig):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.proj(fused_attention(self.qkv(x), self.heads, mask))


class Mlp(nn.Module):
    def __init__(self, cfg: JEPAConfig):
        super().__init__()
        hidden = int(cfg.dim * cfg.mlp_ratio)
        self.fc1 = nn.Linear(cfg.dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, cfg: JEPAConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = Mlp(cfg)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), mask)
        return x + self.mlp(self.norm2(x))


class Blocks(nn.Module):
    def __init__(self, cfg: JEPAConfig):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))


def sincos_2d(dim: int, rows: int, cols: int) -> torch.Tensor:
    """[rows * cols, dim] table, row-major over (lead, patch): first half encodes the patch (column)
    index, second half the lead (row) index; each half is [sin | cos] at frequencies 10000^(-i / (dim/4))."""
    quarter = dim // 4
    omega = 1.0 / 10000 ** (torch.arange(quarter, dtype=torch.float64) / quarter)

    def enc(pos: torch.Tensor) -> torch.Tensor:
        ang = pos.to(torch.float64)[:, None] * omega[None, :]
        return torch.cat([ang.sin(), ang.cos()], dim=1)

    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    return torch.cat([enc(c.reshape(-1)), enc(r.reshape(-1))], dim=1).float()


def lead_time_mask(leads: int, patches: int) -> torch.Tensor:
    """bool [L P, L P]: True where two tokens share a lead or a time patch."""
    lead = torch.arange(leads).repeat_interleave(patches)
    step = torch.arange(patches).repeat(leads)
    return (lead[:, None] == lead[None, :]) | (step[:, None] == step[None, :])


class ECGJEPAEncoder(ECGEncoder):
    name = "ecg_jepa"
    n_layers = 12
    d = 768

    def __init__(self, cfg: JEPAConfig = FULL):
        super().__init__()
        self.cfg = cfg
        self.d = cfg.dim
        self.n_layers = cfg.depth
        self.encoder_blocks = Blocks(cfg)
        self.norm = nn.LayerNorm(cfg.dim)  # final norm: in the checkpoint, not part of the audited states
        self.W_P = nn.Linear(cfg.patch, cfg.dim)
        self.pos_embed = nn.Parameter(sincos_2d(cfg.dim, cfg.leads, cfg.patches), requires_grad=False)
        self.register_buffer("attn_mask", lead_time_mask(cfg.leads, cfg.patches), persistent=False)

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        """Leads I, II, V1-V6; 250 Hz (FFT); 2,500 samples (centre crop / end pad). native: millivolts as
        upstream; published: then a per-lead z-score."""
        x = np.asarray(signal, dtype=np.float32)[list(LEAD_INDEX)]
        x = crop_center_or_pad_end(fft_resample(x, fs, FS), SAMPLES)
        return zscore_leads(x) if self.profile == "published" else x.astype(np.float32)

    @torch.no_grad()
    def block_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Native inputs [B, 8, 2500] -> token states [B, 8 * 50, dim] after each block."""
        cfg = self.cfg
        check_input(x, cfg.leads, cfg.signal_len, "ECG-JEPA")
        h = self.W_P(x.float().reshape(x.shape[0], cfg.leads * cfg.patches, cfg.patch))
        out = []
        for block in self.encoder_blocks.blocks:
            h = block(h + self.pos_embed, self.attn_mask)
            out.append(h)
        return out

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        return stack_means(self.block_outputs(x))


def extract_encoder_state(obj: object, source: str):
    return require_dict_entry(obj, "encoder", source, "the ECG-JEPA checkpoint {'encoder': state_dict}")


def load_checkpoint(model: ECGJEPAEncoder, path: str) -> None:
    load_extracted(model, path, extract_encoder_state)


@register_encoder("ecg_jepa")
def build(spec: EncoderSpec) -> ECGJEPAEncoder:
    return build_sized(ECGJEPAEncoder, FULL, DEMO, spec, load_checkpoint)
