"""ST-MEM encoder (ViT-B/75): 75-sample patches per lead, bracketed by SEP tokens, plus lead embeddings.

Our own module; parameter names follow the published encoder checkpoint `{'model': state_dict}` (no head
entries: the pre-trained encoder has none). Each lead becomes [SEP, patch 1..N, SEP]; position embedding
index 0 / N+1 goes to the left / right SEP, 1..N to the patches; the lead's embedding is added to all N+2
tokens; the leads are concatenated into one sequence. Blocks are pre-norm (`PreNorm(norm, fn)`).
Upstream references below are bakqui/ST-MEM @ 69ec702 (models/encoder/st_mem_vit.py, util/transforms.py,
util/dataset.py, data/process_ecg.py, configs/downstream/st_mem.yaml) and the published protocol's adapter
(benchmark_v1/adapters/st_mem.py @ de4e19d).

Audited states ("the layer"), 12 of them:
  native     upstream's representation rule at every depth. `forward_encoding` drops the two SEP tokens of
             every lead, averages the patch tokens over leads and time, then applies the final LayerNorm to
             that mean (st_mem_vit.py:116-121). So layer i < 11 is the patch-token mean of block i's output
             and layer 11 is `norm(patch-token mean of block 11)`, i.e. exactly `forward_encoding(x)`
             (the norm acts on the pooled vector, not on each token).
  published  what the protocol's code captured: a forward hook on each block (adapters/st_mem.py:401-409)
             averaged over all 12 x (N + 2) tokens, SEP included (scripts/build_probe_features.py:113); no
             final norm.

Preprocessing:
  native     upstream's pipeline for a downstream record: `process_ecg.py` keeps 10-s windows of the record
             in float32 (the first one is the record's first 10 s; records shorter than 10 s are dropped,
             data/process_ecg.py:87-94); the dataset FFT-resamples it to 250 Hz with `int(T * 250 / fs)`
             samples (util/transforms.py:56-61, fs cast to int by util/dataset.py:114); the evaluation
             transforms (configs/downstream/st_mem.yaml `eval_transforms`) crop 2,250 samples, high-pass
             0.67 Hz then low-pass 40 Hz (order-5 Butterworth, `sosfiltfilt`, transforms.py:115-138) and
             standardize over all leads and samples together (0 where the std is 0, transforms.py:140-152).
             Upstream's evaluation crops three windows (`n_crop`, starts 0, 125, 250; transforms.py:100-113)
             and averages the head's logits over them (engine_downstream.py:112-120); an audit needs one
             state per record, so raybench keeps the middle window, start (2500 - 2250) // 2 = 125, which
             is also upstream's `CenterCrop` (transforms.py:75-85). A record shorter than 10 s is zero-padded
             at the end to 2,500 samples at 250 Hz (upstream drops it).
  published  the protocol's loader (adapters/ecg_fm.py:60-69 then adapters/st_mem.py:320-324): the record
             FFT-resampled to 5,000 samples if it has another length, a per-lead z-score (std floored at
             1e-6), FFT-resampled to 2,500 samples (always), the centre 2,250 (start 125); float32
             throughout; no filtering.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from scipy import signal as sps
from torch import nn

from raybench.encoders.base import ECGEncoder, EncoderSpec, load_torch_checkpoint, register_encoder
from raybench.encoders.models.vit import (
    build_sized,
    check_input,
    crop_center,
    fft_resample_to,
    fused_attention,
    key_report,
    load_reported,
    note_published_window,
    pad_end,
    published_12lead,
    require_dict_entry,
    require_tensors,
    resample_rate,
    stack_means,
)
from raybench.encoders.preprocess import butter_sos

FS = 250
SAMPLES = 2250
WINDOW_S = 10  # process_ecg.py:87-89: 10-s windows
WINDOW = FS * WINDOW_S
HIGHPASS_HZ = 0.67
LOWPASS_HZ = 40.0
FILTER_ORDER = 5
# Entries of upstream's st_mem_vit_base(num_leads=12) state, counted on the upstream module.
UPSTREAM_PARAMS = 85_150_614


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
    revision = "vit-parity-1"  # preprocessing/pooling rule version: stores of an older one are redone

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
        self.norm = nn.LayerNorm(cfg.dim)  # final norm: applied to the last native state (pooled vector)

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        """One record [12, T] mV at fs -> [12, 2250] (see the module docstring for both profiles)."""
        if self.profile == "published":
            note_published_window(np.shape(signal)[-1], fs)
            x = fft_resample_to(published_12lead(signal), WINDOW, np.float32, always=True)
            return crop_center(x, SAMPLES).astype(np.float32)
        x = np.asarray(signal, dtype=np.float32)[:, :int(WINDOW_S * fs)]
        x = resample_rate(x, int(fs), FS, int(x.shape[-1] * FS / int(fs)), dtype=np.float32)
        x = crop_center(pad_end(x, WINDOW), SAMPLES)
        return _standardize(_highpass_lowpass(x, FS)).astype(np.float32)

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

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        """[n_layers, B, dim]: patch-token means, the last one through the final norm (native), or means over
        every token, SEP included (published)."""
        if self.profile == "published":
            return stack_means(self.block_outputs(x))
        states = stack_means(self.block_outputs(x), self.patch_token_index(x.device))
        states[-1] = self.norm(states[-1])
        return states


def _highpass_lowpass(x: np.ndarray, fs: float) -> np.ndarray:
    """Upstream ST-MEM filtering: two separate order-5 zero-phase Butterworth passes (high, then low).
    Not `preprocess.bandpass` (one order-4 band-pass), whose response differs."""
    hp = butter_sos(FILTER_ORDER, HIGHPASS_HZ, "highpass", fs)
    lp = butter_sos(FILTER_ORDER, LOWPASS_HZ, "lowpass", fs)
    return sps.sosfiltfilt(lp, sps.sosfiltfilt(hp, x, axis=-1), axis=-1)


def _standardize(x: np.ndarray) -> np.ndarray:
    """Upstream `Standardize(axis=(-1, -2))`: one mean / std over all leads and samples; 0 where std is 0."""
    loc, scale = x.mean(), x.std()
    return np.divide(x - loc, scale, out=np.zeros_like(x), where=scale != 0)


def extract_encoder_state(obj: object, source: str):
    return require_dict_entry(obj, "model", source, "the ST-MEM encoder checkpoint {'model': state_dict}")


def apply_checkpoint(model: STMEMEncoder, obj: object, source: str) -> None:
    """Load a checkpoint object in the published format strictly (every key accounted for)."""
    state = require_tensors(extract_encoder_state(obj, source), source)
    load_reported(model, state, source, "Check that the file is the published checkpoint for this model and size.")


def load_checkpoint(model: STMEMEncoder, path: str) -> None:
    apply_checkpoint(model, load_torch_checkpoint(path), str(path))


def inspect_checkpoint(path: str, size: str = "full") -> dict:
    """What loading `path` into the `size` architecture would do, without failing on a key mismatch: model,
    file, loaded / missing / extra keys of the `model` entry (a fine-tuned `head.*` shows as extra: raybench
    audits the pre-trained encoder), the other top-level entries (epoch, optimizer, config) under `dropped`,
    parameter counts (loaded, model) and upstream's count. A file without a `model` state dict raises
    CheckpointError."""
    source = str(path)
    obj = load_torch_checkpoint(path)
    state = require_tensors(extract_encoder_state(obj, source), source)
    model = STMEMEncoder(FULL if size == "full" else DEMO)
    return {"model": "st_mem", "file": source, "variant": "pre-trained encoder ('model')",
            "architecture": f"{size}: {model.n_layers} layers x {model.d}, {model.cfg.heads} heads",
            **key_report(model.state_dict(), state),
            "dropped": {"other_entries": sorted(str(k) for k in obj if k != "model")},
            "published_params": UPSTREAM_PARAMS,
            "published_params_source": "upstream st_mem_vit_base(num_leads=12) without head, counted on ST-MEM "
                                       "models/encoder/st_mem_vit.py (no count is published)"}


@register_encoder("st_mem")
def build(spec: EncoderSpec) -> STMEMEncoder:
    return build_sized(STMEMEncoder, FULL, DEMO, spec, load_checkpoint)
