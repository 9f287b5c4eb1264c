"""CARDIAC-FM (lst627): the ECG branch of an ECG-cardiac-MRI contrastive model, initialised from ECG-FM.

Checkpoint: the stage-1 `model_epoch_*.pth`, a flat `torch.save(nn.DataParallel(MMCL).state_dict())`. Its ECG
branch is `module.ecg_encoder.*` (the full fairseq-signals wav2vec2_cmsc model, same keys as ECG-FM's
'model') plus `module.ecg_projection.*` (LayerNorm(768) -> dropout -> Linear(768, 512)), which only makes the
pooled contrastive embedding. The MRI branch (`module.mri_encoder.*`, `module.mri_projection.*`) is set
aside; every other key must match. The file has no config, so the architecture is `spec.size` (full = the
ECG-FM architecture); a mismatching file fails on shapes/keys.

Audited states: the 768-d output of each of the 12 transformer layers, mean over all tokens (the
projection is loaded, kept, and used only by `pooled_projection`).

Preprocessing profiles:
  native     the fairseq-signals pipeline its ECG-FM encoder was trained on: 500 Hz (linear interpolation),
             per-lead z-score over the record, the first 5,000 samples (10 s). Shape [12, 5000].
  published  the protocol's adapter (same as its ECG-FM one): the record FFT-resampled to 5,000 samples,
             per-lead z-score. Shape [12, 5000].
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

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
    require_tensors,
    to_legacy_weight_norm,
)
from raybench.encoders.models.ecg_fm import preprocess_w2v

SAMPLES = 5000
DP_PREFIX = "module."  # nn.DataParallel wrapper
ECG_PREFIXES = ("ecg_encoder.", "ecg_projection.")
MRI_PREFIXES = ("mri_encoder.", "mri_projection.")  # the other modality's branch: not part of the ECG encoder
PROJ_DIM = {"full": 512, "demo": 32}


class CardiacFMEncoder(ECGEncoder):
    name = "cardiac_fm"
    n_layers = 12
    d = 768

    def __init__(self, cfg: W2VConfig = FULL, proj_dim: int = PROJ_DIM["full"]):
        super().__init__()
        self.ecg_encoder = Wav2Vec2ECG(cfg)
        d = cfg.encoder_embed_dim
        # indices 0 and 2 carry weights in the checkpoint (1 is dropout)
        self.ecg_projection = nn.Sequential(nn.LayerNorm(d), nn.Identity(), nn.Linear(d, proj_dim))
        self.n_layers = cfg.encoder_layers
        self.d = d

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        return preprocess_w2v(signal, fs, self.profile, SAMPLES)

    @torch.no_grad()
    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        check_batch(x, (12, SAMPLES), "CARDIAC-FM", self.profile)
        return torch.stack([h.mean(dim=1) for h in self.ecg_encoder.layer_outputs(x.float())])

    @torch.no_grad()
    def pooled_projection(self, x: torch.Tensor) -> torch.Tensor:
        """Upstream's contrastive embedding [B, proj_dim]: final-layer tokens averaged over their non-zero
        entries (as CARDIAC-FM does), then the projection. Not an audited state."""
        check_batch(x, (12, SAMPLES), "CARDIAC-FM", self.profile)
        h = self.ecg_encoder.layer_outputs(x.float())[-1]
        return self.ecg_projection(h.sum(dim=1) / (h != 0).sum(dim=1))


def extract_ecg_branch(obj: object, source: str) -> dict[str, torch.Tensor]:
    """Flat DataParallel state dict -> the ECG branch keys (`ecg_encoder.*`, `ecg_projection.*`, anything
    unknown kept so the strict load reports it); the MRI branch is dropped."""
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source}: expected CARDIAC-FM's flat state dict (model_epoch_*.pth), "
                              f"found {type(obj).__name__}")
    if obj and all(isinstance(k, str) and k.startswith(DP_PREFIX) for k in obj):
        obj = {k[len(DP_PREFIX):]: v for k, v in obj.items()}
    if not any(k.startswith(ECG_PREFIXES[0]) for k in obj):
        raise CheckpointError(f"{source}: no 'module.ecg_encoder.*' entries; expected the CARDIAC-FM stage-1 "
                              f"checkpoint (flat DataParallel state dict), found keys {sorted(obj)[:8]}")
    state = {k: v for k, v in obj.items() if not k.startswith(MRI_PREFIXES)}
    return to_legacy_weight_norm(require_tensors(state, source))


def load_checkpoint(model: CardiacFMEncoder, path: str) -> None:
    load_state_dict_strict(model, extract_ecg_branch(load_torch_checkpoint(path), str(path)), str(path))


@register_encoder("cardiac_fm")
def build(spec: EncoderSpec) -> CardiacFMEncoder:
    model = CardiacFMEncoder(FULL if spec.size == "full" else DEMO, PROJ_DIM[spec.size])
    if spec.checkpoint:
        load_checkpoint(model, spec.checkpoint)
    model.profile = spec.profile
    return model
