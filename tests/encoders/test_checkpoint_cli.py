"""`raybench checkpoint inspect FILE --model NAME` on fake files of each upstream format (issue 12, item 3).

Formats: a fairseq `.pt` carrying omegaconf / argparse / numpy objects (ECG-FM), HuBERT-ECG's training `.pt`
(pickled `model_config`) and its HuggingFace folder (safetensors), plain torch dicts (`{'model': ...}` ST-MEM,
`{'encoder': ...}` ECG-JEPA), flat state dicts with a DataParallel prefix and extra branches (CARDIAC-FM, CSFM),
a single `.safetensors` file. Both report paths (the adapter's own, and the generic key/shape comparison).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import save_file
from test_hubert_ecg import TINY, fake_upstream_module, hubert_ecg_folder, training_checkpoint

from raybench.app.cli import main
from raybench.encoders import checkpoint_cli
from raybench.encoders.base import EncoderSpec, build_encoder

FAIRSEQ_FAKE = Path(__file__).resolve().parents[1] / "parity" / "fairseq_ckpt_dictconfig.pt"


def run(*args: str):
    return CliRunner().invoke(main, ["checkpoint", "inspect", *args])


def demo_state(name: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in build_encoder(EncoderSpec(name, size="demo")).state_dict().items()}


def test_fairseq_file_with_cfg_objects(tmp_path):
    if not FAIRSEQ_FAKE.exists():
        pytest.skip(f"{FAIRSEQ_FAKE} not generated")
    res = run(str(FAIRSEQ_FAKE), "--model", "ecg_fm")
    assert res.exit_code == 0, res.output
    assert "ecg_fm (adapter report)" in res.output and "verdict        loads strictly" in res.output
    assert "missing        0" in res.output and "published      90.9M" in res.output
    # generic: the cfg objects are read as inert placeholders (never imported), the tensors compared with the
    # demo architecture, which the 2-layer fake does not match: reported, exit 1
    res = run(str(FAIRSEQ_FAKE), "--model", "ecg_fm", "--generic", "--size", "demo", "--json")
    assert res.exit_code == 1, res.output
    report = json.loads(res.output)
    assert report["path_used"] == "generic" and report["shape_mismatch"] and not report["loads"]
    assert any(x.startswith("object omegaconf.") for x in report["dropped"]["not_tensors"])
    assert report["prefixes"] == {"file": "", "model": ""}  # the file's 'model' entry = the adapter's `model`


def test_hubert_training_pt_and_folder(tmp_path, monkeypatch):
    ref, state = hubert_ecg_folder(tmp_path / "hf")
    cls = fake_upstream_module(monkeypatch)
    training_checkpoint(tmp_path / "hubert.pt", cls(ensemble_length=2, vocab_sizes=[10, 12], **TINY), state)
    monkeypatch.delitem(sys.modules, "hubert_ecg")
    n_model = sum(v.numel() for v in state.values())
    for path in (tmp_path / "hubert.pt", tmp_path / "hf"):
        res = run(str(path), "--model", "hubert_ecg", "--json")
        assert res.exit_code == 0, res.output
        report = json.loads(res.output)
        assert report["loads"] and report["n_params"] == report["n_params_model"] == n_model
        assert report["n_params_backbone"] == sum(v.numel() for v in ref.state_dict().values())
        assert report["published_params"] == 92_798_848
    text = run(str(tmp_path / "hubert.pt"), "--model", "hubert_ecg").output
    assert "training .pt: HuBERTECG" in text and "vocab_sizes [10, 12]" in text
    # a renamed key is named, on both sides, and the exit status says it would not load
    state["encoder.layers.0.final_layer_norm.bias_x"] = state.pop("encoder.layers.0.final_layer_norm.bias")
    (tmp_path / "hf" / "model.safetensors").unlink()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "hf" / "model.safetensors"))
    res = run(str(tmp_path / "hf"), "--model", "hubert_ecg")
    assert res.exit_code == 1
    assert "missing        1: encoder.layers.0.final_layer_norm.bias" in res.output
    assert "extra          1: encoder.layers.0.final_layer_norm.bias_x" in res.output
    assert "would NOT load" in res.output


@pytest.mark.parametrize("name,wrap", [
    ("st_mem", lambda s: {"model": s, "epoch": 3}),
    ("ecg_jepa", lambda s: {"encoder": s, "predictor": {"w": torch.zeros(2)}, "epoch": 100}),
])
def test_plain_torch_dicts_adapter_and_generic(tmp_path, name, wrap):
    path = tmp_path / f"{name}.pth"
    torch.save(wrap(demo_state(name)), path)
    res = run(str(path), "--model", name, "--size", "demo")
    assert res.exit_code == 0, res.output
    assert f"{name} (adapter report)" in res.output and "loads strictly" in res.output
    res = run(str(path), "--model", name, "--size", "demo", "--generic", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["prefixes"]["file"] == ("model." if name == "st_mem" else "encoder.")
    assert report["n_params"] == report["n_params_model"] > 0 and report["published_params"] > 80e6


def test_flat_files_with_extra_branches(tmp_path):
    """CARDIAC-FM (DataParallel `module.` keys + the MRI branch): the adapter drops the MRI branch by name; the
    generic comparison, which knows no drop rules, reports those keys as extra and refuses."""
    ecg = demo_state("cardiac_fm")
    flat = {f"module.{k}": v for k, v in ecg.items()}
    flat |= {"module.mri_encoder.conv.weight": torch.zeros(4, 3), "module.mri_projection.bias": torch.zeros(4)}
    torch.save(flat, tmp_path / "model_epoch_10.pth")
    res = run(str(tmp_path / "model_epoch_10.pth"), "--model", "cardiac_fm", "--size", "demo", "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["loads"] and sorted(report["dropped"]["mri_branch"]) == ["mri_encoder.conv.weight",
                                                                           "mri_projection.bias"]
    res = run(str(tmp_path / "model_epoch_10.pth"), "--model", "cardiac_fm", "--size", "demo", "--generic", "--json")
    assert res.exit_code == 1
    report = json.loads(res.output)
    assert report["prefixes"]["file"] == "module." and report["missing"] == []
    assert report["extra"] == ["mri_encoder.conv.weight", "mri_projection.bias"]
    # CSFM: flat `encoder.` keys + its classification head (a named extra group)
    enc = {f"encoder.{k}": v for k, v in demo_state("csfm").items()}
    enc |= {"encoder.mlp_head.0.weight": torch.zeros(2, 2)}
    torch.save(enc, tmp_path / "csfm.pth")
    res = run(str(tmp_path / "csfm.pth"), "--model", "csfm", "--size", "demo")
    assert res.exit_code == 0, res.output
    assert "dropped" in res.output and "mlp_head" in res.output


def test_single_safetensors_file_generic(tmp_path):
    save_file({f"encoder.{k}": v.contiguous() for k, v in demo_state("ecg_jepa").items()},
              str(tmp_path / "jepa.safetensors"))
    report = checkpoint_cli.inspect(str(tmp_path / "jepa.safetensors"), "ecg_jepa", size="demo", generic=True)
    assert report["loads"] and report["prefixes"] == {"file": "encoder.", "model": ""}


def test_full_size_comparison_reports_shapes_and_counts(tmp_path):
    """A demo-size file against the published (full) architecture: every tensor's shape is reported, and the
    loaded parameter count (0) against the published one."""
    torch.save({"model": demo_state("st_mem")}, tmp_path / "small.pth")
    res = run(str(tmp_path / "small.pth"), "--model", "st_mem")
    assert res.exit_code == 1
    assert "shape mismatch" in res.output and "would NOT load" in res.output and "published" in res.output


def test_bad_invocations_are_one_line_errors(tmp_path):
    res = run(str(tmp_path), "--model", "nope")
    assert res.exit_code == 2 and "unknown model 'nope'" in res.output
    (tmp_path / "x.pt").write_bytes(b"not a checkpoint")
    res = run(str(tmp_path / "x.pt"), "--model", "st_mem", "--generic")
    assert res.exit_code == 2 and res.output.startswith("Error:")
