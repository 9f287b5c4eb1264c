"""The wav2vec 2.0 backbone's configuration: `W2VConfig`, read from a fairseq-signals checkpoint's `cfg['model']`
(the conv feature extractor spec parsed as a literal, never evaluated), and the FULL (published ECG-FM) and
DEMO sizes."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, fields

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
