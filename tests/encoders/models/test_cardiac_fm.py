"""CARDIAC-FM adapter: DataParallel flat checkpoint, ECG branch only, strict keys, which ECG-FM the branch was
built from, `inspect_checkpoint`. Parity with upstream (MMCL.forward_ecg, the published adapter) for the
layer states and the contrastive embedding, both profiles: tests/parity/test_parity_ecg_fm.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raybench.encoders.base import CheckpointError, EncoderSpec, build_encoder
from raybench.encoders.models import cardiac_fm
from raybench.encoders.models.wav2vec2 import Wav2Vec2ECG
from raybench.encoders.models.wav2vec2_config import DEMO

PROJ_KEYS = {"ecg_projection.0.weight", "ecg_projection.0.bias", "ecg_projection.2.weight", "ecg_projection.2.bias"}


def fake_state(seed: int = 1) -> dict[str, torch.Tensor]:
    """What `torch.save(nn.DataParallel(MMCL).state_dict())` holds, at demo size, random tensors."""
    g = torch.Generator().manual_seed(seed)
    enc = Wav2Vec2ECG(DEMO).state_dict()  # fairseq keys, weight_g/weight_v as the published file has them
    state = {f"module.ecg_encoder.{k}": 0.2 * torch.randn(v.shape, generator=g) for k, v in enc.items()}
    state |= {"module.ecg_projection.0.weight": torch.rand(64, generator=g) + 0.5,
              "module.ecg_projection.0.bias": torch.randn(64, generator=g),
              "module.ecg_projection.2.weight": torch.randn(32, 64, generator=g),
              "module.ecg_projection.2.bias": torch.randn(32, generator=g)}
    # the MRI branch of the contrastive model: present in the file, not part of the ECG encoder
    state |= {"module.mri_encoder.mri_encoder1.fenc.conv1.weight": torch.randn(4, 3, 3, 3, generator=g),
              "module.mri_encoder.mri_encoder2.senc.rnn.weight_ih_l0": torch.randn(8, 4, generator=g),
              "module.mri_projection.2.weight": torch.randn(512, 512, generator=g)}
    return state


def record(seed: int = 0, t: int = 5000) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((12, t)).astype(np.float32)


def batch(model, seeds=(0, 1)) -> torch.Tensor:
    return torch.from_numpy(np.stack([model.preprocess(record(s), 500) for s in seeds]))


def test_keys_are_the_ecg_branch_of_the_published_file():
    keys = set(cardiac_fm.CardiacFMEncoder(DEMO, 32).state_dict())
    assert keys >= PROJ_KEYS
    assert keys - PROJ_KEYS == {f"ecg_encoder.{k}" for k in Wav2Vec2ECG(DEMO).state_dict()}


def test_checkpoint_loads_strictly_and_sets_the_weights(tmp_path):
    state = fake_state()
    path = tmp_path / "model_epoch_8.pth"
    torch.save(state, path)
    model = build_encoder(EncoderSpec("cardiac_fm", checkpoint=str(path), init_seed=9))
    for k, v in model.state_dict().items():
        assert torch.equal(v, state["module." + k]), k


def test_branch_built_from_the_classifier_or_a_bare_encoder_fails_naming_it(tmp_path):
    state = fake_state()
    enc = {k: v for k, v in state.items() if k.startswith("module.ecg_encoder.")}
    rest = {k: v for k, v in state.items() if not k.startswith("module.ecg_encoder.")}
    # ecg_transformer_classifier (mimic_iv_ecg_finetuned.pt): the encoder under `encoder.`, a `proj` head
    classifier = rest | {k.replace("module.ecg_encoder.", "module.ecg_encoder.encoder."): v for k, v in enc.items()
                         if not k.startswith(("module.ecg_encoder.quantizer", "module.ecg_encoder.project_q",
                                              "module.ecg_encoder.final_proj", "module.ecg_encoder.mask_emb"))}
    classifier |= {"module.ecg_encoder.proj.weight": torch.zeros(17, 64),
                   "module.ecg_encoder.proj.bias": torch.zeros(17)}
    torch.save(classifier, tmp_path / "clf.pth")
    with pytest.raises(CheckpointError, match="built from an ECG-FM classifier.*ecg_transformer_classifier"):
        build_encoder(EncoderSpec("cardiac_fm", checkpoint=str(tmp_path / "clf.pth")))
    with pytest.raises(CheckpointError, match="classifier"):
        cardiac_fm.inspect_checkpoint(str(tmp_path / "clf.pth"), size="demo")
    bare = {k: v for k, v in state.items() if not k.startswith(("module.ecg_encoder.quantizer",
            "module.ecg_encoder.project_q", "module.ecg_encoder.final_proj"))}
    torch.save(bare, tmp_path / "bare.pth")
    with pytest.raises(CheckpointError, match="bare ecg_transformer"):
        build_encoder(EncoderSpec("cardiac_fm", checkpoint=str(tmp_path / "bare.pth")))


def test_inspect_reports_what_would_load(tmp_path):
    state = fake_state()
    torch.save(state, tmp_path / "model_epoch_8.pth")
    report = cardiac_fm.inspect_checkpoint(str(tmp_path / "model_epoch_8.pth"), size="demo")
    n = sum(v.numel() for v in cardiac_fm.CardiacFMEncoder(DEMO, 32).state_dict().values())
    assert (report["model"], report["variant"]) == ("cardiac_fm", "pretrained")
    assert report["missing"] == report["extra"] == []
    assert report["n_params"] == report["n_params_model"] == n
    assert report["dropped"]["mri_branch"] == sorted(k[len("module."):] for k in state if ".mri_" in k)
    state["module.logit_scale"] = torch.ones(())
    torch.save(state, tmp_path / "extra.pth")
    report = cardiac_fm.inspect_checkpoint(str(tmp_path / "extra.pth"), size="demo")  # reports, does not raise
    assert report["extra"] == ["logit_scale"] and report["missing"] == []


def test_file_without_dataparallel_prefix_and_with_new_weight_norm_names_loads(tmp_path):
    state = {k[len("module."):].replace(".weight_g", ".parametrizations.weight.original0")
             .replace(".weight_v", ".parametrizations.weight.original1"): v for k, v in fake_state().items()}
    torch.save(state, tmp_path / "plain.pth")
    model = cardiac_fm.CardiacFMEncoder(DEMO, 32)
    cardiac_fm.load_checkpoint(model, str(tmp_path / "plain.pth"))
    assert torch.equal(model.ecg_encoder.conv_pos.pos_conv[0].weight_v,
                       state["ecg_encoder.conv_pos.pos_conv.0.parametrizations.weight.original1"])


def test_renamed_or_unknown_key_fails_naming_it(tmp_path):
    state = fake_state()
    state["module.ecg_encoder.encoder.layers.0.fc2.bias_x"] = state.pop("module.ecg_encoder.encoder.layers.0.fc2.bias")
    torch.save(state, tmp_path / "renamed.pth")
    with pytest.raises(CheckpointError, match=r"ecg_encoder\.encoder\.layers\.0\.fc2\.bias_x") as err:
        build_encoder(EncoderSpec("cardiac_fm", checkpoint=str(tmp_path / "renamed.pth")))
    assert "missing [ecg_encoder.encoder.layers.0.fc2.bias]" in str(err.value)
    state = fake_state() | {"module.logit_scale": torch.ones(())}
    torch.save(state, tmp_path / "extra.pth")
    with pytest.raises(CheckpointError, match="unexpected \\[logit_scale\\]"):
        build_encoder(EncoderSpec("cardiac_fm", checkpoint=str(tmp_path / "extra.pth")))


def test_wrong_size_or_format_fails_clearly(tmp_path):
    torch.save(fake_state(), tmp_path / "demo.pth")
    with pytest.raises(CheckpointError, match="shapes do not match"):
        cardiac_fm.load_checkpoint(cardiac_fm.CardiacFMEncoder(DEMO, 16), str(tmp_path / "demo.pth"))
    torch.save({"module.mri_encoder.w": torch.zeros(1)}, tmp_path / "mri.pth")
    with pytest.raises(CheckpointError, match="module.ecg_encoder"):
        build_encoder(EncoderSpec("cardiac_fm", checkpoint=str(tmp_path / "mri.pth")))


@pytest.mark.parametrize("profile", ["native", "published"])
def test_preprocess_shapes(profile):
    model = build_encoder(EncoderSpec("cardiac_fm", profile=profile))
    for t, fs in ((5000, 500), (1000, 100), (6000, 500)):
        x = model.preprocess(record(t=t) * 2 - 1, fs)
        assert x.shape == (12, 5000) and x.dtype == np.float32
    x = model.preprocess(record() * 2 - 1, 500)
    np.testing.assert_allclose(x.mean(axis=1), 0, atol=1e-5)
    np.testing.assert_allclose(x.std(axis=1), 1, atol=1e-4)


def test_demo_projection_and_native_shape_error():
    """Shape, determinism, seeds, freezing: tests/encoders/models/test_conformance.py; here CARDIAC-FM's own."""
    a = build_encoder(EncoderSpec("cardiac_fm", init_seed=5))
    x = batch(a)
    assert a.pooled_projection(x).shape == (2, 32)
    with pytest.raises(ValueError, match=r"CARDIAC-FM .*\[B, 12, 5000\]"):
        a.layer_states(x[:, :, :2500])


@pytest.mark.slow
def test_full_size_states():
    model = build_encoder(EncoderSpec("cardiac_fm", size="full"))
    assert (model.n_layers, model.d) == (12, 768)
    x = batch(model, (0,))
    s = model.layer_states(x)
    assert s.shape == (12, 1, 768) and torch.isfinite(s).all()
    assert model.pooled_projection(x).shape == (1, 512)

