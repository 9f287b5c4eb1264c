"""ECG-FM adapter: fairseq checkpoint format (real-format files with omegaconf / argparse / numpy objects, read
through the weights-only allow-list), strict keys, architecture facts, preprocessing helpers.

Parity with the upstream code (preprocessing and pooled states, both profiles) is in
tests/parity/test_parity_ecg_fm.py."""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from raybench.encoders.base import CheckpointError, EncoderSpec, build_encoder
from raybench.encoders.models import ecg_fm
from raybench.encoders.models.fairseq_checkpoint import FAIRSEQ_GLOBALS, load_fairseq_checkpoint
from raybench.encoders.models.wav2vec2 import TransformerLayer, Wav2Vec2ECG, WeightNormConv1d
from raybench.encoders.models.wav2vec2_config import FULL, W2VConfig, parse_conv_layers
from raybench.encoders.models.wav2vec2_io import linear_resample, nonzero_mean, standardize_leads

PARITY = Path(__file__).resolve().parents[2] / "parity"
sys.path.insert(0, str(PARITY))
from weights import det_state_dict  # noqa: E402

# Tiny real-format files from tests/parity/make_fake_fairseq_checkpoints.py (weights: det_state_dict seed 1211):
# `dictconfig`: written by fairseq-signals' trainer format, loaded by its load_checkpoint_to_cpu (cfg ->
# omegaconf 2.3 DictConfig) and saved again; `namespace_oc20`: omegaconf 2.0.6 DictConfig cfg + argparse
# Namespace args. Both carry numpy scalars in optimizer_history / extra_state.
FAKE_FILES = {k: PARITY / f"fairseq_ckpt_{k}.pt" for k in ("dictconfig", "namespace_oc20")}
FAKE_SEED = 1211

# A tiny fairseq cfg['model'] as ECG-FM's checkpoint stores it (conv spec as a string, extra options present).
TINY_CFG = {
    "_name": "wav2vec2_cmsc", "conv_feature_layers": "[(16, 2, 2)] * 2", "in_d": 12, "extractor_mode": "default",
    "conv_bias": False, "encoder_embed_dim": 32, "encoder_ffn_embed_dim": 64, "encoder_attention_heads": 2,
    "encoder_layers": 2, "layer_norm_first": False, "conv_pos": 8, "conv_pos_groups": 2, "apply_mask": True,
    "mask_prob": 0.65, "quantize_targets": True, "final_dim": 8, "latent_vars": 4, "latent_groups": 2,
    "latent_dim": 0, "feature_grad_mult": 0.1, "dropout_input": 0.1, "all_gather": False,
}


def tiny_state(seed: int = 1) -> dict[str, torch.Tensor]:
    """Random tensors under the upstream key names (weight_g/weight_v: torch.nn.utils.weight_norm, as saved)."""
    g = torch.Generator().manual_seed(seed)
    shapes = Wav2Vec2ECG(W2VConfig.from_fairseq(TINY_CFG, "t")).state_dict()
    return {k: 0.2 * torch.randn(v.shape, generator=g) for k, v in shapes.items()}


def save_fairseq(path, state, model_cfg=TINY_CFG) -> str:
    """The dict fairseq-signals' Trainer.state_dict() writes (cfg as a plain container)."""
    torch.save({
        "args": None,
        "cfg": {"common": {"seed": 1}, "model": dict(model_cfg), "task": {"_name": "ecg_pretraining"}},
        "model": state,
        "criterion": None,
        "optimizer_history": [{"criterion_name": "Wav2Vec2WithCMSCCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": 1.0}, "num_updates": 10}],
        "task_state": {},
        "extra_state": {"metrics": {}, "previous_training_time": 12.5},
    }, path)
    return str(path)


def record(seed: int = 0, t: int = 5000) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((12, t)).astype(np.float32)


# ---------------------------------------------------------------- architecture facts

def test_state_dict_keys_are_the_fairseq_signals_names():
    cfg = W2VConfig.from_fairseq(TINY_CFG, "t")
    layer = ["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj", "self_attn.out_proj",
             "self_attn_layer_norm", "fc1", "fc2", "final_layer_norm"]
    expected = {"mask_emb", "feature_extractor.conv_layers.0.0.weight", "feature_extractor.conv_layers.0.2.weight",
                "feature_extractor.conv_layers.0.2.bias", "feature_extractor.conv_layers.1.0.weight",
                "post_extract_proj.weight", "post_extract_proj.bias", "conv_pos.pos_conv.0.weight_g",
                "conv_pos.pos_conv.0.weight_v", "conv_pos.pos_conv.0.bias", "layer_norm.weight", "layer_norm.bias",
                "encoder.layer_norm.weight", "encoder.layer_norm.bias", "quantizer.vars",
                "quantizer.weight_proj.weight", "quantizer.weight_proj.bias", "project_q.weight", "project_q.bias",
                "final_proj.weight", "final_proj.bias"}
    expected |= {f"encoder.layers.{i}.{m}.{p}" for i in range(2) for m in layer for p in ("weight", "bias")}
    state = Wav2Vec2ECG(cfg).state_dict()
    assert set(state) == expected
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["conv_pos.pos_conv.0.weight_g"] == (1, 1, 8)  # weight norm over the kernel axis (dim=2)
    assert shapes["conv_pos.pos_conv.0.weight_v"] == (32, 16, 8)  # 2 groups
    assert shapes["quantizer.vars"] == (1, 2 * 4, 8 // 2)
    assert shapes["quantizer.weight_proj.weight"] == (2 * 4, 16)
    assert shapes["post_extract_proj.weight"] == (32, 16)
    assert shapes["feature_extractor.conv_layers.0.0.weight"] == (16, 12, 2)


def test_full_size_has_the_published_parameter_count():
    # ECG-FM README: "ECG-FM has 90.9 million parameters"
    n = sum(p.numel() for p in Wav2Vec2ECG(FULL).parameters())
    assert round(n / 1e5) == 909


def test_conv_spec_parser_reads_fairseq_strings_without_eval():
    assert parse_conv_layers("[(256, 2, 2)] * 4") == ((256, 2, 2),) * 4
    assert parse_conv_layers("[(512, 10, 5)] + [(512, 3, 2)] * 2") == ((512, 10, 5), (512, 3, 2), (512, 3, 2))
    assert parse_conv_layers("2 * [(8, 3, 1)]") == ((8, 3, 1),) * 2
    for bad in ("__import__('os').system('true')", "[(1, 2)]", "[]", "[(1, 2, 3)] * 'x'"):
        with pytest.raises(CheckpointError, match="conv_feature_layers"):
            parse_conv_layers(bad)
    assert FULL.n_tokens(2500) == 156 and FULL.n_tokens(5000) == 312


def test_weight_norm_conv_matches_torch_weight_norm():
    torch.manual_seed(0)
    ours = WeightNormConv1d(16, 6, 4)
    with torch.no_grad():
        ours.weight_g.mul_(torch.rand_like(ours.weight_g) + 0.5)  # g != ||v|| so the norm really matters
    ref = nn.Conv1d(16, 16, 6, padding=3, groups=4)
    ref = nn.utils.parametrizations.weight_norm(ref, name="weight", dim=2)
    ref.load_state_dict({"bias": ours.bias, "parametrizations.weight.original0": ours.weight_g,
                         "parametrizations.weight.original1": ours.weight_v})
    x = torch.randn(2, 16, 20)
    torch.testing.assert_close(ours(x), ref(x))


def test_post_ln_layer_matches_torch_transformer_layer():
    cfg = W2VConfig(encoder_embed_dim=32, encoder_ffn_embed_dim=48, encoder_attention_heads=4)
    torch.manual_seed(0)
    ours = TransformerLayer(cfg).eval()
    ref = nn.TransformerEncoderLayer(32, 4, 48, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=False).eval()
    a = ours.self_attn
    with torch.no_grad():
        ref.self_attn.in_proj_weight.copy_(torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]))
        ref.self_attn.in_proj_bias.copy_(torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
        ref.self_attn.out_proj.load_state_dict(a.out_proj.state_dict())
        ref.linear1.load_state_dict(ours.fc1.state_dict())
        ref.linear2.load_state_dict(ours.fc2.state_dict())
        ref.norm1.load_state_dict(ours.self_attn_layer_norm.state_dict())
        ref.norm2.load_state_dict(ours.final_layer_norm.state_dict())
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- checkpoint loading

def test_fairseq_checkpoint_loads_strictly_and_sets_the_weights(tmp_path):
    state = tiny_state()
    path = save_fairseq(tmp_path / "mimic_iv_ecg_physionet_pretrained.pt", state)
    model = build_encoder(EncoderSpec("ecg_fm", size="full", checkpoint=path, init_seed=7))
    assert (model.n_layers, model.d) == (2, 32)  # architecture from the checkpoint's cfg
    for k, v in model.model.state_dict().items():
        assert torch.equal(v, state[k]), k


@pytest.mark.parametrize("kind", sorted(FAKE_FILES))
def test_real_format_fairseq_files_load_through_the_allow_list(kind):
    path = FAKE_FILES[kind]
    with pytest.raises(Exception, match="weights_only|Unsupported global"):  # what a plain strict load does
        torch.load(path, map_location="cpu", weights_only=True)
    model = build_encoder(EncoderSpec("ecg_fm", size="full", checkpoint=str(path)))
    assert (model.n_layers, model.d) == (2, 32)
    expected = det_state_dict(model.model.state_dict(), FAKE_SEED)
    for k, v in model.model.state_dict().items():
        assert torch.equal(v, expected[k]), k
    ckpt = load_fairseq_checkpoint(path)  # cfg objects come back as plain containers
    assert ckpt["cfg"]["model"]["_name"] == "wav2vec2_cmsc" and ckpt["cfg"]["model"]["encoder_layers"] == 2
    assert ckpt["optimizer_history"][-1]["num_updates"] == 41000
    assert ckpt["optimizer_history"][-1]["lr_scheduler_state"]["best"] == pytest.approx(2.4172)
    if kind == "namespace_oc20":
        assert ckpt["args"]["arch"] == "wav2vec2_cmsc" and ckpt["args"]["lr"] == [5e-5]


def test_inspect_reports_keys_and_parameter_counts(tmp_path):
    report = ecg_fm.inspect_checkpoint(str(FAKE_FILES["dictconfig"]))
    n = sum(v.numel() for v in Wav2Vec2ECG(W2VConfig.from_fairseq(TINY_CFG, "t")).state_dict().values())
    assert (report["model"], report["variant"], report["missing"], report["extra"]) == ("ecg_fm", "pretrained", [], [])
    assert report["n_params"] == report["n_params_model"] == n and report["published_params"] == 90.9e6
    assert len(report["loaded"]) == len(Wav2Vec2ECG(W2VConfig.from_fairseq(TINY_CFG, "t")).state_dict())
    state = tiny_state()
    state["encoder.layers.0.fc1.bias_x"] = state.pop("encoder.layers.0.fc1.bias")
    report = ecg_fm.inspect_checkpoint(save_fairseq(tmp_path / "renamed.pt", state))  # reports, does not raise
    assert report["missing"] == ["encoder.layers.0.fc1.bias"] and report["extra"] == ["encoder.layers.0.fc1.bias_x"]


def test_legacy_args_only_checkpoint_reads_the_architecture_from_args(tmp_path):
    args = argparse.Namespace(arch="wav2vec2_cmsc", **{k: v for k, v in TINY_CFG.items() if k != "_name"})
    torch.save({"args": args, "cfg": None, "model": tiny_state()}, tmp_path / "legacy.pt")
    model = ecg_fm.load_checkpoint(str(tmp_path / "legacy.pt"))
    assert (model.n_layers, model.d) == (2, 32)


def test_namespace_model_cfg_inside_cfg_loads(tmp_path):
    """fairseq's converted legacy checkpoints keep the args Namespace as cfg.model."""
    args = argparse.Namespace(arch="wav2vec2_cmsc", **{k: v for k, v in TINY_CFG.items() if k != "_name"})
    torch.save({"args": None, "cfg": {"model": args, "task": None}, "model": tiny_state()}, tmp_path / "ns.pt")
    assert ecg_fm.load_checkpoint(str(tmp_path / "ns.pt")).n_layers == 2


def test_anything_outside_the_allow_list_is_still_refused(tmp_path):
    torch.save({"cfg": {"model": dict(TINY_CFG)}, "model": tiny_state(), "when": datetime.datetime(2024, 1, 1)},
               tmp_path / "odd.pt")
    with pytest.raises(CheckpointError, match="datetime"):
        ecg_fm.load_checkpoint(str(tmp_path / "odd.pt"))
    names = {g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}" for g in FAIRSEQ_GLOBALS}
    assert "argparse.Namespace" in names
    assert not any(n.startswith(("builtins.eval", "builtins.exec", "os.", "subprocess")) for n in names)


def test_parametrized_weight_norm_names_load_too(tmp_path):
    state = tiny_state()
    renamed = {k.replace(".weight_g", ".parametrizations.weight.original0")
                .replace(".weight_v", ".parametrizations.weight.original1"): v for k, v in state.items()}
    assert renamed != state
    model = ecg_fm.load_checkpoint(save_fairseq(tmp_path / "new.pt", renamed))
    assert torch.equal(model.model.conv_pos.pos_conv[0].weight_g, state["conv_pos.pos_conv.0.weight_g"])


def test_renamed_key_fails_naming_it(tmp_path):
    state = tiny_state()
    state["encoder.layers.1.fc1.weight_renamed"] = state.pop("encoder.layers.1.fc1.weight")
    path = save_fairseq(tmp_path / "bad.pt", state)
    with pytest.raises(CheckpointError, match=r"missing \[encoder\.layers\.1\.fc1\.weight\]") as err:
        build_encoder(EncoderSpec("ecg_fm", checkpoint=path))
    assert "encoder.layers.1.fc1.weight_renamed" in str(err.value) and "bad.pt" in str(err.value)


def test_wrong_shape_and_wrong_format_fail_clearly(tmp_path):
    state = tiny_state()
    state["final_proj.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match="final_proj.weight"):
        ecg_fm.load_checkpoint(save_fairseq(tmp_path / "shape.pt", state))
    torch.save(tiny_state(), tmp_path / "flat.pt")
    with pytest.raises(CheckpointError, match="'cfg' and 'model'"):
        ecg_fm.load_checkpoint(str(tmp_path / "flat.pt"))
    finetuned = dict(TINY_CFG, _name="ecg_transformer_classifier")
    with pytest.raises(CheckpointError, match="finetuned"):
        ecg_fm.load_checkpoint(save_fairseq(tmp_path / "ft.pt", tiny_state(), finetuned))
    with pytest.raises(CheckpointError, match="target_glu"):
        ecg_fm.load_checkpoint(save_fairseq(tmp_path / "glu.pt", tiny_state(), dict(TINY_CFG, target_glu=True)))
    with pytest.raises(CheckpointError, match="not found"):
        ecg_fm.load_checkpoint(str(tmp_path / "absent.pt"))


# ---------------------------------------------------------------- preprocessing

def test_native_is_the_first_5s_segment_of_the_record_zscored_as_a_whole():
    model = build_encoder(EncoderSpec("ecg_fm"))
    ramp = np.tile(np.linspace(-1.0, 3.0, 5000, dtype=np.float32), (12, 1))
    x = model.preprocess(ramp, 500)
    assert x.shape == (12, 2500) and x.dtype == np.float32
    full = (ramp - ramp.mean(axis=1, keepdims=True)) / ramp.std(axis=1, keepdims=True)
    np.testing.assert_allclose(x, full[:, :2500], atol=1e-5)
    assert model.preprocess(record(t=1000), 100).shape == (12, 2500)  # 10 s at 100 Hz -> 500 Hz


def test_linear_resample_is_fairseq_signals_interpolation():
    # 5 samples at 1 Hz -> int(5 * 2) = 10 samples; the old grid 0..4 is stretched over 0..9 (step 2.25)
    x = np.array([[0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0, 1.0]], dtype=np.float32)
    y = linear_resample(x, 1, 2)
    np.testing.assert_allclose(y[0], np.arange(10) / 2.25, rtol=1e-6)
    np.testing.assert_allclose(y[1], 1.0)
    assert linear_resample(np.zeros((12, 1000), np.float32), 100, 500).shape == (12, 5000)
    assert np.array_equal(linear_resample(x, 3, 3), x)


def test_native_standardization_is_fairseq_signals_lead_std_divide():
    x = np.stack([np.linspace(-1, 3, 50), np.full(50, 2.5), np.zeros(50)])
    y = standardize_leads(x)
    np.testing.assert_allclose(y[0], (x[0] - x[0].mean()) / x[0].std())
    assert y.dtype == np.float64 and np.array_equal(y[1:], np.zeros((2, 50)))  # std-0 leads -> 0 ('zero' strategy)


def test_native_pooling_divides_by_the_non_zero_count():
    h = torch.tensor([[[1.0, 0.0], [3.0, 0.0], [0.0, 0.0]]])  # [B=1, T=3, D=2]
    assert torch.equal(nonzero_mean(h), torch.tensor([[2.0, 0.0]]))  # (1 + 3) / 2; all-zero feature -> 0
    g = torch.randn(2, 7, 5)
    torch.testing.assert_close(nonzero_mean(g), g.mean(dim=1))  # no exact zeros: the plain mean


def test_published_profile_feeds_10s_zscored_per_lead():
    model = build_encoder(EncoderSpec("ecg_fm", profile="published"))
    for t, fs in ((5000, 500), (1000, 100)):
        x = model.preprocess(record(t=t) * 3 + 1, fs)
        assert x.shape == (12, 5000) and x.dtype == np.float32
        np.testing.assert_allclose(x.mean(axis=1), 0, atol=1e-5)
        np.testing.assert_allclose(x.std(axis=1), 1, atol=1e-4)


# ---------------------------------------------------------------- states and determinism

def test_wrong_input_shape_names_model_and_profile():
    model = build_encoder(EncoderSpec("ecg_fm"))
    with pytest.raises(ValueError, match=r"ECG-FM \(native profile\).*\[B, 12, 2500\]"):
        model.layer_states(torch.zeros(1, 12, 5000))


@pytest.mark.slow
def test_full_size_states():
    model = build_encoder(EncoderSpec("ecg_fm", size="full"))
    assert (model.n_layers, model.d) == (12, 768)
    x = torch.from_numpy(np.stack([model.preprocess(record(s), 500) for s in (0, 1)]))
    s = model.layer_states(x)
    assert s.shape == (12, 2, 768) and torch.isfinite(s).all()
    torch.testing.assert_close(s[:, :1], model.layer_states(x[:1]), rtol=1e-4, atol=1e-5)  # batch-independent

