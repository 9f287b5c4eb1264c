"""ECG-FM (bowang-lab): the fairseq-signals wav2vec 2.0 + CMSC + RLM model, 12 post-LN layers of 768.

Checkpoint: the fairseq dict `{'cfg': {...}, 'model': state_dict, ...}` of `mimic_iv_ecg_physionet_pretrained.pt`
(model `wav2vec2_cmsc`). `cfg` may be a plain dict or an omegaconf DictConfig, `args` an argparse Namespace,
the optimizer history may hold numpy scalars: the file is read with `torch.load(weights_only=True)` and an
allow-list of exactly those globals (`fairseq_checkpoint.load_fairseq_checkpoint`), never a full unpickle. The
architecture is read from `cfg['model']` (or the legacy `args`), so the loaded model is exactly the one the
file describes; `spec.size` only picks the seeded-init architecture when no checkpoint is given.
`inspect_checkpoint(path)` reports what would load (for `raybench checkpoint inspect`).

Preprocessing profiles (parity with the upstream code: tests/parity/test_parity_ecg_fm.py):
  native     fairseq-signals' ECG pipeline (scripts/preprocess/ecg/preprocess.py, the one ECG-FM's data
             went through): resample to 500 Hz by linear interpolation to int(T * 500 / fs) samples
             (`resample`), subtract each lead's mean and divide by its std over the whole record, a lead
             with std 0 set to 0 (`preprocess_mat`, `lead_std_divide`, constant_lead_strategy='zero'), all in
             float64; then non-overlapping 5-s segments (`segment_mat`). One record maps to its FIRST segment
             (the first 2,500 samples); later segments are not used. Upstream makes no segment from a record
             shorter than 5 s; raybench zero-pads it at the end (and notes it). Shape [12, 2500], float32 (the
             dataset's `feats.float()`).
  published  what the protocol's adapter did (benchmark_v1/adapters/ecg_fm.py:59-69 at commit
             de4e19d9, `load_12lead_waveform`): the record, whatever its rate, FFT-resampled to 5,000 samples
             (`scipy.signal.resample`, float32) when it is not 5,000 long already, then per-lead z-score in
             float32 with the std floored at 1e-6; the model sees those 10 s (twice its 5-s training window).
             Shape [12, 5000].

Audited states: the output of each transformer layer (after its final LayerNorm: the tensor the
published adapter hooked, benchmark_v1/adapters/ecg_fm.py:132-140), pooled over tokens per profile:
  native     fairseq-signals' rule `x.sum(dim=1) / (x != 0).sum(dim=1)` (ECG-FM scripts/embs.py:20, taken
             from models/classification/ecg_transformer_classifier.py): per feature, the mean over the
             tokens where it is non-zero.
  published  the plain token mean, `values.mean(axis=1, dtype=np.float32)` (scripts/build_probe_features.py:113,
             which built the SAE inputs of benchmark_v1/multiscale_sae.py:109).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from raybench.encoders.base import (
    CheckpointError,
    ECGEncoder,
    EncoderSpec,
    key_report,
    load_state_dict_strict,
    register_encoder,
)
from raybench.encoders.models.fairseq_checkpoint import load_fairseq_checkpoint, model_config
from raybench.encoders.models.wav2vec2 import Wav2Vec2ECG
from raybench.encoders.models.wav2vec2_config import DEMO, FULL, W2VConfig
from raybench.encoders.models.wav2vec2_io import (
    check_batch,
    fft_resample_to,
    linear_resample,
    pool_tokens,
    standardize_leads,
)
from raybench.encoders.models.wav2vec2_state import ecg_fm_variant, require_tensors, to_legacy_weight_norm
from raybench.encoders.preprocess import crop_or_pad_start, note, note_resample, zscore_leads

FS = 500
SEGMENT = 2500  # 5 s at 500 Hz: one fairseq-signals segment
PUBLISHED_SAMPLES = 5000  # the protocol fed the whole 10-s record
MODEL_NAMES = ("wav2vec2_cmsc", "wav2vec2")
PUBLISHED_PARAMS = 90.9e6  # ECG-FM README: "ECG-FM has 90.9 million parameters"
# Bumped when preprocessing or pooling changes, so activations stored under the old rule are not reused.
REVISION = "w2v-parity-1"


def preprocess_w2v(signal: np.ndarray, fs: float, profile: str, native_samples: int) -> np.ndarray:
    """Shared by ECG-FM and CARDIAC-FM. native: fairseq-signals' pipeline (linear-interpolation resampling
    to 500 Hz, per-lead standardization over the whole record, float64), then the first `native_samples`;
    published: the protocol's FFT resampling of the record to 5,000 samples + per-lead z-score (float32)."""
    if profile == "published":
        x = np.asarray(signal, dtype=np.float32)
        if x.shape[-1] != PUBLISHED_SAMPLES:
            note(f"FFT-resampled {x.shape[-1]} -> {PUBLISHED_SAMPLES} samples (published profile)")
        return zscore_leads(fft_resample_to(x, PUBLISHED_SAMPLES))
    note_resample(fs, FS)
    x = standardize_leads(linear_resample(np.asarray(signal, dtype=np.float64), fs, FS))
    return np.ascontiguousarray(crop_or_pad_start(x, native_samples), dtype=np.float32)


class ECGFMEncoder(ECGEncoder):
    name = "ecg_fm"
    n_layers = 12
    d = 768
    revision = REVISION  # preprocessing/pooling rule version: stores of an older one are redone

    def __init__(self, cfg: W2VConfig = FULL):
        super().__init__()
        if cfg.in_d != 12:
            raise ValueError(f"ECG-FM adapter feeds 12 leads; the model expects in_d={cfg.in_d}")
        self.model = Wav2Vec2ECG(cfg)  # parameter names = the fairseq checkpoint's 'model' keys
        self.n_layers = cfg.encoder_layers
        self.d = cfg.encoder_embed_dim

    @property
    def input_samples(self) -> int:
        return PUBLISHED_SAMPLES if self.profile == "published" else SEGMENT

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        return preprocess_w2v(signal, fs, self.profile, SEGMENT)

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        check_batch(x, (12, self.input_samples), "ECG-FM", self.profile)
        return torch.stack([pool_tokens(h, self.profile) for h in self.model.layer_outputs(x.float())])


def read_checkpoint(path: str) -> tuple[W2VConfig, dict[str, torch.Tensor]]:
    """The fairseq checkpoint -> (architecture from cfg['model'], model state dict with published key names)."""
    source = str(path)
    obj = load_fairseq_checkpoint(path)
    if not isinstance(obj.get("model"), Mapping):
        raise CheckpointError(f"{source}: expected a fairseq checkpoint dict with 'cfg' and 'model' "
                              f"(ECG-FM's mimic_iv_ecg_physionet_pretrained.pt), found {sorted(obj)[:8]}")
    model_cfg = model_config(obj, source)
    name = model_cfg.get("_name")
    if name not in MODEL_NAMES:
        raise CheckpointError(f"{source}: cfg.model._name is {name!r}; the ECG-FM adapter reads the pretrained "
                              f"encoder ({' or '.join(MODEL_NAMES)}), e.g. mimic_iv_ecg_physionet_pretrained.pt, "
                              "not a finetuned classifier checkpoint")
    return W2VConfig.from_fairseq(model_cfg, source), to_legacy_weight_norm(require_tensors(obj["model"], source))


def load_checkpoint(path: str) -> ECGFMEncoder:
    """Build the model the checkpoint describes and load every key strictly."""
    cfg, state = read_checkpoint(path)
    model = ECGFMEncoder(cfg)
    load_state_dict_strict(model.model, state, str(path))
    return model


def inspect_checkpoint(path: str, size: str = "full") -> dict:
    """What loading `path` would do, without failing on a mismatch: model, file, variant, architecture,
    loaded / missing / extra keys, parameter counts (loaded, model) and the published count (90.9M).
    Unreadable or non-ECG-FM files raise CheckpointError with the reason. `size` is unused (the file's cfg
    defines the architecture); it is accepted so every adapter's inspect takes the same arguments."""
    cfg, state = read_checkpoint(path)
    expected = Wav2Vec2ECG(cfg).state_dict()
    return {"model": "ecg_fm", "file": str(path), "variant": ecg_fm_variant(state),
            "architecture": f"{cfg.encoder_layers} layers x {cfg.encoder_embed_dim} (from cfg['model'])",
            **key_report(expected, state), "dropped": {}, "published_params": PUBLISHED_PARAMS,
            "published_params_source": "ECG-FM README (90.9 million parameters)"}


@register_encoder("ecg_fm")
def build(spec: EncoderSpec) -> ECGFMEncoder:
    model = load_checkpoint(spec.checkpoint) if spec.checkpoint else ECGFMEncoder(FULL if spec.size == "full"
                                                                                   else DEMO)
    model.profile = spec.profile
    return model
