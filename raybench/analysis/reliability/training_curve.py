"""Metrics through training (docs/protocol.md §11.5): retrain sampled stacks and evaluate snapshots.

The learning rate is constant and the batch samplers depend only on the seed, so training a stack again with its
own configs follows the stored cells' trajectory step for step; snapshots come from train_stack's own
checkpoint hook (`on_checkpoint` every gcd of the snapshot steps), step 0 is the trainer's initialization. The
final snapshot is compared with the stored weights (`max_abs_diff_final`). One Ray task per stack.
"""

from __future__ import annotations

import json
import math
from functools import reduce
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import torch

from raybench.analysis.inference.bootstrap import run_bounded
from raybench.analysis.inference.metrics import reproducibility
from raybench.analysis.reliability.panel import PANEL_METRICS
from raybench.core.config import Protocol
from raybench.sae.cell_files import load_cell_sae
from raybench.sae.data import load_cell_data
from raybench.sae.evaluate import evaluate_cell
from raybench.sae.model import SAECellConfig, StackedBatchTopKSAE
from raybench.sae.train import train_stack

COLUMNS = ["model", "q", "expansion", "seed", "fraction", "step", "metric", "value"]
SUMMARY_COLUMNS = ["metric", "rises_fraction", "rho_step", "n_series", "max_abs_diff_final"]
HIGHER_IS_BETTER = {"reconstruction": True, "accessibility": True, "coverage": True, "dead_fraction": False,
                    "reproducibility": True}


def snapshot_steps(steps: int, fractions: tuple[float, ...]) -> list[int]:
    return sorted({int(round(f * steps)) for f in fractions})


@ray.remote(num_cpus=1)
def _stack_task(root: str, cell_dirs: list[str], protocol: Protocol, fractions: tuple[float, ...]) -> dict:
    torch.set_num_threads(1)
    cfg_rows = [json.loads((Path(root) / c / "cfg.json").read_text()) for c in cell_dirs]
    names = {f for f in SAECellConfig.__dataclass_fields__}
    cfgs = [SAECellConfig(**{k: v for k, v in c.items() if k in names}) for c in cfg_rows]
    c0 = cfg_rows[0]
    data = load_cell_data(root, c0["model"], int(c0["layer"]), protocol.eval)
    steps = cfgs[0].steps
    want = snapshot_steps(steps, fractions)
    inner = [s for s in want if 0 < s < steps]
    every = reduce(math.gcd, inner) if inner else 0
    snaps: dict[int, dict] = {}

    def grab(step: int, state: dict) -> None:
        if step in want:
            snaps[step] = {k: v.clone() for k, v in state["weights"].items()}

    res = train_stack(data.acts["train"], cfgs, on_checkpoint=grab, checkpoint_every=every, implementation="auto")
    snaps[steps] = {n: getattr(res.sae, n).detach().clone() for n in ("W_enc", "b_enc", "W_dec_t", "b_dec")}
    init = StackedBatchTopKSAE.from_seeds([c.seed for c in cfgs], cfgs[0].d, cfgs[0].n_latents, cfgs[0].k)
    snaps[0] = {n: getattr(init, n).detach().clone() for n in ("W_enc", "b_enc", "W_dec_t", "b_dec")}
    stored = [load_cell_sae(Path(root) / c).sae for c in cell_dirs]
    diff = max(float((snaps[steps]["W_dec_t"][i] - s.W_dec_t[0]).abs().max()) for i, s in enumerate(stored))
    rows = []
    for step in want:
        sae = StackedBatchTopKSAE(len(cfgs), cfgs[0].d, cfgs[0].n_latents, cfgs[0].k)
        with torch.no_grad():
            for n, t in snaps[step].items():
                getattr(sae, n).copy_(t)
        decs = []
        for i, c in enumerate(cfgs):
            ev = evaluate_cell(sae, res.normalizer, data.acts, data.concepts, data.test_patient_codes,
                               data.selection_idx, protocol.eval, index=i, n_patients=len(data.test_patients),
                               selection_present=data.selection_present)
            decs.append(ev.decoder_top)
            rows += [(c0["model"], float(c0["q"]), int(c0["expansion"]), c.seed, step / steps, step, name,
                      float(ev.metrics[key])) for name, key in PANEL_METRICS.items()]
        if len(decs) >= 2 and min(d.shape[1] for d in decs) >= 1:
            ex = reproducibility(decs, protocol.eval.repro_top, protocol.eval.repro_permutations,
                                 protocol.inference.seed)["excess"]
            rows.append((c0["model"], float(c0["q"]), int(c0["expansion"]), -1, step / steps, step,
                         "reproducibility", float(ex)))
    return {"rows": rows, "max_abs_diff_final": diff}


def training_curves(root: Path, stacks: list[pd.DataFrame], protocol: Protocol, fractions: tuple[float, ...],
                    num_workers: int | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """-> (long table of every snapshot's metrics, per-metric summary)."""
    jobs = [lambda s=s: _stack_task.remote(str(root), [str(c) for c in s.cell_dir], protocol, tuple(fractions))
            for s in stacks]
    results = run_bounded(jobs, num_workers)
    long = pd.DataFrame([r for res in results for r in res["rows"]], columns=COLUMNS)
    diff = max((res["max_abs_diff_final"] for res in results), default=float("nan"))
    return long, summarize(long, diff)


def summarize(long: pd.DataFrame, max_abs_diff_final: float = float("nan")) -> pd.DataFrame:
    """Per metric: the fraction of series (one per cell, or per stack for reproducibility) that never fall from
    one snapshot to the next (in the metric's better direction; ties count as not falling), and the mean Spearman
    rho of the metric with the step."""
    from scipy.stats import spearmanr

    rows = []
    for metric, sub in long.groupby("metric", sort=False):
        sign = 1.0 if HIGHER_IS_BETTER.get(metric, True) else -1.0
        rises, rhos = [], []
        for _, s in sub.groupby(["model", "q", "expansion", "seed"]):
            v = sign * s.sort_values("step").value.to_numpy(float)
            rises.append(bool(np.all(np.diff(v) >= -1e-12)))
            if np.ptp(v) > 0:
                rhos.append(spearmanr(s.sort_values("step").step, v).statistic)
        rows.append((metric, float(np.mean(rises)) if rises else np.nan,
                     float(np.mean(rhos)) if rhos else np.nan, len(rises), max_abs_diff_final))
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
