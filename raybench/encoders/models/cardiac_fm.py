"""CARDIAC-FM (lst627): the ECG branch of an ECG-cardiac-MRI contrastive model, initialised from ECG-FM.

Checkpoint: the stage-1 `model_epoch_*.pth`, a flat `torch.save(nn.DataParallel(MMCL).state_dict())`
(cardiac_fm/stage1_CL.py:151). Its ECG branch is `module.ecg_encoder.*` - the model
`build_model_from_checkpoint(ecg_ckpt)` made (cardiac_fm/model.py:24) - plus `module.ecg_projection.*`
(LayerNorm(768) -> dropout -> Linear(768, 512)), which only makes the pooled contrastive embedding. The MRI
branch (`module.mri_encoder.*`, `module.mri_projection.*`) is set aside; every other key must match. The
file has no config, so the architecture is `spec.size` (full = the ECG-FM architecture); a mismatching file
fails on shapes/keys. Which ECG-FM the branch was built from is read off its keys (`ecg_fm_variant`): the
pretrained wav2vec2_cmsc (mimic_iv_ecg_physionet_pretrained.pt, what the published stage-1 file holds and
what the protocol's adapter loads it into) is accepted; a branch built from the finetuned classifier
(ecg_transformer_classifier: `ecg_encoder.encoder.*`, `ecg_encoder.proj.*`) or a bare ecg_transformer is
refused with a message naming it. `inspect_checkpoint(path, size)` reports what would load.

Audited states: the 768-d output of each of the 12 transformer layers (after its final LayerNorm), pooled
over tokens per profile (the projection is loaded, kept, and used only by `pooled_projection`):
  native     upstream's rule `torch.div(x.sum(dim=1), (x != 0).sum(dim=1))` (cardiac_fm/model.py:62, applied
             there to the last layer before the projection; here to every audited layer).
  published  the plain token mean of the hooked layer output (the protocol's
             scripts/build_probe_features.py:113; benchmark_v1/adapters/cardiac_fm.py:123-131).

Preprocessing profiles (parity with the upstream code: tests/parity/test_parity_ecg_fm.py):
  native     the fairseq-signals pipeline CARDIAC-FM vendors (cardiac_fm/fairseq/scripts/preprocess/ecg/
             preprocess.py, identical to ECG-FM's): 500 Hz by linear interpolation to int(T * 500 / fs)
             samples, per-lead standardization over the record (std-0 leads -> 0), float64; then the first
             5,000 samples (10 s). CARDIAC-FM does not publish its ECG dataset class (stage1_CL.py imports a
             `dataset` module absent from the repository), so the 10-s window is raybench's choice: the
             UK Biobank resting ECGs it was trained on are 10 s at 500 Hz. Shorter records are zero-padded
             at the end (noted). Shape [12, 5000].
  published  the protocol's adapter (benchmark_v1/adapters/cardiac_fm.py:45 uses its ECG-FM
             `load_12lead_waveform`, benchmark_v1/adapters/ecg_fm.py:59-69): the record FFT-resampled to
             5,000 samples, per-lead z-score (float32, std floored at 1e-6). Shape [12, 5000].
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
from raybench.encoders.models.ecg_fm import PUBLISHED_PARAMS, REVISION, key_report, preprocess_w2v
from raybench.encoders.models.wav2vec2 import Wav2Vec2ECG
from raybench.encoders.models.wav2vec2_config import DEMO, FULL, W2VConfig
from raybench.encoders.models.wav2vec2_io import check_batch, nonzero_mean, pool_tokens
from raybench.encoders.models.wav2vec2_state import (
    VARIANT_CLASSIFIER,
    VARIANT_ENCODER_ONLY,
    VARIANT_PRETRAINED,
    ecg_fm_variant,
    require_tensors,
    to_legacy_weight_norm,
)

SAMPLES = 5000
DP_PREFIX = "module."  # nn.DataParallel wrapper
ECG_PREFIXES = ("ecg_encoder.", "ecg_projection.")
MRI_PREFIXES = ("mri_encoder.", "mri_projection.")  # the other modality's branch: not part of the ECG encoder
PROJ_DIM = {"full": 512, "demo": 32}


class CardiacFMEncoder(ECGEncoder):
    name = "cardiac_fm"
    n_layers = 12
    d = 768
    revision = REVISION  # preprocessing/pooling rule version: stores of an older one are redone

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
        return torch.stack([pool_tokens(h, self.profile) for h in self.ecg_encoder.layer_outputs(x.float())])

    @torch.no_grad()
    def pooled_projection(self, x: torch.Tensor) -> torch.Tensor:
        """The contrastive embedding [B, proj_dim] (not an audited state). native: upstream's
        MMCL.forward_ecg (model.py:58-64): last-layer tokens pooled with `nonzero_mean`, then the projection;
        published: the protocol's `pooled` (benchmark_v1/adapters/cardiac_fm.py:139-141): the projection of
        the plain token mean."""
        check_batch(x, (12, SAMPLES), "CARDIAC-FM", self.profile)
        h = self.ecg_encoder.layer_outputs(x.float())[-1]
        return self.ecg_projection(h.mean(dim=1) if self.profile == "published" else nonzero_mean(h))


def _strip_dataparallel(obj: object, source: str) -> dict:
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"{source}: expected CARDIAC-FM's flat state dict (model_epoch_*.pth), "
                              f"found {type(obj).__name__}")
    if obj and all(isinstance(k, str) and k.startswith(DP_PREFIX) for k in obj):
        return {k[len(DP_PREFIX):]: v for k, v in obj.items()}
    return dict(obj)


def check_variant(state: Mapping[str, object], source: str) -> str:
    """The ECG-FM variant the ECG branch was built from; anything but the pretrained encoder fails, naming it."""
    variant = ecg_fm_variant(state, ECG_PREFIXES[0])
    if variant == VARIANT_CLASSIFIER:
        raise CheckpointError(
            f"{source}: the ECG branch was built from an ECG-FM classifier (fairseq-signals "
            "ecg_transformer_classifier, e.g. mimic_iv_ecg_finetuned.pt: keys module.ecg_encoder.encoder.* and "
            "module.ecg_encoder.proj.*). The CARDIAC-FM adapter reads the branch built from the pretrained "
            "ECG-FM (wav2vec2_cmsc, mimic_iv_ecg_physionet_pretrained.pt), as in the published stage-1 "
            "checkpoint; a classifier-branch file is a different model.")
    if variant == VARIANT_ENCODER_ONLY:
        raise CheckpointError(
            f"{source}: the ECG branch is a bare ecg_transformer (module.ecg_encoder.feature_extractor.* without "
            "the pretraining heads final_proj/project_q/quantizer); the CARDIAC-FM adapter reads the branch built "
            "from the pretrained ECG-FM (wav2vec2_cmsc, mimic_iv_ecg_physionet_pretrained.pt)")
    if variant != VARIANT_PRETRAINED:
        raise CheckpointError(f"{source}: no 'module.ecg_encoder.*' entries; expected the CARDIAC-FM stage-1 "
                              f"checkpoint (flat DataParallel state dict), found keys {sorted(state)[:8]}")
    return variant


def extract_ecg_branch(obj: object, source: str) -> dict[str, torch.Tensor]:
    """Flat DataParallel state dict -> the ECG branch keys (`ecg_encoder.*`, `ecg_projection.*`, anything
    unknown kept so the strict load reports it); the MRI branch is dropped. The branch must come from the
    pretrained ECG-FM (`check_variant`)."""
    obj = _strip_dataparallel(obj, source)
    check_variant(obj, source)
    state = {k: v for k, v in obj.items() if not k.startswith(MRI_PREFIXES)}
    return to_legacy_weight_norm(require_tensors(state, source))


def load_checkpoint(model: CardiacFMEncoder, path: str) -> None:
    load_state_dict_strict(model, extract_ecg_branch(load_torch_checkpoint(path), str(path)), str(path))


def inspect_checkpoint(path: str, size: str = "full") -> dict:
    """What loading `path` into the `size` architecture would do, without failing on a key mismatch: model,
    file, variant of the ECG branch, loaded / missing / extra keys, the MRI-branch keys set aside
    (`dropped`), parameter counts (loaded, model) and the published count of the ECG-FM encoder it extends
    (90.9M; the projection adds 0.4M). A classifier-branch or non-CARDIAC-FM file raises CheckpointError."""
    source = str(path)
    obj = _strip_dataparallel(load_torch_checkpoint(path), source)
    variant = check_variant(obj, source)
    dropped = sorted(k for k in obj if k.startswith(MRI_PREFIXES))
    state = to_legacy_weight_norm({k: v for k, v in obj.items() if not k.startswith(MRI_PREFIXES)})
    model = CardiacFMEncoder(FULL if size == "full" else DEMO, PROJ_DIM[size])
    return {"model": "cardiac_fm", "file": source, "variant": variant,
            "architecture": f"{size}: {model.n_layers} layers x {model.d} + projection {model.d} -> {PROJ_DIM[size]}",
            **key_report(model.state_dict(), state), "dropped": {"mri_branch": dropped},
            "published_params": PUBLISHED_PARAMS,
            "published_params_source": "ECG-FM README (90.9 million parameters; CARDIAC-FM's ECG encoder is ECG-FM)"}


@register_encoder("cardiac_fm")
def build(spec: EncoderSpec) -> CardiacFMEncoder:
    model = CardiacFMEncoder(FULL if spec.size == "full" else DEMO, PROJ_DIM[spec.size])
    if spec.checkpoint:
        load_checkpoint(model, spec.checkpoint)
    model.profile = spec.profile
    return model
