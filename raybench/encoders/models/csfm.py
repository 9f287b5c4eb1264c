"""CSFM (Cardiac Sensing Foundation Model, tiny variant): patch-25 ViT over 12 leads + a CLS token.

Our own module; parameter names follow the published `.pth` (a flat state dict whose encoder entries carry
an `encoder.` prefix). Tokens: CLS, then lead-major patches (lead c, patch n) each embedded as
LN -> Linear -> LN plus a channel-type embedding (channel index = lead index 0..11) and a per-patch position
embedding. Blocks are pre-norm (the norm lives inside the attention and the MLP). The text branch of the
multimodal model is kept as parameters (so the checkpoint loads strictly) but never used: ECG only.
Upstream references below are guxiao0822/Cardiac-Sensing-FM @ 92eb23a (network/model.py, utils/preprocess.py)
and the published protocol's adapter (benchmark_v1/adapters/csfm.py @ de4e19d).

Audited states ("the layer"), 6 of them:
  native     upstream's own representation rule, applied at every depth. `CSFM_model` builds the model with
             `pool='cls'` (network/model.py:529) and `forward(task='cls')` returns `x[:, 0]` of the
             transformer output (model.py:449), which is the block stack followed by the final LayerNorm
             (`Transformer.forward`, model.py:96-105). So layer i < 5 is the CLS token of block i's output
             (the pre-norm residual stream `return_intermediate` exposes, model.py:100-104) and layer 5 is
             the CLS token after the final norm: exactly the feature vector upstream's README extracts
             (`model.mlp_head = nn.Identity(); model(signal, channels)`).
  published  what the protocol's code captured: a forward hook on each block's feed-forward returning
             `output + inputs[0]`, i.e. block i's pre-norm output (adapters/csfm.py:129-138), averaged over
             all 1 + 12 x 100 tokens, CLS included (`values.mean(axis=1)`, scripts/build_probe_features.py:113).

Preprocessing:
  native     upstream `preprocess_ecg` (utils/preprocess.py:19-56): FFT resampling to 250 Hz with
             `int(T * 250 / fs)` samples (truncation, :41), neurokit2 `ecg_clean` per lead (:44-47), then
             2,500 samples: zero-pad at the end when shorter, a crop when longer (:8-17), then a per-lead
             z-score `(x - mean) / (std + 1e-8)` (:52-54). Upstream crops at a *random* start
             (`np.random.randint(0, T - 2500)`); raybench takes the centre start (T - 2500) // 2, a fixed
             point inside upstream's range (PTB-XL records resample to exactly 2,500 and are not cropped).
  published  the protocol's loader (adapters/ecg_fm.py:60-69 then adapters/csfm.py:42-45): the record FFT-
             resampled to 5,000 samples if it has another length, a per-lead z-score (std floored at 1e-6),
             then FFT-resampled to 2,500 samples, all in float32. Whatever the record's rate or duration it
             is squeezed into those lengths, as that code did (its PTB-XL records were 10 s at 500 Hz).

Checkpoints: upstream loads `{k.replace('encoder.', ''): v for k in ckpt if k.startswith('encoder.') and
'mlp_head' not in k}` with `strict=False` (README "Load the Pretrained Model"), which would silently keep
random weights for anything missing. raybench drops only the named extra groups in `EXTRA_GROUPS` (the
classification head, the dense-prediction head, a pre-training decoder); any other key, missing or
unexpected, is a CheckpointError listing the keys. `inspect_checkpoint` reports what would load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from raybench.encoders.base import CheckpointError, ECGEncoder, EncoderSpec, load_torch_checkpoint, register_encoder
from raybench.encoders.models.vit import (
    build_sized,
    check_input,
    crop_center,
    fft_resample_to,
    fused_attention,
    key_report,
    note_published_window,
    pad_end,
    published_12lead,
    raise_on_mismatch,
    require_tensors,
    resample_rate,
    stack_means,
)
from raybench.encoders.preprocess import butter_sos

FS = 250
SAMPLES = 2500
PREFIX = "encoder."
ZSCORE_EPS = 1e-8  # utils/preprocess.py:54: std + 1e-8

# Extra key groups a CSFM `.pth` may carry besides the encoder; dropped by name, never loaded.
EXTRA_GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    # CSFM.mlp_head (network/model.py:403); upstream's loader drops every key containing 'mlp_head'
    "mlp_head": {"prefixes": ("encoder.mlp_head.",), "names": ()},
    # the dense-prediction head `forward(task='dense')` uses (model.py:458-476)
    "dense_head": {"prefixes": ("encoder.dense_act_postprocess.", "encoder.dense_scratch.", "encoder.dense_head."),
                   "names": ()},
    # a masked-reconstruction pre-training decoder next to the encoder (top-level, outside `encoder.`)
    "decoder": {"prefixes": ("decoder.", "decoder_", "enc_to_dec."), "names": ("mask_token",)},
}
# Parameters of upstream's CSFM_model('Tiny') without mlp_head, counted on the upstream module (upstream
# publishes no count); tests/parity checks the adapter against the count its generator recorded.
UPSTREAM_TINY_PARAMS = 42_511_154
# (dim, depth, heads x dim_head, mlp_dim) of the upstream variants (network/model.py:533-540, dim_head 64)
VARIANTS = {(768, 6, 512, 1024): "Tiny", (768, 12, 768, 3072): "Base", (1024, 16, 1536, 4096): "Large"}


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

    @property
    def geometry(self) -> tuple[int, int, int, int]:
        return self.dim, self.depth, self.heads * self.dim_head, self.mlp_dim


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
        self.norm = nn.LayerNorm(cfg.dim)  # final norm: part of the last native state (the CLS after it)
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
    revision = "vit-parity-1"  # preprocessing/pooling rule version: stores of an older one are redone

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
        """One record [12, T] mV at fs -> [12, 2500] (see the module docstring for both profiles)."""
        if self.profile == "published":
            note_published_window(np.shape(signal)[-1], fs)
            return fft_resample_to(published_12lead(signal), SAMPLES, np.float32).astype(np.float32)
        x = np.asarray(signal, dtype=np.float64)
        x = resample_rate(x, fs, FS, int(x.shape[-1] * FS / fs))
        x = nk_clean(x, FS)
        x = crop_center(pad_end(x, SAMPLES), SAMPLES)
        x = (x - x.mean(axis=-1, keepdims=True)) / (x.std(axis=-1, keepdims=True) + ZSCORE_EPS)
        return x.astype(np.float32)

    # ------------------------------------------------------------ forward
    @torch.no_grad()
    def block_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Native inputs [B, 12, 2500] -> token states [B, 1 + 12 N, dim] after each block (pre-norm)."""
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

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        """[n_layers, B, dim]: the CLS token, the last one after the final norm (native), or the mean over
        all tokens of the pre-norm block outputs, CLS included (published)."""
        states = self.block_outputs(x)
        if self.profile == "published":
            return stack_means(states)
        cls = [h[:, 0] for h in states]
        cls[-1] = self.transformer.norm(cls[-1])  # LayerNorm is per token: norm(h)[:, 0] == norm(h[:, 0])
        return torch.stack(cls)


def nk_clean(x: np.ndarray, fs: int, powerline: float = 50.0) -> np.ndarray:
    """Upstream cleaning, neurokit2's default `ecg_clean`: order-5 Butterworth 0.5 Hz high-pass (zero phase),
    then its powerline filter (a zero-phase moving average over fs/50 samples). Written out with scipy so
    all 12 leads are filtered in one call; tests check it equals `nk.ecg_clean` lead by lead. float64."""
    from scipy import signal as sps

    sos = butter_sos(5, 0.5, "highpass", fs)
    clean = sps.sosfiltfilt(sos, np.asarray(x, dtype=np.float64), axis=-1)
    taps = np.ones(int(fs / powerline) if fs >= 100 else 2)
    return sps.filtfilt(taps, [len(taps)], clean, axis=-1, method="pad")


# ---------------------------------------------------------------- checkpoints


def extra_group(key: str) -> str | None:
    """The name of the `EXTRA_GROUPS` entry `key` (as the file names it) belongs to, or None."""
    for group, spec in EXTRA_GROUPS.items():
        if key.startswith(spec["prefixes"]) or key in spec["names"]:
            return group
    return None


def split_checkpoint(obj: object, source: str) -> tuple[dict[str, torch.Tensor], dict[str, list[str]], list[str]]:
    """Published `.pth` (flat dict) -> (encoder state with `encoder.` stripped, the dropped extra groups
    {group: keys}, foreign keys: neither encoder nor a known group, as the file names them)."""
    if not isinstance(obj, dict):
        raise CheckpointError(f"{source}: expected the CSFM flat state dict, found {type(obj).__name__}")
    if not any(isinstance(k, str) and k.startswith(PREFIX) for k in obj):
        raise CheckpointError(f"{source}: no {PREFIX!r} entries; expected the published CSFM .pth "
                              f"(flat dict, keys like 'encoder.cls_token'), found {sorted(map(str, obj))[:8]}")
    state: dict[str, torch.Tensor] = {}
    dropped: dict[str, list[str]] = {}
    foreign: list[str] = []
    for key in sorted(obj, key=str):
        group = extra_group(str(key))
        if group is not None:
            dropped.setdefault(group, []).append(key)
        elif key.startswith(PREFIX):
            state[key[len(PREFIX):]] = obj[key]
        else:
            foreign.append(str(key))
    return require_tensors(state, source), dropped, foreign


def geometry(state: dict[str, torch.Tensor]) -> tuple[int, int, int, int] | None:
    """(dim, depth, heads x dim_head, mlp_dim) read off an encoder state, None when the keys are absent."""
    try:
        depth = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("transformer.layers."))
        return (int(state["cls_token"].shape[-1]), depth,
                int(state["transformer.layers.0.0.to_qkv.weight"].shape[0]) // 3,
                int(state["transformer.layers.0.1.net.1.weight"].shape[0]))
    except (KeyError, ValueError, IndexError):
        return None


def variant_name(found: tuple[int, int, int, int] | None) -> str:
    if found is None:
        return "unknown (encoder keys incomplete)"
    if found in VARIANTS:
        return f"CSFM-{VARIANTS[found]}"
    return f"not an upstream variant (dim {found[0]}, {found[1]} layers, inner {found[2]}, mlp {found[3]})"


HINT = ("Check that the file is the published CSFM-Tiny .pth; known extra groups "
        f"({', '.join(EXTRA_GROUPS)}) are dropped by name, any other key is refused.")


def check_variant(model: CSFMEncoder, state: dict[str, torch.Tensor], source: str) -> None:
    """A checkpoint of another upstream variant (Base, Large) gets its name; other mismatches are left to the
    key report, which names the keys."""
    found = geometry(state)
    if found is not None and found != model.cfg.geometry and found in VARIANTS:
        raise CheckpointError(f"{source}: this is CSFM-{VARIANTS[found]} (dim {found[0]}, {found[1]} layers, "
                              f"inner {found[2]}, mlp {found[3]}); the adapter at this size expects dim {model.d}, "
                              f"{model.n_layers} layers (the published CSFM-Tiny at size 'full')")


def apply_checkpoint(model: CSFMEncoder, obj: object, source: str) -> None:
    """Load a published `.pth` object: drop the named extra groups, refuse anything else."""
    state, _, foreign = split_checkpoint(obj, source)
    check_variant(model, state, source)
    report = key_report(model.state_dict(), state)
    report["extra"] = sorted([PREFIX + k for k in report["extra"]] + foreign)
    raise_on_mismatch(report, source, type(model).__name__, HINT)
    model.load_state_dict(state, strict=True)


def load_checkpoint(model: CSFMEncoder, path: str) -> None:
    apply_checkpoint(model, load_torch_checkpoint(path), str(path))


def inspect_checkpoint(path: str, size: str = "full") -> dict:
    """What loading `path` into the `size` architecture would do, without failing on a key mismatch: model,
    file, variant, loaded / missing / extra keys (extra = refused: neither encoder nor a named group, as the
    file names them), the named groups dropped, parameter counts (loaded, model) and upstream's count.
    An unreadable or non-CSFM file raises CheckpointError."""
    source = str(path)
    state, dropped, foreign = split_checkpoint(load_torch_checkpoint(path), source)
    model = CSFMEncoder(FULL if size == "full" else DEMO)
    report = key_report(model.state_dict(), state)
    report["extra"] = sorted([PREFIX + k for k in report["extra"]] + foreign)
    found = geometry(state)
    return {"model": "csfm", "file": source,
            "variant": variant_name(found),
            "architecture": f"{size}: {model.n_layers} layers x {model.d}, {model.cfg.heads} heads",
            **report, "dropped": dropped, "published_params": UPSTREAM_TINY_PARAMS,
            "published_params_source": "upstream CSFM_model('Tiny') without mlp_head, counted on "
                                       "Cardiac-Sensing-FM network/model.py (no count is published)"}


@register_encoder("csfm")
def build(spec: EncoderSpec) -> CSFMEncoder:
    return build_sized(CSFMEncoder, FULL, DEMO, spec, load_checkpoint)

