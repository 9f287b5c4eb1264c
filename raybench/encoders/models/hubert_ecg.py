"""HuBERT-ECG (Edoar-do): a plain `transformers.HubertModel` over the 12 leads flattened into one sequence.

The model is transformers' own `HubertModel`/`HubertConfig` (upstream's `HuBERTECG` subclasses it and adds only
pretraining heads). Base size: 768 wide, 12 post-LN layers, 12 heads, FFN 3,072, a 5-block conv front end
(512 channels; kernels 10,3,3,2,2; strides 4,2,2,2,2 - the 100-Hz variant, 6,000 samples -> 93 tokens).

Checkpoints, two formats:
  * a HuggingFace folder, `config.json` + `model.safetensors` (or `pytorch_model.bin`, read with weights_only;
    or a sharded safetensors index). The config builds the model (no remote code is run). If it is a
    `hubert_ecg` config with `vocab_sizes`, the checkpoint may carry upstream's pretraining heads `final_proj.{i}`
    and `label_embedding.{i}`: they load strictly into a separate module the audited states never use.
  * a training checkpoint `.pt` as upstream's `code/pretrain.py` / `finetune.py` save it: a dict with the pickled
    `model_config` (a `hubert_ecg.HuBERTECGConfig`, or a `transformers` `HubertConfig` in older files) and
    `model_state_dict` (plus optimizer / scheduler states, ignored). It is read with `torch.load(weights_only=True)`
    and an allow-list of exactly those two config classes, each rebuilt as an inert attribute bag (no upstream
    or transformers code runs); any other object in the file is refused by name. A fine-tuned file
    (`HuBERTForECGClassification`: keys under `hubert_ecg.`) loads its backbone; its classifier (`classifier.*`,
    `label_embedding.weight`) is dropped by name, everything else must match.

Preprocessing profiles:
  native     upstream `code/utils.py::ecg_preprocessing` + `code/dataset.py::ECGDataset` (encode mode): band-pass
             0.05-47 Hz at the source rate with biosppy's FIR (`int(0.3 fs)` taps made odd, Hamming firwin,
             filtfilt; no clipping: at 94 Hz or below the band's upper edge reaches Nyquist and upstream cannot run, so
             such records are quarantined `rate_unsupported`; at 100 Hz the 47-Hz edge is kept as upstream keeps
             it), FFT resampling to `int(T * (500 / fs))` samples (upstream's expression, truncation included),
             per-lead min-max scaling to [-1, 1] over the record (`smooth` 1e-8), the first 5 s (2,500 samples;
             a shorter record is zero-padded at the end, with a note), leads flattened lead after lead (30,000),
             `scipy.signal.decimate` by 5 on the flattened sequence -> 6,000 samples, 100 Hz. float64 throughout,
             float32 at the end (upstream's `.float()`).
  published  the protocol's adapter (`benchmark_v1/adapters/hubert_ecg.py:64-75` of the published code): leads in
             the standard order, the record FFT-resampled to 2,500 samples (`scipy.signal.resample`, float32),
             per-lead z-score (std floor 1e-6), flattened -> 30,000 samples (line 15: HUBERT_ECG_TARGET_SAMPLES =
             2500; line 83: 12 x 2,500); no band-pass, no decimation: the model gets a 30,000-sample sequence
             although it was trained on 6,000. The published code z-scored the `.mat` ADC counts; z-scoring makes
             that identical to millivolts.

Audited states: `hidden_states[i + 1]` (the output of layer i) for i = 0..11, mean over tokens: the token mean
upstream's classifier pools (`hubert_ecg_classification.py`, no attention mask) and the published protocol took
of each layer (`scripts/extract_hubert_ecg_activations.py` saves `hidden_states[layer + 1]`,
`scripts/build_probe_features.py:112-113` averages it over tokens).
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
    load_failure,
    load_state_dict_strict,
    load_torch_checkpoint,
    register_encoder,
)
from raybench.encoders.models.wav2vec2_io import check_batch
from raybench.encoders.models.wav2vec2_state import require_tensors, to_parametrized_weight_norm
from raybench.encoders.preprocess import crop_or_pad_start, decimate, fir_bandpass, note, note_resample, zscore_leads

FS = 500
DECIMATE = 5  # 500 Hz -> 100 Hz
NATIVE_SECONDS_SAMPLES = 2500  # 5 s at 500 Hz
NATIVE_SAMPLES = 12 * NATIVE_SECONDS_SAMPLES // DECIMATE  # 6,000
PUBLISHED_PER_LEAD = 2500
PUBLISHED_SAMPLES = 12 * PUBLISHED_PER_LEAD  # 30,000
BAND = (0.05, 47.0)
FIR_ORDER_PER_HZ = 0.3  # upstream utils.apply_filter: order = int(0.3 * fs)
SCALING_SMOOTH = 1e-8  # upstream utils.scaling
HEAD_PREFIXES = ("final_proj.", "label_embedding.")
MODEL_TYPES = ("hubert", "hubert_ecg")
# Training checkpoints: the config classes upstream pickles (module path as pickled; allow-listed, nothing else)
TRAINING_CONFIG_GLOBALS = ("hubert_ecg.HuBERTECGConfig", "transformers.models.hubert.configuration_hubert.HubertConfig")
FINETUNED_PREFIX = "hubert_ecg."  # HuBERTForECGClassification.hubert_ecg
FINETUNED_HEAD_PREFIXES = ("classifier.", "label_embedding.weight")  # its classification head, dropped by name
HEAD_CONFIG_KEYS = ("vocab_sizes", "ensemble_length")
# The base size's HubertModel (the audited backbone), counted on upstream code/pretrain.py (largeness "base",
# downsampling_factor 5); one 100-cluster pretraining head (code/pretraining.sh vocab_sizes="100") adds 222,464.
PUBLISHED_BACKBONE_PARAMS = 92_798_848
PUBLISHED_PARAMS_SOURCE = ("HuBERT-ECG BASE backbone, counted on upstream code/pretrain.py (largeness base, "
                           "downsampling_factor 5; 93,021,312 with one 100-cluster pretraining head)")

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
    revision = "hubert-parity-1"  # preprocessing/pooling rule version (FIR band-pass): older stores are redone

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
        if self.profile == "published":
            return published_preprocess(signal)
        return native_preprocess(signal, fs)

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        check_batch(x, (self.input_samples,), "HuBERT-ECG", self.profile)
        out = self.hubert(x.float(), output_hidden_states=True, return_dict=True)
        return torch.stack([h.mean(dim=1) for h in out.hidden_states[1:]])


def native_preprocess(signal: np.ndarray, fs: float) -> np.ndarray:
    """[12, T] at fs -> [6,000] float32: upstream ecg_preprocessing (filter -> resample -> scale), then ECGDataset
    (first 2,500 samples, flatten, decimate by 5)."""
    x = fir_bandpass(np.asarray(signal, dtype=np.float64), float(fs), *BAND, order_per_hz=FIR_ORDER_PER_HZ)
    n = int(x.shape[-1] * (FS / fs))  # upstream: int(ecg_signal.shape[-1] * (500/original_frequency))
    if n != x.shape[-1]:
        note_resample(fs, FS)
        x = sps.resample(x, n, axis=1)
    lo, hi = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    x = 2 * (x - lo) / (hi - lo + SCALING_SMOOTH) - 1
    flat = np.ascontiguousarray(crop_or_pad_start(x, NATIVE_SECONDS_SAMPLES)).reshape(-1)
    return decimate(flat, DECIMATE).astype(np.float32)


def published_preprocess(signal: np.ndarray) -> np.ndarray:
    """[12, T] -> [30,000] float32 as the published adapter: FFT-resample to 2,500, per-lead z-score, flatten."""
    x = np.asarray(signal, dtype=np.float32)  # the published loader's float32 `val` array
    if x.shape[-1] != PUBLISHED_PER_LEAD:  # adapters/hubert_ecg.py:70-71, whatever the record's rate or duration
        note(f"resampled the whole record {x.shape[-1]} -> {PUBLISHED_PER_LEAD} samples (published protocol)")
        x = sps.resample(x, PUBLISHED_PER_LEAD, axis=1).astype(np.float32)
    return zscore_leads(x).reshape(-1)  # lines 72-75: per-lead mean / max(std, 1e-6), flattened lead after lead


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


class _PickledConfig:
    """Inert stand-in for a pickled upstream config: unpickling only fills its `__dict__`, no other code runs."""


def _hubert_config(raw: Mapping[str, object], source: str) -> HubertConfig:
    """A config mapping -> HubertConfig with the HubertConfig options (+ the pretraining-head options) only."""
    known = set(HubertConfig().to_dict()) | set(HEAD_CONFIG_KEYS)
    kept = {k: v for k, v in raw.items() if k in known and not k.startswith("_")}
    try:
        return HubertConfig.from_dict(kept)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{source}: unusable model_config: {err}") from err


def read_training_checkpoint(path: str | Path) -> tuple[HubertConfig, dict[str, torch.Tensor]]:
    """Upstream training `.pt` -> (config, state dict of the HuBERTECG model, heads included if pretraining).

    weights_only=True with exactly `TRAINING_CONFIG_GLOBALS` allowed, each rebuilt as `_PickledConfig`. A
    fine-tuned file's backbone keys lose their `hubert_ecg.` prefix and its classification head is dropped (by
    name); its config then builds no pretraining heads (the classifier model deleted them).
    """
    config, state, _, _ = _read_training(path)
    return config, state


def _read_training(path: str | Path) -> tuple[HubertConfig, dict[str, torch.Tensor], list[str], str]:
    """read_training_checkpoint + (the keys dropped by name, which model the file holds)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} not found; pass the HuggingFace folder or the training .pt")
    allowed = [(_PickledConfig, name) for name in TRAINING_CONFIG_GLOBALS]
    try:
        with torch.serialization.safe_globals(allowed):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        try:
            others = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) -
                            set(TRAINING_CONFIG_GLOBALS))
        except Exception:
            others = []
        what = f"it holds objects outside the allow-list: {others}" if others else load_failure(Path(path), err)
        raise CheckpointError(f"{path}: not a HuBERT-ECG training checkpoint that loads safely "
                              f"(weights_only=True, allowed {list(TRAINING_CONFIG_GLOBALS)}); {what}") from err
    if not isinstance(obj, Mapping) or "model_state_dict" not in obj or "model_config" not in obj:
        keys = sorted(map(str, obj))[:8] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(f"{path}: expected upstream's training checkpoint (a dict with 'model_config' and "
                              f"'model_state_dict'), found {keys}")
    cfg = obj["model_config"]
    raw = vars(cfg) if isinstance(cfg, _PickledConfig) else cfg
    if not isinstance(raw, Mapping):
        raise CheckpointError(f"{path}: model_config is a {type(cfg).__name__}, expected a HuBERT config")
    raw = dict(raw)
    state = obj["model_state_dict"]
    if not isinstance(state, Mapping):
        raise CheckpointError(f"{path}: model_state_dict is a {type(state).__name__}, expected a state dict")
    state = require_tensors(state, str(path))
    dropped: list[str] = []
    kind = "training .pt: HuBERTECG (pretraining; model_config pickled)"
    if state and all(k.startswith(FINETUNED_PREFIX) or k.startswith(FINETUNED_HEAD_PREFIXES) for k in state) \
            and any(k.startswith(FINETUNED_PREFIX) for k in state):
        dropped = sorted(k for k in state if not k.startswith(FINETUNED_PREFIX))
        state = {k[len(FINETUNED_PREFIX):]: v for k, v in state.items() if k.startswith(FINETUNED_PREFIX)}
        for key in HEAD_CONFIG_KEYS:
            raw.pop(key, None)
        kind = "training .pt: HuBERTForECGClassification (fine-tuned; backbone loaded, classifier dropped)"
    elif "vocab_sizes" not in raw and any(k.startswith(HEAD_PREFIXES) for k in state):
        # an older file pickled a plain HubertConfig; upstream (test.py, pretrain.py) then rebuilds a HuBERTECGConfig
        # with the vocabulary sizes of the run: here they are read off the label embeddings' shapes
        sizes, i = [], 0
        while f"label_embedding.{i}.weight" in state:
            sizes.append(int(state[f"label_embedding.{i}.weight"].shape[0]))
            i += 1
        raw |= {"vocab_sizes": sizes, "ensemble_length": len(sizes)}
    return _hubert_config(raw, str(path)), state, dropped, kind


def read_folder(folder: Path) -> tuple[HubertConfig, dict[str, torch.Tensor]]:
    """HuggingFace folder -> (config from config.json, weights)."""
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder}: not a HuggingFace model folder (no config.json); HuBERT-ECG checkpoints "
                              "are folders holding config.json + model.safetensors, or upstream's training .pt")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{cfg_path}: invalid JSON: {err}") from err
    if raw.get("model_type") not in MODEL_TYPES:
        raise CheckpointError(f"{cfg_path}: model_type {raw.get('model_type')!r} is not one of {MODEL_TYPES}")
    return HubertConfig.from_dict(raw), read_weights(folder)


def read_checkpoint(path: str | Path) -> tuple[HubertConfig, dict[str, torch.Tensor]]:
    """Either format -> (config, state dict with upstream HuBERTECG names, weight norm as current torch names)."""
    path = Path(path)
    config, state = read_folder(path) if path.is_dir() else read_training_checkpoint(path)
    return config, to_parametrized_weight_norm(state)


def inspect_checkpoint(path: str, size: str = "full") -> dict:
    """What loading `path` would do, without failing on a key mismatch: model, file, variant (format), the
    architecture its config describes, loaded / missing / extra keys, the keys dropped by name, parameter
    counts (loaded, model, backbone) and the base size's count. `size` is unused (the file's config defines the
    model); accepted so every adapter's inspect takes the same arguments. Unreadable files raise CheckpointError."""
    from raybench.encoders.base import key_report

    p = Path(path)
    if p.is_dir():
        config, state = read_folder(p)
        dropped, variant = [], f"HuggingFace folder (config.json model_type {getattr(config, 'model_type', '?')!r})"
    else:
        config, state, dropped, variant = _read_training(p)
    state = to_parametrized_weight_norm(state)
    with torch.device("meta"):
        model = HuBERTECGEncoder(config)
    expected = dict(model.hubert.state_dict())
    if model.heads is not None:
        expected |= model.heads.state_dict()
    report = key_report(expected, state)
    backbone = set(model.hubert.state_dict())
    vocab = getattr(config, "vocab_sizes", None)
    return {"model": "hubert_ecg", "file": str(path), "variant": variant,
            "architecture": f"{config.num_hidden_layers} layers x {config.hidden_size}, {config.num_attention_heads} "
                            f"heads, conv kernels {list(config.conv_kernel)} strides {list(config.conv_stride)}"
                            + (f", pretraining heads for vocab_sizes {list(vocab)}" if vocab else "")
                            + " (from the checkpoint's config)",
            **report, "n_params_backbone": int(sum(state[k].numel() for k in report["loaded"] if k in backbone)),
            "dropped": {"finetuning_head": dropped} if dropped else {},
            "published_params": PUBLISHED_BACKBONE_PARAMS,
            "published_params_source": PUBLISHED_PARAMS_SOURCE}


def load_pretrained(path: str | Path) -> HuBERTECGEncoder:
    """HuggingFace folder or training `.pt` -> encoder; the config defines the model, every weight key must match."""
    config, state = read_checkpoint(path)
    return from_state(config, state, str(path))


def from_state(config: HubertConfig, state: Mapping[str, torch.Tensor], source: str) -> HuBERTECGEncoder:
    """Build from a config and a state dict with upstream HuBERTECG names (body + optional pretraining heads)."""
    model = HuBERTECGEncoder(config)
    heads = {k: v for k, v in state.items() if k.startswith(HEAD_PREFIXES)}
    body = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
    if heads and model.heads is None:
        raise CheckpointError(f"{source}: unexpected pretraining-head keys {sorted(heads)[:8]} while the config "
                              "declares no vocab_sizes; the config and the weights do not belong together")
    load_state_dict_strict(model.hubert, body, source)
    if model.heads is not None:
        load_state_dict_strict(model.heads, heads, source)
    return model


@register_encoder("hubert_ecg")
def build(spec: EncoderSpec) -> HuBERTECGEncoder:
    model = load_pretrained(spec.checkpoint) if spec.checkpoint else HuBERTECGEncoder(make_config(spec.size))
    model.profile = spec.profile
    return model
