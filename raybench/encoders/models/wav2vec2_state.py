"""State-dict helpers of the wav2vec-family checkpoints (ECG-FM, CARDIAC-FM, HuBERT-ECG): weight-norm key names
between torch versions, the tensor check, and which fairseq-signals ECG-FM model a state dict comes from."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from raybench.encoders.base import CheckpointError

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
