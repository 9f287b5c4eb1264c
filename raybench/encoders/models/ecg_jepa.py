"""ECG-JEPA encoder: linear 50-sample patches of 8 leads (I, II, V1-V6), lead/time-masked attention.

Our own module; parameter names follow the published checkpoint `{'encoder': state_dict}` (the context
encoder of the JEPA). Tokens are lead-major (lead c, patch p), embedded by one Linear(50 -> dim)
(`W_P`); a fixed 2-D sin-cos table (`pos_embed`, [c * p, dim], stored in the checkpoint) is added to the
input of *every* block. A token attends only to tokens of the same lead or the same time patch.
Upstream references below are sehunfromdaegu/ECG_JEPA @ d937ad2 (ecg_jepa.py, ecg_data.py) and the
published protocol's adapter (benchmark_v1/adapters/ecg_jepa.py @ de4e19d).

Audited states ("the layer"), 12 of them, each a mean over all 8 x 50 tokens (the model has no special
tokens):
  native     upstream's representation rule at every depth. `MaskTransformer.representation` runs the
             blocks, applies the final LayerNorm and takes the token mean (ecg_jepa.py:351-357); blocks
             see `x + pos_embed` (:136-139) and have no norm of their own on the output. So layer i < 11 is
             the token mean of block i's output and layer 11 the token mean of `norm(block 11 output)`,
             i.e. exactly `encoder.representation(x)`.
  published  what the protocol's code captured: a forward hook on each block (its pre-norm output,
             adapters/ecg_jepa.py:257-264), averaged over tokens (scripts/build_probe_features.py:113); the
             final norm is never applied to a layer state.

Preprocessing (leads I, II, V1-V6, in that order):
  native     upstream's record reader (`get_ecg_data`, ecg_data.py:82-130, then `downsample_waves`, :16-17;
             on PTB-XL `waves_ptbxl`, :236-251, does the same for its 10-s 500 Hz records): physical
             millivolts, FFT-resampled to 500 Hz with `int((500 / fs) * T)` samples when fs != 500
             (:107-111), the first 5,000 samples (10 s, :114-115), FFT-resampled to 2,500 samples; no
             normalization. Upstream drops records shorter than 10 s; raybench zero-pads them at the end.
  published  the protocol's loader (adapters/ecg_jepa.py:142-151): the 8 leads in float32, the whole
             record FFT-resampled to 2,500 samples if it has another length (whatever its rate or
             duration), then a per-lead z-score with the std floored at 1e-6.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raybench.encoders.base import ECGEncoder, EncoderSpec, load_torch_checkpoint, register_encoder
from raybench.encoders.models.vit import (
    build_sized,
    check_input,
    fft_resample_to,
    fused_attention,
    key_report,
    load_reported,
    note_published_window,
    pad_end,
    require_dict_entry,
    require_tensors,
    resample_rate,
    stack_means,
)
from raybench.encoders.preprocess import zscore_leads

FS = 250
SAMPLES = 2500
READ_FS = 500  # upstream reads every record at 500 Hz and keeps its first 10 s (ecg_data.py:97, 107-115)
READ_SAMPLES = 5000
LEAD_INDEX = (0, 1, 6, 7, 8, 9, 10, 11)  # I, II, V1-V6 within LEADS (ecg_data.py:123-124)
# Entries of upstream's MaskTransformer state (models.load_encoder), counted on the upstream module.
UPSTREAM_PARAMS = 85_374_720


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
    revision = "vit-parity-1"  # preprocessing/pooling rule version: stores of an older one are redone

    def __init__(self, cfg: JEPAConfig = FULL):
        super().__init__()
        self.cfg = cfg
        self.d = cfg.dim
        self.n_layers = cfg.depth
        self.encoder_blocks = Blocks(cfg)
        self.norm = nn.LayerNorm(cfg.dim)  # final norm: part of the last native state (as in `representation`)
        self.W_P = nn.Linear(cfg.patch, cfg.dim)
        self.pos_embed = nn.Parameter(sincos_2d(cfg.dim, cfg.leads, cfg.patches), requires_grad=False)
        self.register_buffer("attn_mask", lead_time_mask(cfg.leads, cfg.patches), persistent=False)

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        """One record [12, T] mV at fs -> [8, 2500] (see the module docstring for both profiles)."""
        if self.profile == "published":
            note_published_window(np.shape(signal)[-1], fs)
            x = np.asarray(signal, dtype=np.float32)[list(LEAD_INDEX)]
            return zscore_leads(fft_resample_to(x, SAMPLES, np.float32))
        x = np.asarray(signal, dtype=np.float64)
        x = resample_rate(x, fs, READ_FS, int((READ_FS / fs) * x.shape[-1]))
        x = pad_end(x[:, :READ_SAMPLES], READ_SAMPLES)
        return fft_resample_to(x, SAMPLES, np.float64, always=True)[list(LEAD_INDEX)].astype(np.float32)

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

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        """[n_layers, B, dim] token means of the block outputs; native: the last one after the final norm."""
        states = self.block_outputs(x)
        if self.profile != "published":
            states[-1] = self.norm(states[-1])
        return stack_means(states)


def extract_encoder_state(obj: object, source: str):
    return require_dict_entry(obj, "encoder", source, "the ECG-JEPA checkpoint {'encoder': state_dict}")


def apply_checkpoint(model: ECGJEPAEncoder, obj: object, source: str) -> None:
    """Load a checkpoint object in the published format strictly (every key accounted for)."""
    state = require_tensors(extract_encoder_state(obj, source), source)
    load_reported(model, state, source, "Check that the file is the published checkpoint for this model and size.")


def load_checkpoint(model: ECGJEPAEncoder, path: str) -> None:
    apply_checkpoint(model, load_torch_checkpoint(path), str(path))


def inspect_checkpoint(path: str, size: str = "full") -> dict:
    """What loading `path` into the `size` architecture would do, without failing on a key mismatch: model,
    file, loaded / missing / extra keys of the `encoder` entry, the other top-level entries (the JEPA's
    predictor / target encoder / optimizer state, never loaded) under `dropped`, parameter counts (loaded,
    model) and upstream's count. A file without an `encoder` state dict raises CheckpointError."""
    source = str(path)
    obj = load_torch_checkpoint(path)
    state = require_tensors(extract_encoder_state(obj, source), source)
    model = ECGJEPAEncoder(FULL if size == "full" else DEMO)
    return {"model": "ecg_jepa", "file": source, "variant": "context encoder ('encoder')",
            "architecture": f"{size}: {model.n_layers} layers x {model.d}, {model.cfg.heads} heads",
            **key_report(model.state_dict(), state),
            "dropped": {"other_entries": sorted(str(k) for k in obj if k != "encoder")},
            "published_params": UPSTREAM_PARAMS,
            "published_params_source": "upstream MaskTransformer of models.load_encoder, counted on ECG_JEPA "
                                       "ecg_jepa.py (no count is published)"}


@register_encoder("ecg_jepa")
def build(spec: EncoderSpec) -> ECGJEPAEncoder:
    return build_sized(ECGJEPAEncoder, FULL, DEMO, spec, load_checkpoint)
