"""HuBERT-ECG adapter: HuggingFace folder (save_pretrained / safetensors / .bin), strict keys, states, preprocessing."""

from __future__ import annotations

import argparse
import json
import sys
import types

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import HubertConfig, HubertModel

from raybench.encoders.base import CheckpointError, EncoderSpec, build_encoder
from raybench.encoders.models import hubert_ecg
from raybench.encoders.models.wav2vec2_io import scale_minus1_1

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48, conv_dim=(16,) * 5,
            conv_kernel=(10, 3, 3, 2, 2), conv_stride=(4, 2, 2, 2, 2), num_conv_pos_embeddings=8,
            num_conv_pos_embedding_groups=2, classifier_proj_size=8, mask_time_prob=0.3)


def upstream_model(seed: int = 1) -> HubertModel:
    torch.manual_seed(seed)
    return HubertModel(HubertConfig(**TINY)).eval()


def record(seed: int = 0, t: int = 5000) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((12, t)).astype(np.float32)


def batch(model, seeds=(0, 1)) -> torch.Tensor:
    return torch.from_numpy(np.stack([model.preprocess(record(s), 500) for s in seeds]))


def hubert_ecg_folder(path, heads: bool = True, fmt: str = "safetensors", legacy: bool = False):
    """Upstream HuBERTECG layout: config.json (model_type hubert_ecg, vocab_sizes) + weights incl. heads."""
    ref = upstream_model()
    state = {k: v.clone().contiguous() for k, v in ref.state_dict().items()}
    if legacy:  # torch.nn.utils.weight_norm names, as older transformers saved them
        state = {k.replace("parametrizations.weight.original0", "weight_g")
                 .replace("parametrizations.weight.original1", "weight_v"): v for k, v in state.items()}
    g = torch.Generator().manual_seed(3)
    if heads:
        for i, v in enumerate((10, 12)):
            state[f"final_proj.{i}.weight"] = torch.randn(8, 32, generator=g)
            state[f"final_proj.{i}.bias"] = torch.randn(8, generator=g)
            state[f"label_embedding.{i}.weight"] = torch.randn(v, 8, generator=g)
    path.mkdir()
    cfg = ref.config.to_dict() | {"model_type": "hubert_ecg", "architectures": ["HuBERTECG"],
                                  "auto_map": {"AutoConfig": "hubert_ecg.HuBERTECGConfig",
                                               "AutoModel": "hubert_ecg.HuBERTECG"}}
    if heads:
        cfg |= {"ensemble_length": 2, "vocab_sizes": [10, 12]}
    (path / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        save_file(state, str(path / "model.safetensors"))
    else:
        torch.save(state, path / "pytorch_model.bin")
    return ref, state


def reference_states(ref: HubertModel, x: torch.Tensor) -> torch.Tensor:
    """Layer outputs captured by forward hooks on each encoder layer (independent of hidden_states)."""
    got = []
    hooks = [layer.register_forward_hook(lambda m, i, o: got.append(o[0] if isinstance(o, tuple) else o))
             for layer in ref.encoder.layers]
    with torch.no_grad():
        ref(x)
    for h in hooks:
        h.remove()
    return torch.stack([h.mean(dim=1) for h in got])


# ---------------------------------------------------------------- checkpoint loading

def test_save_pretrained_folder_loads_strictly(tmp_path):
    ref = upstream_model()
    ref.save_pretrained(tmp_path / "hubert-ecg-base")
    assert (tmp_path / "hubert-ecg-base" / "model.safetensors").exists()
    model = build_encoder(EncoderSpec("hubert_ecg", size="full", checkpoint=str(tmp_path / "hubert-ecg-base"),
                                      init_seed=8))
    assert (model.n_layers, model.d) == (2, 32) and model.heads is None
    for k, v in ref.state_dict().items():
        assert torch.equal(model.hubert.state_dict()[k], v), k
    x = batch(model)
    s = model.layer_states(x)
    assert s.shape == (2, 2, 32)
    torch.testing.assert_close(s, reference_states(ref, x))  # entry i + 1 of hidden_states = layer i


@pytest.mark.parametrize("fmt,legacy", [("safetensors", False), ("bin", False), ("safetensors", True)])
def test_hubert_ecg_folder_with_pretraining_heads(tmp_path, fmt, legacy):
    ref, state = hubert_ecg_folder(tmp_path / "ckpt", fmt=fmt, legacy=legacy)
    model = hubert_ecg.load_pretrained(tmp_path / "ckpt")
    assert torch.equal(model.heads.label_embedding[1].weight, state["label_embedding.1.weight"])
    assert torch.equal(model.heads.final_proj[0].bias, state["final_proj.0.bias"])
    model.profile = "published"
    x = batch(model)
    torch.testing.assert_close(model.layer_states(x), reference_states(ref, x))


def test_renamed_key_fails_naming_it(tmp_path):
    ref = upstream_model()
    state = {k: v.contiguous() for k, v in ref.state_dict().items()}
    state["encoder.layers.1.feed_forward.output_dense.weight_x"] = state.pop(
        "encoder.layers.1.feed_forward.output_dense.weight")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "config.json").write_text(ref.config.to_json_string())
    save_file(state, str(tmp_path / "ck" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"output_dense\.weight_x") as err:
        build_encoder(EncoderSpec("hubert_ecg", checkpoint=str(tmp_path / "ck")))
    assert "missing [encoder.layers.1.feed_forward.output_dense.weight]" in str(err.value)


def test_heads_without_vocab_config_and_missing_heads_fail(tmp_path):
    _, state = hubert_ecg_folder(tmp_path / "a")
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    del cfg["vocab_sizes"], cfg["ensemble_length"]
    (tmp_path / "a" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="final_proj.0.bias"):
        hubert_ecg.load_pretrained(tmp_path / "a")
    hubert_ecg_folder(tmp_path / "b", heads=False)
    cfg = json.loads((tmp_path / "b" / "config.json").read_text()) | {"vocab_sizes": [10], "ensemble_length": 1}
    (tmp_path / "b" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"missing \[final_proj.0.bias"):
        hubert_ecg.load_pretrained(tmp_path / "b")


def test_bad_folders_fail_clearly(tmp_path):
    with pytest.raises(CheckpointError, match="no config.json"):
        hubert_ecg.load_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(CheckpointError, match="model_type 'bert'"):
        hubert_ecg.load_pretrained(tmp_path)
    upstream_model().config.to_json_file(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        hubert_ecg.load_pretrained(tmp_path)


# ---------------------------------------------------------------- training checkpoints (.pt)

def fake_upstream_module(monkeypatch) -> type:
    """A stand-in for upstream's `code/hubert_ecg.py` module, so torch.save pickles `hubert_ecg.HuBERTECGConfig`."""
    mod = types.ModuleType("hubert_ecg")

    class HuBERTECGConfig(HubertConfig):
        model_type = "hubert_ecg"

        def __init__(self, ensemble_length: int = 1, vocab_sizes: list | None = None, **kwargs):
            super().__init__(**kwargs)
            self.ensemble_length = ensemble_length
            self.vocab_sizes = vocab_sizes or [100]

    HuBERTECGConfig.__module__ = "hubert_ecg"
    HuBERTECGConfig.__qualname__ = "HuBERTECGConfig"
    mod.HuBERTECGConfig = HuBERTECGConfig
    monkeypatch.setitem(sys.modules, "hubert_ecg", mod)
    return HuBERTECGConfig


def training_checkpoint(path, config, state: dict, **extra) -> None:
    """What upstream's pretrain.py saves: model_config (pickled object), state dicts of model/optimizer/scheduler."""
    params = [torch.nn.Parameter(v.clone()) for v in state.values() if v.is_floating_point()][:3]
    opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98))
    sum(p.sum() for p in params).backward()
    opt.step()
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    torch.save({"global_step": 7, "patience_count": 0, "model_config": config, "model_state_dict": state,
                "optimizer_state_dict": opt.state_dict(), "best_val_loss": 0.5,
                "lr_scheduler_state_dict": sched.state_dict(), "best_val_accuracy": 0.25,
                "pretraining_vocab_sizes": [10, 12], **extra}, path)


def test_training_pt_with_pickled_config_loads_safely(tmp_path, monkeypatch):
    ref, state = hubert_ecg_folder(tmp_path / "hf")  # body + heads (vocab 10, 12)
    cls = fake_upstream_module(monkeypatch)
    cfg = cls(ensemble_length=2, vocab_sizes=[10, 12], **{k: v for k, v in TINY.items()})
    training_checkpoint(tmp_path / "hubert_1_iteration_7_abc.pt", cfg, state)
    monkeypatch.delitem(sys.modules, "hubert_ecg")  # raybench needs none of upstream's code
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "hubert_1_iteration_7_abc.pt") == [
        "hubert_ecg.HuBERTECGConfig"]
    model = build_encoder(EncoderSpec("hubert_ecg", checkpoint=str(tmp_path / "hubert_1_iteration_7_abc.pt")))
    assert (model.n_layers, model.d) == (2, 32)
    assert torch.equal(model.heads.label_embedding[1].weight, state["label_embedding.1.weight"])
    assert list(model.hubert.config.conv_kernel) == [10, 3, 3, 2, 2]
    x = batch(model)
    torch.testing.assert_close(model.layer_states(x), reference_states(ref, x))


def test_training_pt_of_older_code_pickles_hubert_config(tmp_path):
    """Older upstream runs pickled transformers' HubertConfig (no vocab_sizes): head sizes come from the weights."""
    ref, state = hubert_ecg_folder(tmp_path / "hf")
    training_checkpoint(tmp_path / "old.pt", HubertConfig(**TINY), state)
    model = hubert_ecg.load_pretrained(tmp_path / "old.pt")
    assert [e.num_embeddings for e in model.heads.label_embedding] == [10, 12]
    x = batch(model)
    torch.testing.assert_close(model.layer_states(x), reference_states(ref, x))


def test_finetuned_pt_loads_backbone_and_drops_classifier_by_name(tmp_path, monkeypatch):
    ref, state = hubert_ecg_folder(tmp_path / "hf", heads=False)
    cls = fake_upstream_module(monkeypatch)
    tuned = {f"hubert_ecg.{k}": v for k, v in state.items()}
    tuned |= {"classifier.weight": torch.randn(5, 32), "classifier.bias": torch.randn(5)}
    training_checkpoint(tmp_path / "tuned.pt", cls(vocab_sizes=[100], **TINY), tuned, linear=True,
                        finetuning_vocab_size=5, use_label_embedding=False)
    model = hubert_ecg.load_pretrained(tmp_path / "tuned.pt")
    assert model.heads is None
    x = batch(model)
    torch.testing.assert_close(model.layer_states(x), reference_states(ref, x))
    tuned["hubert_ecg.extra.weight"] = torch.zeros(1)  # anything else must match
    training_checkpoint(tmp_path / "bad.pt", cls(vocab_sizes=[100], **TINY), tuned)
    with pytest.raises(CheckpointError, match=r"unexpected \[extra\.weight\]"):
        hubert_ecg.load_pretrained(tmp_path / "bad.pt")


def test_training_pt_with_other_objects_is_refused_by_name(tmp_path, monkeypatch):
    _, state = hubert_ecg_folder(tmp_path / "hf")
    cls = fake_upstream_module(monkeypatch)
    training_checkpoint(tmp_path / "args.pt", cls(vocab_sizes=[10, 12], ensemble_length=2, **TINY), state,
                        args=argparse.Namespace(lr=1e-4))
    with pytest.raises(CheckpointError, match=r"weights_only=True.*argparse\.Namespace"):
        hubert_ecg.load_pretrained(tmp_path / "args.pt")
    torch.save({"model_state_dict": state}, tmp_path / "no_config.pt")
    with pytest.raises(CheckpointError, match="model_config"):
        hubert_ecg.load_pretrained(tmp_path / "no_config.pt")


# ---------------------------------------------------------------- preprocessing

def test_minmax_scaling_hand_case():
    x = np.array([[0.0, 5.0, 10.0], [-2.0, -1.0, 0.0]], dtype=np.float32)
    np.testing.assert_allclose(scale_minus1_1(x), [[-1, 0, 1], [-1, 0, 1]], atol=1e-6)


def test_native_is_5s_flattened_at_100hz():
    model = build_encoder(EncoderSpec("hubert_ecg"))
    for t, fs in ((5000, 500), (1000, 100), (2500, 250)):
        x = model.preprocess(record(t=t), fs)
        assert x.shape == (6000,) and x.dtype == np.float32
    # lead-major flattening: lead k occupies samples [500 k, 500 (k + 1)); a lead scaled to [-1, 1] stays there
    t = np.arange(5000) / 500
    sig = np.stack([np.sin(2 * np.pi * (1 + k) * t) * (k + 1) for k in range(12)]).astype(np.float32)
    x = model.preprocess(sig, 500).reshape(12, 500)
    assert np.abs(x).max() < 1.1
    # 4-s window, 0.25 Hz bins; DC left out (band-pass edge transients shift the min-max scaling's centre)
    peaks = 1 + np.abs(np.fft.rfft(x[:, 50:450], axis=1))[:, 1:].argmax(axis=1)
    np.testing.assert_array_equal(peaks, 4 * (1 + np.arange(12)))


def test_published_is_12x2500_zscored_and_flattened():
    model = build_encoder(EncoderSpec("hubert_ecg", profile="published"))
    for t, fs in ((5000, 500), (1000, 100)):
        x = model.preprocess(record(t=t) * 3 + 2, fs)
        assert x.shape == (30000,) and x.dtype == np.float32
        leads = x.reshape(12, 2500)
        np.testing.assert_allclose(leads.mean(axis=1), 0, atol=1e-5)
        np.testing.assert_allclose(leads.std(axis=1), 1, atol=1e-4)


# ---------------------------------------------------------------- states and determinism

def test_wrong_input_shape_names_model_and_profile():
    model = build_encoder(EncoderSpec("hubert_ecg", profile="published"))
    with pytest.raises(ValueError, match=r"HuBERT-ECG \(published profile\).*\[B, 30000\]"):
        model.layer_states(torch.zeros(1, 6000))


@pytest.mark.slow
def test_full_size_states():
    model = build_encoder(EncoderSpec("hubert_ecg", size="full"))
    assert (model.n_layers, model.d) == (12, 768)
    # base model: 93M parameters with its heads; without them ~92.8M
    assert round(sum(p.numel() for p in model.parameters()) / 1e6) == 93
    x = batch(model)
    s = model.layer_states(x)
    assert s.shape == (12, 2, 768) and torch.isfinite(s).all()


def test_sharded_safetensors_folder_loads(tmp_path):
    ref, state = hubert_ecg_folder(tmp_path / "ck", heads=False)
    (tmp_path / "ck" / "model.safetensors").unlink()
    keys = sorted(state)
    shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
    for name, part in shards.items():
        save_file({k: state[k] for k in part}, str(tmp_path / "ck" / name))
    index = {"metadata": {}, "weight_map": {k: name for name, part in shards.items() for k in part}}
    (tmp_path / "ck" / "model.safetensors.index.json").write_text(json.dumps(index))
    model = hubert_ecg.load_pretrained(tmp_path / "ck")
    for k, v in ref.state_dict().items():
        assert torch.equal(model.hubert.state_dict()[k], v), k

