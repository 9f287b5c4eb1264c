"""The wav2vec 2.0 ECG backbone shared by ECG-FM and CARDIAC-FM (fairseq-signals `wav2vec2_cmsc`).

Our own module; parameter names are the fairseq-signals state-dict keys, so the published checkpoints load
strictly. Architecture (ECG-FM, 90.9M parameters): a conv feature extractor on the 12 leads (4 blocks of
256 channels, kernel 2, stride 2; a per-channel GroupNorm in the first block), LayerNorm over the 256 conv
features, a 256 -> 768 projection, a grouped conv positional embedding (kernel 128, 16 groups, weight norm
over the kernel axis, GELU) added to the tokens, then a post-LN transformer (768 wide, 12 layers, 12 heads,
FFN 3,072, exact GELU) whose input is layer-normed first. The pretraining heads (mask embedding, Gumbel
codebook, `project_q`, `final_proj`) are in the checkpoint, so they exist here to be loaded, but the
audited states never use them.

The configuration (fairseq `cfg['model']` parsing, the FULL and DEMO sizes) is in `wav2vec2_config`, the
checkpoint state-dict helpers in `wav2vec2_state`, the input and pooling helpers in `wav2vec2_io`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from raybench.encoders.models.wav2vec2_config import FULL, W2VConfig

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
