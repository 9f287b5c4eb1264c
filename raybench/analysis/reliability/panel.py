"""The ground-truth panel (docs/protocol.md §11.4): SAEs of varying quality at one width, trained with raybench's
own trainer and evaluator on the synthetic model of ground_truth.py, plus controls, scored by raybench's metrics
(panel_score.py) and by ground truth, on the base synthetic model and its variants.

Members differ in steps and k (two seeds each, trained as one stack by raybench.sae.train.train_stack and
evaluated by raybench.sae.evaluate.evaluate_cell, exactly as grid cells are). Controls, reported on their own:
`random_init` (the trainer's initialization), `permuted_decoder` (the longest-trained, largest-k member with its
decoder columns shuffled: GT-MCC cannot see it, GT-F1 and R2 can), `random_dictionary` (random unit decoder rows,
tied encoder, k = that member's L0) and the `oracle` at a member's width (panel_score.oracle_scores). Each member
is a Ray task.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import ray
import torch

from raybench.analysis.inference.bootstrap import run_bounded
from raybench.analysis.inference.metrics import reproducibility
from raybench.analysis.reliability.ground_truth import PAPER_SPEC, SyntheticSpec, synthetic_data, variant_spec
from raybench.analysis.reliability.panel_score import oracle_scores, score_stack, splits, tasks
from raybench.core.config import EvalProtocol, ReliabilityConfig, SAEProtocol
from raybench.sae.model import SAECellConfig, StackedBatchTopKSAE
from raybench.sae.train import train_stack

# raybench metric -> CellEval.metrics key (training_curve.py evaluates snapshots with these)
PANEL_METRICS = {"reconstruction": "test_r2", "accessibility": "test_accessibility", "coverage": "test_coverage",
                 "dead_fraction": "val_dead_fraction"}
SCORED = ("reconstruction", "accessibility", "coverage", "dead_fraction", "accessibility_out", "coverage_out")
COLUMNS = ["variant", "member", "kind", "steps", "expansion", "k", *SCORED, "reproducibility", "gt_mcc", "gt_f1",
           *[f"{m}_task_sd" for m in SCORED if "ccess" in m or "cover" in m]]
SEEDS = (11, 12)


@dataclass(frozen=True)
class PanelSpec:
    """Which SAEs the panel trains (every steps x k at each E), on which synthetic model and variants."""

    steps: tuple[int, ...] = (20, 60, 150, 400)
    expansions: tuple[int, ...] = (2,)
    ks: tuple[int, ...] = (4, 8, 12, 16, 24)
    batch_size: int = 128
    lr: float = 3e-3
    """Adam learning rate of the panel (10x the protocol's, so that a few hundred steps span poor to good SAEs)."""
    synthetic: SyntheticSpec = SyntheticSpec()
    variants: tuple[str, ...] = ("base",)
    """Synthetic variants (ground_truth.VARIANTS) the whole panel is repeated on; the first decides."""
    task_seeds: tuple[int, ...] = (0, 1, 2)
    """Seeds of the synthetic concept tasks (paper §5.3: 3 task seeds)."""


def panel_spec(rcfg: ReliabilityConfig) -> PanelSpec:
    """The panel a run's `reliability` section asks for: its steps, E, k and variants on the `demo`-size synthetic
    model or, with `reliability.panel: paper`, on PAPER_SPEC (SynthSAEBench-16k's size)."""
    synthetic = replace(PAPER_SPEC if rcfg.panel == "paper" else SyntheticSpec(), seed=rcfg.panel_seed)
    return PanelSpec(steps=tuple(rcfg.panel_steps), expansions=tuple(rcfg.panel_expansions), ks=tuple(rcfg.panel_ks),
                     synthetic=synthetic, variants=tuple(rcfg.panel_variants))


def _summarize(variant: str, name: str, kind: str, steps: int, e: int, k: int, rows: list[dict],
               eval_cfg: EvalProtocol) -> dict:
    out: dict[str, object] = {"variant": variant, "member": name, "kind": kind, "steps": steps, "expansion": e,
                              "k": k}
    keys = [c for c in COLUMNS[6:] if c != "reproducibility"] + ["l0"]
    for key in keys:
        out[key] = float(np.mean([r[key] for r in rows]))
    decs = [r["decoder_top"] for r in rows if "decoder_top" in r]
    ok = len(decs) >= 2 and min(d.shape[1] for d in decs) >= 1
    out["reproducibility"] = (reproducibility(decs, eval_cfg.repro_top, eval_cfg.repro_permutations, 0)["excess"]
                              if ok else float("nan"))
    return out


def _cfgs(sae: SAEProtocol, d: int, n: int, k: int, steps: int, spec: PanelSpec) -> list[SAECellConfig]:
    proto = replace(sae, steps=steps, batch_size=spec.batch_size, lr=spec.lr, checkpoint_every=0)
    return [SAECellConfig.from_protocol(proto, d, n, k, s) for s in SEEDS]


@ray.remote(num_cpus=1)
def _member_task(spec: PanelSpec, variant: str, sae_proto: SAEProtocol, eval_cfg: EvalProtocol, steps: int, e: int,
                 k: int, controls: bool) -> list[dict]:
    torch.set_num_threads(1)
    data = synthetic_data(variant_spec(spec.synthetic, variant))
    d = spec.synthetic.d
    y, fams, seeds = tasks(data, e * d, spec.task_seeds)
    res = train_stack(data.x[splits(data.x.shape[0])["train"]], _cfgs(sae_proto, d, e * d, k, steps, spec),
                      implementation="auto")
    rows = score_stack(res.sae, res.normalizer, data, y, fams, seeds, eval_cfg)
    out = [_summarize(variant, f"s{steps}-E{e}-k{k}", "trained", steps, e, k, rows, eval_cfg)]
    if controls:
        score = lambda sae: score_stack(sae, res.normalizer, data, y, fams, seeds, eval_cfg)  # noqa: E731
        out += _controls(variant, res.sae, score, eval_cfg, k, float(np.mean([r["l0"] for r in rows])))
        orc = oracle_scores(data, res.normalizer, y, fams, seeds, eval_cfg, e * d)
        out.append(_summarize(variant, "oracle", "control", 0, e, 0, [orc], eval_cfg))
    return out


def _controls(variant: str, trained: StackedBatchTopKSAE, score, eval_cfg: EvalProtocol, k: int,
              l0: float) -> list[dict]:
    d, n = trained.d, trained.n_latents
    e = n // d
    init = StackedBatchTopKSAE.from_seeds(list(SEEDS), d, n, k)
    out = [_summarize(variant, "random_init", "control", 0, e, k, score(init), eval_cfg)]
    perm = StackedBatchTopKSAE.stack([trained.single(i) for i in range(trained.n_saes)])
    with torch.no_grad():
        for i in range(perm.n_saes):
            p = torch.from_numpy(np.random.default_rng(SEEDS[i]).permutation(n))
            perm.W_dec_t[i].copy_(perm.W_dec_t[i][p])
    out.append(_summarize(variant, "permuted_decoder", "control", 0, e, k, score(perm), eval_cfg))
    k_l0 = max(1, int(round(l0)))
    rand = StackedBatchTopKSAE(len(SEEDS), d, n, k_l0)
    for i, s in enumerate(SEEDS):
        w = np.random.default_rng(1000 + s).normal(size=(n, d))
        _set_tied(rand, i, w / np.linalg.norm(w, axis=1, keepdims=True))
    out.append(_summarize(variant, "random_dictionary", "control", 0, e, k_l0, score(rand), eval_cfg))
    return out


def _set_tied(sae: StackedBatchTopKSAE, i: int, rows: np.ndarray) -> None:
    """Decoder rows = encoder rows = `rows` [N, d] (unit), zero biases."""
    t = torch.from_numpy(np.asarray(rows, dtype=np.float32))
    with torch.no_grad():
        sae.W_dec_t[i].copy_(t)
        sae.W_enc[i].copy_(t)
        sae.b_enc[i].zero_()
        sae.b_dec[i].zero_()


def run_panel(spec: PanelSpec, sae_proto: SAEProtocol, eval_cfg: EvalProtocol,
              num_workers: int | None = None) -> pd.DataFrame:
    """Train and score every member on every variant (controls beside the longest-trained, largest-k member)."""
    combos = list(itertools.product(spec.steps, spec.expansions, spec.ks))
    best = (max(spec.steps), max(spec.expansions), max(spec.ks))
    jobs = [lambda v=v, c=c: _member_task.remote(spec, v, sae_proto, eval_cfg, *c, c == best)
            for v in spec.variants for c in combos]
    rows = [r for res in run_bounded(jobs, num_workers) for r in res]
    return pd.DataFrame(rows)[COLUMNS]

