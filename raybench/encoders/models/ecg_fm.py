"""ECG-FM (bowang-lab): the fairseq-signals wav2vec 2.0 + CMSC + RLM model, 12 post-LN layers of 768.

Checkpoint: the fairseq dict `{'cfg': {...}, 'model': state_dict, ...}` of `mimic_iv_ecg_physionet_pretrained.pt`
(model `wav2vec2_cmsc`). The architecture is read from `cfg['model']` (fairseq stores it), so the loaded
model is exactly the one described by the file; `spec.size` only picks the seeded-init architecture when
no checkpoint is given.

Preprocessing profiles:
  native     fairseq-signals' ECG pipeline: resample to 500 Hz (linear interpolation, as its
             scripts/preprocess/ecg does), z-score every lead over the whole record,
             cut into non-overlapping 5-s segments (2,500 samples). One record maps to its FIRST segment
             (segment 0, the first 5 s); later segments are not used. Shape [12, 2500].
  published  the protocol's adapter: the whole record FFT-resampled to 5,000 samples (10 s at 500 Hz),
             per-lead z-score; the model sees 10 s. Shape [12, 5000].

Audited states: the output of each transformer layer (after its final LayerNorm), mean over all tokens.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from raybench.encoders.base import (
    CheckpointError,
    ECGEncoder,
    EncoderSpec,
    load_state_dict_strict,
    load_torch_checkpoint,
    register_encoder,
)
from raybench.encoders.models._wav2vec2 import (
    DEMO,
    FULL,
    W2VConfig,
    Wav2Vec2ECG,
    check_batch,
    fft_resample_to,
    linear_resample,
    require_tensors,
    to_legacy_weight_norm,
)
from raybench.encoders.preprocess import crop_or_pad_start, zscore_leads

FS = 500
SEGMENT = 2500  # 5 s at 500 Hz: one fairseq-signals segment
PUBLISHED_SAMPLES = 5000  # the protocol fed the whole 10-s record
MODEL_NAMES = ("wav2vec2_cmsc", "wav2vec2")


def preprocess_w2v(signal: np.ndarray, fs: float, profile: str, native_samples: int) -> np.ndarray:
    """Shared by ECG-FM and CARDIAC-FM. native: fairseq-signals' pipeline (linear-interpolation resampling
    to 500 Hz, per-lead z-score over the whole record), then the first `native_samples`; published: the
    protocol's FFT resampling of the record to 5,000 samples + per-lead z-score."""
    x = np.asarray(signal, dtype=np.float32)
    if profile == "published":
        return zscore_leads(fft_resample_to(x, PUBLISHED_SAMPLES))
    return np.ascontiguousarray(crop_or_pad_start(zscore_leads(linear_resample(x, fs, FS)), native_samples))


class ECGFMEncoder(ECGEncoder):
    name = "ecg_fm"
    n_layers = 12
    d = 768

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
        return torch.stack([h.mean(dim=1) for h in self.model.layer_outputs(x.float())])


def read_checkpoint(path: str) -> tuple[W2VConfig, dict[str, torch.Tensor]]:
    """The fairseq checkpoint -> (architecture from cfg['model'], model state dict with published key names)."""
    source = str(path)
    obj = load_torch_checkpoint(path)
    if not isinstance(obj, Mapping) or not isinstance(obj.get("model"), Mapping):
        found = sorted(obj)[:8] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(f"{source}: expected a fairseq checkpoint dict with 'cfg' and 'model' "
                              f"(ECG-FM's mimic_iv_ecg_physionet_pretrained.pt), found {found}")
    cfg = obj.get("cfg")
    model_cfg = cfg.get("model") if isinstance(cfg, Mapping) else None
    if not isinstance(model_cfg, Mapping):
        raise CheckpointError(f"{source}: no cfg['model'] entry; the fairseq checkpoint must carry its model "
                              "config (it defines the architecture)")
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


@register_encoder("ecg_fm")
def build(spec: EncoderSpec) -> ECGFMEncoder:
    model = load_checkpoint(spec.checkpoint) if spec.checkpoint else ECGFMEncoder(FULL if spec.size == "full"
                                                                                   else DEMO)
    model.profile = spec.profile
    return model
