"""HuBERT-ECG (Edoar-do): a plain `transformers.HubertModel` over the 12 leads flattened into one sequence.

The model is transformers' own `HubertModel`/`HubertConfig` (upstream's `HuBERTECG` subclasses it and adds only
pretraining heads). Base size: 768 wide, 12 post-LN layers, 12 heads, FFN 3,072, a 5-block conv front end
(512 channels; kernels 10,3,3,2,2; strides 4,2,2,2,2 - the 100-Hz variant, 6,000 samples -> 93 tokens).

Checkpoint: a HuggingFace folder, `config.json` + `model.safetensors` (or `pytorch_model.bin`, read with
weights_only; or a sharded safetensors index). The config builds the model (no remote code is run). If it is a
`hubert_ecg` config with `vocab_sizes`, the checkpoint may carry upstream's pretraining heads `final_proj.{i}`
and `label_embedding.{i}`: they load strictly into a separate module the audited states never use.

Preprocessing profiles:
  native     upstream: band-pass 0.05-47 Hz at the source rate (a zero-phase Butterworth here; upstream uses a
             FIR of order 0.3 fs), 500 Hz (FFT resampling, as upstream), per-lead min-max scaling to [-1, 1]
             over the record, the first 5 s (2,500 samples), leads flattened lead after lead (30,000),
             `scipy.signal.decimate` by 5 on the flattened sequence (as upstream does) -> 6,000 samples, 100 Hz.
  published  the protocol's adapter: the record FFT-resampled to 2,500 samples (10 s at 250 Hz), per-lead
             z-score, flattened -> 30,000 samples; no band-pass.

Audited states: `hidden_states[i + 1]` (the output of layer i) for i = 0..11, mean over tokens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from scipy import signal as sps
from torch import nn
from transformers import HubertConfig, HubertModel

from raybench.encoders.base import (
    CheckpointError,
    ECGEncoder,
    EncoderSpec,
    load_state_dict_strict,
    load_torch_checkpoint,
    register_encoder,
)
from raybench.encoders.models._wav2vec2 import (
    check_batch,
    fft_resample_to,
    require_tensors,
    scale_minus1_1,
    to_parametrized_weight_norm,
)
from raybench.encoders.preprocess import bandpass, crop_or_pad_start, zscore_leads

FS = 500
DECIMATE = 5  # 500 Hz -> 100 Hz
NATIVE_SECONDS_SAMPLES = 2500  # 5 s at 500 Hz
NATIVE_SAMPLES = 12 * NATIVE_SECONDS_SAMPLES // DECIMATE  # 6,000
PUBLISHED_PER_LEAD = 2500
PUBLISHED_SAMPLES = 12 * PUBLISHED_PER_LEAD  # 30,000
BAND = (0.05, 47.0)
HEAD_PREFIXES = ("final_proj.", "label_embedding.")
MODEL_TYPES = ("hubert", "hubert_ecg")

_FRONT_END = dict(conv_kernel=(10, 3, 3, 2, 2), conv_stride=(4, 2, 2, 2, 2))
FULL = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
            conv_dim=(512,) * 5, classifier_proj_size=256, **_FRONT_END)
# Demo: d=64 like every demo encoder, 6 layers, 32-channel front end, a small positional conv.
DEMO = dict(hidden_size=64, num_hidden_layers=6, num_attention_heads=4, intermediate_size=128,
            conv_dim=(32,) * 5, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
            classifier_proj_size=16, **_FRONT_END)


class PretrainingHeads(nn.Module):
    """Upstream HuBERTECG's cluster-prediction heads (kept only so checkpoints that carry them load strictly)."""

    def __init__(self, hidden: int, proj: int, vocab_sizes: list[int]):
        super().__init__()
        self.final_proj = nn.ModuleList(nn.Linear(hidden, proj) for _ in vocab_sizes)
        self.label_embedding = nn.ModuleList(nn.Embedding(v, proj) for v in vocab_sizes)


class HuBERTECGEncoder(ECGEncoder):
    name = "hubert_ecg"
    n_layers = 12
    d = 768

    def __init__(self, config: HubertConfig):
        super().__init__()
        self.hubert = HubertModel(config).float()
        vocab = getattr(config, "vocab_sizes", None)
        self.heads = PretrainingHeads(config.hidden_size, config.classifier_proj_size, list(vocab)) if vocab else None
        self.n_layers = config.num_hidden_layers
        self.d = config.hidden_size
        self.eval()  # training mode would apply layerdrop and SpecAugment masking; build_encoder also freezes

    @property
    def input_samples(self) -> int:
        return PUBLISHED_SAMPLES if self.profile == "published" else NATIVE_SAMPLES

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        x = np.asarray(signal, dtype=np.float32)
        if self.profile == "published":
            return zscore_leads(fft_resample_to(x, PUBLISHED_PER_LEAD)).reshape(-1)
        x = scale_minus1_1(fft_resample_to(bandpass(x, fs, *BAND), int(x.shape[-1] * FS / fs)))
        flat = np.ascontiguousarray(crop_or_pad_start(x, NATIVE_SECONDS_SAMPLES)).reshape(-1)
        return sps.decimate(flat, DECIMATE).astype(np.float32)

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        check_batch(x, (self.input_samples,), "HuBERT-ECG", self.profile)
        out = self.hubert(x.float(), output_hidden_states=True, return_dict=True)
        return torch.stack([h.mean(dim=1) for h in out.hidden_states[1:]])


def make_config(size: str) -> HubertConfig:
    return HubertConfig(**(FULL if size == "full" else DEMO))


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors | model.safetensors.index.json (shards) | pytorch_model.bin (weights_only)."""
    from safetensors.torch import load_file

    single, index, binary = folder / "model.safetensors", folder / "model.safetensors.index.json", \
        folder / "pytorch_model.bin"
    if single.exists():
        return load_file(str(single))
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(folder / Path(shard).name)))
        return state
    if binary.exists():
        obj = load_torch_checkpoint(binary)
        if not isinstance(obj, Mapping):
            raise CheckpointError(f"{binary}: expected a state dict, found {type(obj).__name__}")
        return require_tensors(obj, str(binary))
    raise CheckpointError(f"{folder}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin; "
                          "pass the HuggingFace folder of the HuBERT-ECG checkpoint")


def load_pretrained(folder: str | Path) -> HuBERTECGEncoder:
    """HuggingFace folder -> encoder; config.json defines the model, every weight key must match."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder}: not a HuggingFace model folder (no config.json); HuBERT-ECG checkpoints "
                              "are folders holding config.json + model.safetensors")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_path}: invalid JSON: {err}") from err
    if raw.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"{cfg_path}: model_type {raw.get('model_type')!r} is not one of {MODEL_TYPES}")
    model = HuBERTECGEncoder(HubertConfig.from_dict(raw))
    state = to_parametrized_weight_norm(read_weights(folder))
    heads = {k: v for k, v in state.items() if k.startswith(HEAD_PREFIXES)}
    body = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
    if heads and model.heads is None:
        raise CheckpointError(f"{folder}: unexpected pretraining-head keys {sorted(heads)[:8]} while config.json "
                              "declares no vocab_sizes; the config and the weights do not belong together")
    load_state_dict_strict(model.hubert, body, str(folder))
    if model.heads is not None:
        load_state_dict_strict(model.heads, heads, str(folder))
    return model


@register_encoder("hubert_ecg")
def build(spec: EncoderSpec) -> HuBERTECGEncoder:
    model = load_pretrained(spec.checkpoint) if spec.checkpoint else HuBERTECGEncoder(make_config(spec.size))
    model.profile = spec.profile
    return model
