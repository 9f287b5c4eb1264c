"""The wav2vec 2.0 ECG backbone shared by ECG-FM and CARDIAC-FM (fairseq-signals `wav2vec2_cmsc`).

Our own module; parameter names are the fairseq-signals state-dict keys, so the published checkpoints load
strictly. Architecture (ECG-FM, 90.9M parameters): a conv feature extractor on the 12 leads (4 blocks of
256 channels, kernel 2, stride 2; a per-channel GroupNorm in the first block), LayerNorm over the 256 conv
features, a 256 -> 768 projection, a grouped conv positional embedding (kernel 128, 16 groups, weight norm
over the kernel axis, GELU) added to the tokens, then a post-LN transformer (768 wide, 12 layers, 12 heads,
FFN 3,072, exact GELU) whose input is layer-normed first. The pretraining heads (mask embedding, Gumbel
codebook, `project_q`, `final_proj`) are in the checkpoint, so they exist here to be loaded, but the
audited states never use them.

Also holds the small preprocessing helpers all three wav2vec-family adapters (ECG-FM, CARDIAC-FM,
HuBERT-ECG) need beyond `raybench.encoders.preprocess`.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from scipy import signal as sps
from torch import nn

from raybench.encoders.base import CheckpointError

ConvSpec = tuple[tuple[int, int, int], ...]  # (channels, kernel, stride) per conv block


# ---------------------------------------------------------------- config

@dataclass(frozen=True)
class W2VConfig:
    """The fairseq-signals model options that shape the state dict (names as in its `cfg['model']`)."""

    in_d: int = 12
    conv_feature_layers: ConvSpec = ((256, 2, 2),) * 4
    extractor_mode: str = "default"  # default: GroupNorm in block 0 only; layer_norm: LayerNorm in every block
    conv_bias: bool = False
    encoder_embed_dim: int = 768
    encoder_ffn_embed_dim: int = 3072
    encoder_attention_heads: int = 12
    encoder_layers: int = 12
    layer_norm_first: bool = False
    conv_pos: int = 128
    conv_pos_groups: int = 16
    # pretraining-only parameters (loaded, never used for the audited states)
    apply_mask: bool = True
    quantize_targets: bool = True
    final_dim: int = 256
    latent_vars: int = 320
    latent_groups: int = 2
    latent_dim: int = 0

    def __post_init__(self) -> None:
        if self.extractor_mode not in ("default", "layer_norm"):
            raise ValueError(f"extractor_mode must be 'default' or 'layer_norm', got {self.extractor_mode!r}")
        if self.encoder_embed_dim % self.encoder_attention_heads:
            raise ValueError("encoder_embed_dim must be divisible by encoder_attention_heads")

    @property
    def conv_dim(self) -> int:
        return self.conv_feature_layers[-1][0]

    @property
    def proj_dim(self) -> int:
        return self.final_dim if self.final_dim > 0 else self.encoder_embed_dim

    @property
    def vq_dim(self) -> int:
        return self.latent_dim if self.latent_dim > 0 else self.proj_dim

    def n_tokens(self, samples: int) -> int:
        """Tokens the conv front end makes from `samples` input samples."""
        for _, k, s in self.conv_feature_layers:
            samples = (samples - k) // s + 1
        return samples

    @classmethod
    def from_fairseq(cls, model_cfg: Mapping, source: str) -> W2VConfig:
        """`checkpoint['cfg']['model']` -> config; options we do not implement are refused by name."""
        for option in ("quantize_input", "target_glu"):
            if model_cfg.get(option):
                raise CheckpointError(f"{source}: model option {option}=true is not supported by the ECG-FM "
                                      "adapter (the published ECG-FM checkpoint does not use it)")
        kwargs = {}
        for f in fields(cls):
            if f.name not in model_cfg or model_cfg[f.name] is None:
                continue
            value = model_cfg[f.name]
            if f.name == "conv_feature_layers":
                value = parse_conv_layers(value, source) if isinstance(value, str) else _as_spec(value, source)
            kwargs[f.name] = value
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as err:
            raise CheckpointError(f"{source}: unusable model cfg: {err}") from err


def parse_conv_layers(text: str, source: str = "cfg") -> ConvSpec:
    """fairseq's conv spec string, e.g. "[(256, 2, 2)] * 4", read without `eval`.

    Allows list/tuple literals of ints, `list * int` and `list + list` - everything the configs use.
    """

    def ev(node: ast.AST) -> object:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List | ast.Tuple):
            items = [ev(e) for e in node.elts]
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Add):
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int):
                return left * right
            if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, list):
                return right * left
        raise ValueError(ast.dump(node))

    try:
        value = ev(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError) as err:
        raise CheckpointError(f"{source}: cannot read conv_feature_layers {text!r} (expected a list of "
                              "(dim, kernel, stride) tuples such as '[(256, 2, 2)] * 4')") from err
    return _as_spec(value, source)


def _as_spec(value: object, source: str) -> ConvSpec:
    try:
        spec = tuple((int(d), int(k), int(s)) for d, k, s in value)  # type: ignore[union-attr]
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: conv_feature_layers must be (dim, kernel, stride) triples, got "
                              f"{value!r}") from err
    if not spec:
        raise CheckpointError(f"{source}: conv_feature_layers is empty")
    return spec


# ECG-FM as published (the fairseq-signals w2v_cmsc_rlm pretraining config).
FULL = W2VConfig()
# Demo: d=64 like every demo encoder, 6 layers, a 32-channel front end (still projected, as in the full model).
DEMO = W2VConfig(conv_feature_layers=((32, 2, 2),) * 4, encoder_embed_dim=64, encoder_ffn_embed_dim=128,
                 encoder_attention_heads=4, encoder_layers=6, conv_pos=16, conv_pos_groups=4, final_dim=16,
                 latent_vars=8, latent_groups=2)


# ---------------------------------------------------------------- modules

class _TransposeLast(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.transpose(-2, -1)


class ConvFeatureExtractor(nn.Module):
    """[B, in_d, T] -> [B, C, T']. Block i is Sequential(conv, dropout slot, [norm], GELU) as in the keys."""

    def __init__(self, cfg: W2VConfig):
        super().__init__()
        blocks = []
        n_in = cfg.in_d
        for i, (dim, k, stride) in enumerate(cfg.conv_feature_layers):
            conv = nn.Conv1d(n_in, dim, k, stride=stride, bias=cfg.conv_bias)
            nn.init.kaiming_normal_(conv.weight)
            if cfg.extractor_mode == "layer_norm":
                norm = nn.Sequential(_TransposeLast(), nn.LayerNorm(dim), _TransposeLast())
                blocks.append(nn.Sequential(conv, nn.Identity(), norm, nn.GELU()))
            elif i == 0:
                blocks.append(nn.Sequential(conv, nn.Identity(), nn.GroupNorm(dim, dim), nn.GELU()))
            else:
                blocks.append(nn.Sequential(conv, nn.Identity(), nn.GELU()))
            n_in = dim
        self.conv_layers = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.conv_layers:
            x = block(x)
        return x


class WeightNormConv1d(nn.Module):
    """Conv1d with weight = weight_v * weight_g / ||weight_v||, the norm taken per kernel tap (dim 2).

    Parameters are named `weight_g`, `weight_v`, `bias` as `torch.nn.utils.weight_norm` saved them in the
    published checkpoints (newer `parametrizations` names are mapped on load)."""

    def __init__(self, channels: int, kernel: int, groups: int):
        super().__init__()
        self.padding = kernel // 2
        self.groups = groups
        v = torch.empty(channels, channels // groups, kernel)
        std = (4.0 / (kernel * channels)) ** 0.5  # fairseq's init for the positional conv
        nn.init.normal_(v, mean=0.0, std=std)
        self.weight_v = nn.Parameter(v)
        self.weight_g = nn.Parameter(self._norm(v).clone())
        self.bias = nn.Parameter(torch.zeros(channels))

    @staticmethod
    def _norm(v: torch.Tensor) -> torch.Tensor:
        return v.pow(2).sum(dim=(0, 1), keepdim=True).sqrt()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight_v * (self.weight_g / self._norm(self.weight_v))
        return F.conv1d(x, weight, self.bias, padding=self.padding, groups=self.groups)


class ConvPositionalEncoding(nn.Module):
    """Grouped conv over tokens; an even kernel yields one extra step, dropped at the end (same padding)."""

    def __init__(self, cfg: W2VConfig):
        super().__init__()
        self.pos_conv = nn.Sequential(WeightNormConv1d(cfg.encoder_embed_dim, cfg.conv_pos, cfg.conv_pos_groups))
        self.trim = 1 if cfg.conv_pos % 2 == 0 else 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, D] -> [B, T, D]"""
        y = self.pos_conv(x.transpose(1, 2))
        if self.trim:
            y = y[:, :, :-self.trim]
        return F.gelu(y).transpose(1, 2)


class SelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x)))
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class TransformerLayer(nn.Module):
    def __init__(self, cfg: W2VConfig):
        super().__init__()
        d = cfg.encoder_embed_dim
        self.layer_norm_first = cfg.layer_norm_first
        self.self_attn = SelfAttention(d, cfg.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, cfg.encoder_ffn_embed_dim)
        self.fc2 = nn.Linear(cfg.encoder_ffn_embed_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_norm_first:
            x = x + self.self_attn(self.self_attn_layer_norm(x))
            return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))
        x = self.self_attn_layer_norm(x + self.self_attn(x))
        return self.final_layer_norm(x + self.fc2(F.gelu(self.fc1(x))))


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: W2VConfig):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.encoder_layers))
        self.layer_norm = nn.LayerNorm(cfg.encoder_embed_dim)


class GumbelCodebook(nn.Module):
    """Pretraining quantizer parameters (`quantizer.vars`, `quantizer.weight_proj`); never run here."""

    def __init__(self, cfg: W2VConfig):
        super().__init__()
        if cfg.vq_dim % cfg.latent_groups:
            raise ValueError(f"vq dim {cfg.vq_dim} must be divisible by latent_groups {cfg.latent_groups}")
        self.vars = nn.Parameter(torch.rand(1, cfg.latent_groups * cfg.latent_vars, cfg.vq_dim // cfg.latent_groups))
        self.weight_proj = nn.Linear(cfg.conv_dim, cfg.latent_groups * cfg.latent_vars)


class Wav2Vec2ECG(nn.Module):
    """The fairseq-signals `wav2vec2_cmsc` model; `layer_outputs` gives every transformer layer's tokens."""

    def __init__(self, cfg: W2VConfig = FULL):
        super().__init__()
        self.cfg = cfg
        d = cfg.encoder_embed_dim
        if cfg.apply_mask:
            self.mask_emb = nn.Parameter(torch.rand(d))
        self.feature_extractor = ConvFeatureExtractor(cfg)
        self.post_extract_proj = nn.Linear(cfg.conv_dim, d) if cfg.conv_dim != d else None
        self.conv_pos = ConvPositionalEncoding(cfg)
        self.layer_norm = nn.LayerNorm(cfg.conv_dim)
        self.encoder = TransformerEncoder(cfg)
        if cfg.quantize_targets:
            self.quantizer = GumbelCodebook(cfg)
            self.project_q = nn.Linear(cfg.vq_dim, cfg.proj_dim)
        else:
            self.project_q = nn.Linear(cfg.conv_dim, cfg.proj_dim)
        self.final_proj = nn.Linear(d, cfg.proj_dim)

    def layer_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[B, in_d, T] -> per transformer layer, its output tokens [B, T', D] (no masking: inference)."""
        feats = self.layer_norm(self.feature_extractor(x).transpose(1, 2))
        if self.post_extract_proj is not None:
            feats = self.post_extract_proj(feats)
        h = feats + self.conv_pos(feats)
        if not self.cfg.layer_norm_first:
            h = self.encoder.layer_norm(h)
        out = []
        for layer in self.encoder.layers:
            h = layer(h)
            out.append(h)
        return out


# ---------------------------------------------------------------- checkpoint + input helpers

_LEGACY_G, _LEGACY_V = ".weight_g", ".weight_v"
_PARAM_G, _PARAM_V = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


def to_legacy_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Newer torch `parametrizations.weight.original0/1` keys -> the published `weight_g/weight_v` names."""
    out = {}
    for k, v in state.items():
        if k.endswith(_PARAM_G):
            k = k[: -len(_PARAM_G)] + _LEGACY_G
        elif k.endswith(_PARAM_V):
            k = k[: -len(_PARAM_V)] + _LEGACY_V
        out[k] = v
    return out


def to_parametrized_weight_norm(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Legacy `weight_g/weight_v` keys -> `parametrizations.weight.original0/1` (what current torch modules use)."""
    out = {}
    for k, v in state.items():
        if k.endswith(_LEGACY_G):
            k = k[: -len(_LEGACY_G)] + _PARAM_G
        elif k.endswith(_LEGACY_V):
            k = k[: -len(_LEGACY_V)] + _PARAM_V
        out[k] = v
    return out


def require_tensors(state: Mapping[str, object], source: str) -> dict[str, torch.Tensor]:
    bad = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if bad:
        raise CheckpointError(f"{source}: entries are not tensors: {bad[:8]}")
    return dict(state)  # type: ignore[arg-type]


# The ECG-FM model a state dict comes from, told by its keys (fairseq-signals module layout).
VARIANT_PRETRAINED = "pretrained"  # wav2vec2 / wav2vec2_cmsc with its pretraining heads (the audited encoder)
VARIANT_CLASSIFIER = "classifier"  # ecg_transformer_classifier: encoder under `encoder.`, a `proj` head
VARIANT_ENCODER_ONLY = "encoder_only"  # ecg_transformer: the encoder without pretraining heads
VARIANT_UNKNOWN = "unknown"


def ecg_fm_variant(keys: object, prefix: str = "") -> str:
    """Which fairseq-signals ECG-FM model the keys under `prefix` belong to.

    pretrained: `feature_extractor.*` at the top with `final_proj.*` (ECG-FM's
    mimic_iv_ecg_physionet_pretrained.pt); classifier: `encoder.feature_extractor.*` and `proj.*`
    (ecg_transformer_classifier, e.g. mimic_iv_ecg_finetuned.pt, whose `encoder` is an ecg_transformer);
    encoder_only: `feature_extractor.*` without the pretraining heads (a bare ecg_transformer)."""
    rel = {k[len(prefix):] for k in keys if isinstance(k, str) and k.startswith(prefix)}  # type: ignore[union-attr]
    if any(k.startswith("encoder.feature_extractor.") for k in rel) or any(k.startswith("proj.") for k in rel):
        return VARIANT_CLASSIFIER
    if any(k.startswith("feature_extractor.") for k in rel):
        return VARIANT_PRETRAINED if any(k.startswith("final_proj.") for k in rel) else VARIANT_ENCODER_ONLY
    return VARIANT_UNKNOWN


def check_batch(x: torch.Tensor, shape: tuple[int, ...], model: str, profile: str) -> None:
    """x must be [B, *shape]; the message names the model, the profile and the fix."""
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise ValueError(f"{model} ({profile} profile) expects native inputs [B, {', '.join(map(str, shape))}] "
                         f"from its preprocess(), got {list(x.shape)}")


def fft_resample_to(x: np.ndarray, n: int) -> np.ndarray:
    """Resample the whole record to exactly n samples (`scipy.signal.resample`, FFT), whatever its duration.

    This is what the published protocol's adapters did (its 10-s records: n / 10 Hz); kept separate from
    the polyphase `preprocess.resample` so the `published` profile reproduces that code.
    """
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] == n:
        return x
    return sps.resample(x, n, axis=-1).astype(np.float32)


def linear_resample(x: np.ndarray, fs_in: float, fs_out: float) -> np.ndarray:
    """fairseq-signals' ECG resampling (scripts/preprocess/ecg/preprocess.py `resample`): int(T * (fs_out / fs_in))
    samples - truncated, not rounded - by linear interpolation, the first and last samples kept in place (the
    original grid is stretched over the new one). float64 in and out, as upstream computes it."""
    x = np.asarray(x, dtype=np.float64)
    if fs_in == fs_out:
        return x
    t = x.shape[-1]
    n = int(t * (fs_out / fs_in))  # upstream's expression, operand order included
    src = np.linspace(0, n - 1, t)
    dst = np.arange(n)
    flat = x.reshape(-1, t)
    return np.stack([np.interp(dst, src, row) for row in flat]).reshape(*x.shape[:-1], n)


def standardize_leads(x: np.ndarray) -> np.ndarray:
    """fairseq-signals' per-lead standardization (preprocess.py `preprocess_mat` + `lead_std_divide` with its
    default constant_lead_strategy='zero'): subtract each lead's mean, divide by its std; a lead whose std
    is exactly 0 becomes 0. float64, no epsilon (a near-constant lead is divided by its tiny std, as upstream)."""
    x = np.asarray(x, dtype=np.float64)
    x = x - x.mean(axis=-1, keepdims=True)
    std = x.std(axis=-1, keepdims=True)
    zero = std == 0
    out = x / np.where(zero, 1.0, std)
    return np.where(zero, 0.0, out) if zero.any() else out


def nonzero_mean(h: torch.Tensor) -> torch.Tensor:
    """[B, T, D] -> [B, D]: fairseq-signals' pooling of encoder tokens, `x.sum(dim=1) / (x != 0).sum(dim=1)` -
    each feature summed over tokens and divided by the number of tokens where it is non-zero (padded tokens
    are zeroed upstream, so this is the mean over real tokens). ECG-FM's scripts/embs.py and CARDIAC-FM's
    MMCL.forward_ecg both pool this way. On unpadded inputs no post-LayerNorm output is exactly 0, so this
    equals the plain mean up to rounding. A feature that is 0 in every token gives 0 here (upstream: 0/0 = NaN)."""
    return torch.div(h.sum(dim=1), (h != 0).sum(dim=1).clamp(min=1))


def pool_tokens(h: torch.Tensor, profile: str) -> torch.Tensor:
    """native: upstream's `nonzero_mean`; published: the protocol's plain token mean (its
    scripts/build_probe_features.py: `values.mean(axis=1, dtype=np.float32)`)."""
    return h.mean(dim=1) if profile == "published" else nonzero_mean(h)


def scale_minus1_1(x: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Per-lead min-max scaling to [-1, 1] (HuBERT-ECG's upstream `scaling`)."""
    lo = x.min(axis=-1, keepdims=True)
    hi = x.max(axis=-1, keepdims=True)
    return (2.0 * (x - lo) / (hi - lo + eps) - 1.0).astype(np.float32)
