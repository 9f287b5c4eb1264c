"""A cell's folder: the files one trained SAE leaves, written whole into a temp dir and renamed.

A cell folder that exists is complete (raybench.sae.freshness.cell_complete relies on that).

<cell>/sae.safetensors   W_enc [N,d], b_enc [N], W_dec [d,N], b_dec [d], norm_mean [d], norm_std [d]
<cell>/cfg.json          hyperparameters + shapes + normalization note: the SAE is usable on its own
<cell>/metrics.json      CellEval.metrics, selected / r_val / r_test lists, plus `extra`
<cell>/patient_stats.npz n [P], sse [P], sst [P], corr [P, C, 5] (test split, for the bootstrap;
                         raybench.core.sufficient_stats)
<cell>/decoder_top.npz   columns [d, m], idx [m], firing_rate_val [N]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from raybench.core.atomic import atomic_dir, write_json
from raybench.sae.evaluate import CellEval
from raybench.sae.model import Normalizer, StackedBatchTopKSAE

CELL_FILES = ("sae.safetensors", "cfg.json", "metrics.json", "patient_stats.npz", "decoder_top.npz")
FORMAT_VERSION = 1


class CellSAE(NamedTuple):
    """A saved cell's SAE, usable on raw activations: codes of normalizer.apply(x)."""

    sae: StackedBatchTopKSAE
    """The SAE, a stack of one."""
    normalizer: Normalizer
    """Train-split z-scoring of the raw activations (docs/protocol.md §6.1)."""


def save_cell(cell_dir: str | os.PathLike, sae: StackedBatchTopKSAE, cfg: dict, ev: CellEval,
              extra: dict | None = None, *, normalizer: Normalizer) -> Path:
    """Write a complete cell folder atomically (replacing any previous one).

    `normalizer` is stored with the weights so the SAE can be applied to raw activations alone.
    """
    if sae.n_saes != 1:
        raise ValueError(f"save_cell stores one SAE; got a stack of {sae.n_saes} (use sae.single(i))")
    extra = dict(extra or {})
    clash = set(extra) & (set(ev.metrics) | {"selected", "r_val", "r_test"})
    if clash:
        raise ValueError(f"save_cell: extra keys {sorted(clash)} would overwrite metrics")
    cell_dir = Path(cell_dir)
    tensors = {
        "W_enc": sae.W_enc[0], "b_enc": sae.b_enc[0], "W_dec": sae.W_dec[0], "b_dec": sae.b_dec[0],
        "norm_mean": torch.from_numpy(normalizer.mean), "norm_std": torch.from_numpy(normalizer.std),
    }
    tensors = {k: v.detach().cpu().float().contiguous() for k, v in tensors.items()}
    full_cfg = {
        **cfg,
        "format_version": FORMAT_VERSION,
        "d": sae.d, "n_latents": sae.n_latents, "k": sae.k,
        "activation": "BatchTopK: keep the B*k largest of ReLU((x_norm - b_dec) W_enc^T + b_enc) over a batch",
        "decode": "x_norm_hat = z W_dec^T + b_dec; x_hat = x_norm_hat * norm_std + norm_mean",
        "normalization": "x_norm = (x - norm_mean) / norm_std, train-split statistics, std floored "
                         f"at {cfg.get('std_floor', 'std_floor')}",
    }
    metrics = {**ev.metrics, "selected": ev.selected, "r_val": ev.r_val, "r_test": ev.r_test, **extra}
    with atomic_dir(cell_dir) as tmp:
        save_file(tensors, str(tmp / "sae.safetensors"))
        write_json(tmp / "cfg.json", full_cfg)
        write_json(tmp / "metrics.json", metrics)
        np.savez(tmp / "patient_stats.npz", **ev.patient_stats())
        np.savez(tmp / "decoder_top.npz", columns=ev.decoder_top, idx=ev.decoder_top_idx,
                 firing_rate_val=ev.firing_rate_val)
    return cell_dir


def _require(cell_dir: Path, name: str) -> Path:
    path = cell_dir / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the cell folder is incomplete or not a cell; rerun the grid")
    return path


def load_cell_sae(cell_dir: str | os.PathLike) -> CellSAE:
    """The cell's SAE (a stack of one) and the normalizer it applies to raw activations."""
    cell_dir = Path(cell_dir)
    cfg = json.loads(_require(cell_dir, "cfg.json").read_text())
    t = load_file(str(_require(cell_dir, "sae.safetensors")))
    n, d = t["W_enc"].shape
    if (n, d) != (cfg["n_latents"], cfg["d"]) or t["W_dec"].shape != (d, n):
        raise ValueError(f"{cell_dir}: sae.safetensors shapes {tuple(t['W_enc'].shape)} do not match cfg.json "
                         f"(N={cfg['n_latents']}, d={cfg['d']})")
    sae = StackedBatchTopKSAE(1, d, n, int(cfg["k"]))
    with torch.no_grad():
        sae.W_enc[0].copy_(t["W_enc"])
        sae.b_enc[0].copy_(t["b_enc"])
        sae.W_dec_t[0].copy_(t["W_dec"].T)
        sae.b_dec[0].copy_(t["b_dec"])
    return CellSAE(sae, Normalizer(t["norm_mean"].numpy(), t["norm_std"].numpy()))


def load_cell_metrics(cell_dir: str | os.PathLike) -> dict:
    """metrics.json: the cell's metrics, selected coordinates and r lists, and what it was trained on."""
    return json.loads(_require(Path(cell_dir), "metrics.json").read_text())
