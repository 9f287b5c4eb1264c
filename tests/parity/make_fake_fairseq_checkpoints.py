"""Tiny fairseq-format ECG-FM checkpoints that carry what real files carry (issue 12, item 3).

A published fairseq checkpoint that was loaded with fairseq(-signals)' `checkpoint_utils.load_checkpoint_to_cpu`
and saved again (the usual way a file is slimmed for release) holds `cfg` as an omegaconf DictConfig; legacy
files hold an `argparse.Namespace` under `args`; optimizer history and extra state hold numpy scalars.
`torch.load(weights_only=True)` refuses each of these. This script writes such files with a 2-layer, 32-wide
wav2vec2_cmsc and `weights.det_state_dict(..., seed=1211)` weights (legacy weight-norm key names):

  --fairseq-signals DIR   build the model with fairseq-signals, write the checkpoint as its trainer does,
                          then load it with its own `load_checkpoint_to_cpu` and `torch.save` the result
                          (cfg becomes a DictConfig, with the omegaconf installed: 2.3 here);
  (no --fairseq-signals)  with the omegaconf in this environment (2.0.6 is fairseq-signals' pin): the cfg
                          turned into a DictConfig the way `load_checkpoint_to_cpu` does
                          (OmegaConf.create + set_struct), plus a legacy `args` Namespace.

The model cfg and the parameter shapes are the ones fairseq-signals produced: the first mode writes them to
--spec (a scratch JSON file), the second reads them. See tests/parity/README.md for the commands.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
SEED = 1211
TINY = {"_name": "wav2vec2_cmsc", "conv_feature_layers": "[(16, 2, 2)] * 2", "encoder_embed_dim": 32,
        "encoder_ffn_embed_dim": 64, "encoder_attention_heads": 2, "encoder_layers": 2, "conv_pos": 8,
        "conv_pos_groups": 2, "final_dim": 8, "latent_vars": 4, "latent_groups": 2, "in_d": 12,
        "apply_mask": True, "quantize_targets": True}


def extras() -> dict:
    """Trainer-style bookkeeping with numpy scalars, as real files have them."""
    return {
        "criterion": None,
        "optimizer_history": [{"criterion_name": "Wav2Vec2WithCMSCCriterion", "optimizer_name": "FairseqAdam",
                               "lr_scheduler_state": {"best": np.float64(2.4172)}, "num_updates": np.int64(41000)}],
        "task_state": {},
        "extra_state": {"train_iterator": {"epoch": 14, "iterations_in_epoch": 0}, "val_loss": np.float32(2.41),
                        "previous_training_time": 123456.5},
    }


def with_fairseq_signals(root: Path, out: Path, spec: Path) -> None:
    sys.path.insert(0, str(HERE))
    from make_fixtures_encoders_fairseq import det_weights, install_shims

    install_shims()
    sys.path.insert(0, str(root))
    from fairseq_signals.models import build_model
    from fairseq_signals.utils import checkpoint_utils
    from omegaconf import OmegaConf

    model = build_model(dict(TINY), task=None)
    root_cfg = OmegaConf.create({"model": model.cfg, "task": {"normalize": False, "filter": False, "data": "/d"}})
    model_cfg = OmegaConf.to_container(root_cfg.model, resolve=True, enum_to_str=True)
    model_cfg["_name"] = TINY["_name"]
    plain = out.with_suffix(".plain.pt")
    torch.save({"args": None, "cfg": {"common": {"seed": 1}, "model": model_cfg,
                                      "task": {"_name": "ecg_pretraining", "sample_rate": 500}},
                "model": det_weights(model.state_dict(), SEED), **extras()}, plain)
    # upstream's loader calls torch.load with torch's default (weights_only=True since 2.6), which refuses
    # the numpy scalars; allow them (our own file) so it can run
    numpy_globals = [np._core.multiarray.scalar, np.dtype, type(np.dtype(np.float64)), type(np.dtype(np.float32)),
                     type(np.dtype(np.int64))]
    with torch.serialization.safe_globals(numpy_globals):
        state = checkpoint_utils.load_checkpoint_to_cpu(str(plain))  # cfg -> DictConfig, as upstream loads it
    plain.unlink()
    assert OmegaConf.is_config(state["cfg"])
    torch.save(state, out)
    shapes = {k: list(v.shape) for k, v in state["model"].items()}
    spec.write_text(json.dumps({"model_cfg": model_cfg, "shapes": shapes}, indent=1, sort_keys=True) + "\n")


def with_omegaconf_only(out: Path, spec: Path) -> None:
    from omegaconf import OmegaConf

    sys.path.insert(0, str(HERE))
    from weights import det_state_dict

    spec = json.loads(spec.read_text())
    model_cfg, shapes = spec["model_cfg"], {k: tuple(v) for k, v in spec["shapes"].items()}
    cfg = OmegaConf.create({"common": {"seed": 1, "fp16": False}, "model": model_cfg,
                            "task": {"_name": "ecg_pretraining", "sample_rate": 500}})
    OmegaConf.set_struct(cfg, True)
    args = argparse.Namespace(arch="wav2vec2_cmsc", task="ecg_pretraining", lr=[5e-5], seed=1)
    torch.save({"args": args, "cfg": cfg, "model": det_state_dict(shapes, SEED), **extras()}, out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fairseq-signals")
    p.add_argument("--out", required=True)
    p.add_argument("--spec", required=True, help="scratch JSON: model cfg + shapes (written with "
                   "--fairseq-signals, read without)")
    a = p.parse_args()
    if a.fairseq_signals:
        with_fairseq_signals(Path(a.fairseq_signals).resolve(), Path(a.out), Path(a.spec))
    else:
        with_omegaconf_only(Path(a.out), Path(a.spec))
    print(f"{a.out}: {Path(a.out).stat().st_size / 1024:.0f} KB")


if __name__ == "__main__":
    main()
