"""The ground-truth panel (docs/protocol.md §11.4): SAEs of varying quality trained with raybench's own trainer
and evaluator on the synthetic model of ground_truth.py, plus controls, scored by raybench's metrics and by
ground truth.

Members differ in steps, E and k (two seeds each, trained as one stack by raybench.sae.train.train_stack and
evaluated by raybench.sae.evaluate.evaluate_cell, exactly as grid cells are). Controls: `random_init` (the
trainer's initialization, untrained), `permuted_decoder` (the best member with its decoder columns shuffled:
its decoder *set* is the member's, so GT-MCC cannot see the permutation; GT-F1 and R2 can),
`random_dictionary` (random unit decoder rows, tied encoder, k = the best member's L0) and `oracle` (decoder
and encoder = the true directions in the SAE's z-scored space, k = the true mean L0). Each member is one Ray task.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import ray
import torch

from raybench.analysis.bootstrap import run_bounded
from raybench.analysis.metrics import reproducibility
from raybench.analysis.reliability.ground_truth import (
    SyntheticData,
    SyntheticSpec,
    gt_f1,
    gt_mcc,
    synthetic_data,
    truth_in_normalized_space,
)
from raybench.config import EvalProtocol, SAEProtocol
from raybench.sae.evaluate import encode_split, evaluate_cell
from raybench.sae.model import Normalizer, SAECellConfig, StackedBatchTopKSAE
from raybench.sae.train import train_stack

# raybench metric -> CellEval.metrics key (reproducibility comes from the two seeds' decoders)
PANEL_METRICS = {"reconstruction": "test_r2", "accessibility": "test_accessibility", "coverage": "test_coverage",
                 "dead_fraction": "val_dead_fraction"}
COLUMNS = ["member", "kind", "steps", "expansion", "k", *PANEL_METRICS, "reproducibility", "gt_mcc", "gt_f1"]
SEEDS = (11, 12)


@dataclass(frozen=True)
class PanelSpec:
    """Which SAEs the panel trains (every combination), on which synthetic model."""

    steps: tuple[int, ...] = (40, 300)
    expansions: tuple[int, ...] = (1, 2)
    ks: tuple[int, ...] = (6, 16)
    batch_size: int = 128
    lr: float = 3e-3
    """Adam learning rate of the panel (10x the protocol's, so that a few hundred steps span poor to good SAEs)."""
    synthetic: SyntheticSpec = SyntheticSpec()


def _splits(data: SyntheticData) -> dict[str, np.ndarray]:
    n = data.x.shape[0]
    a, b = int(0.7 * n), int(0.85 * n)
    return {"train": np.arange(a), "val": np.arange(a, b), "test": np.arange(b, n)}


def _score(sae: StackedBatchTopKSAE, norm: Normalizer, data: SyntheticData, eval_cfg: EvalProtocol) -> list[dict]:
    """raybench metrics and ground truth of each SAE of a stack."""
    idx = _splits(data)
    acts = {s: data.x[i] for s, i in idx.items()}
    concepts = {s: data.concepts[i] for s, i in idx.items()}
    n_test = idx["test"].size
    truth = truth_in_normalized_space(data.dictionary, norm.std)
    fire = data.acts[idx["test"]] > 0
    out = []
    for i in range(sae.n_saes):
        ev = evaluate_cell(sae, norm, acts, concepts, np.arange(n_test), np.arange(idx["train"].size), eval_cfg,
                           index=i, n_patients=n_test)
        single = sae.single(i)
        codes = encode_split(single, norm, acts["test"], eval_cfg.eval_batch)
        z = np.zeros((n_test, single.n_latents), dtype=bool)
        z[codes.rows, codes.cols] = True
        dec = single.W_dec_t[0].detach().numpy().astype(np.float64)
        row = {name: float(ev.metrics[key]) for name, key in PANEL_METRICS.items()}
        row.update(gt_mcc=gt_mcc(dec, truth), gt_f1=gt_f1(z, dec, truth, fire), decoder_top=ev.decoder_top,
                   l0=float(ev.metrics["val_mean_l0"]))
        out.append(row)
    return out


def _summarize(name: str, kind: str, steps: int, e: int, k: int, rows: list[dict], eval_cfg: EvalProtocol) -> dict:
    out = {"member": name, "kind": kind, "steps": steps, "expansion": e, "k": k}
    for key in [*PANEL_METRICS, "gt_mcc", "gt_f1", "l0"]:
        out[key] = float(np.mean([r[key] for r in rows]))
    decs = [r["decoder_top"] for r in rows]
    ok = len(decs) >= 2 and min(d.shape[1] for d in decs) >= 1
    out["reproducibility"] = (reproducibility(decs, eval_cfg.repro_top, eval_cfg.repro_permutations, 0)["excess"]
                              if ok else float("nan"))
    return out


def _cfgs(sae: SAEProtocol, d: int, n: int, k: int, steps: int, spec: PanelSpec) -> list[SAECellConfig]:
    proto = replace(sae, steps=steps, batch_size=spec.batch_size, lr=spec.lr, checkpoint_every=0)
    return [SAECellConfig.from_protocol(proto, d, n, k, s) for s in SEEDS]


@ray.remote(num_cpus=1)
def _member_task(spec: PanelSpec, sae_proto: SAEProtocol, eval_cfg: EvalProtocol, steps: int, e: int, k: int,
                 controls: bool) -> list[dict]:
    torch.set_num_threads(1)
    data = synthetic_data(spec.synthetic)
    d = spec.synthetic.d
    x_train = data.x[_splits(data)["train"]]
    res = train_stack(x_train, _cfgs(sae_proto, d, e * d, k, steps, spec), implementation="auto")
    rows = _score(res.sae, res.normalizer, data, eval_cfg)
    out = [_summarize(f"s{steps}-E{e}-k{k}", "trained", steps, e, k, rows, eval_cfg)]
    if controls:
        out += _controls(res.sae, res.normalizer, data, eval_cfg, k, float(np.mean([r["l0"] for r in rows])))
    return out


def _controls(trained: StackedBatchTopKSAE, norm: Normalizer, data: SyntheticData, eval_cfg: EvalProtocol, k: int,
              l0: float) -> list[dict]:
    d, n = trained.d, trained.n_latents
    e = n // d
    out = []
    init = StackedBatchTopKSAE.from_seeds(list(SEEDS), d, n, k)
    out.append(_summarize("random_init", "control", 0, e, k, _score(init, norm, data, eval_cfg), eval_cfg))
    perm = StackedBatchTopKSAE.stack([trained.single(i) for i in range(trained.n_saes)])
    with torch.no_grad():
        for i in range(perm.n_saes):
            p = torch.from_numpy(np.random.default_rng(SEEDS[i]).permutation(n))
            perm.W_dec_t[i].copy_(perm.W_dec_t[i][p])
    out.append(_summarize("permuted_decoder", "control", 0, e, k, _score(perm, norm, data, eval_cfg), eval_cfg))
    k_l0 = max(1, int(round(l0)))
    rand = StackedBatchTopKSAE(len(SEEDS), d, n, k_l0)
    for i, s in enumerate(SEEDS):
        w = np.random.default_rng(1000 + s).normal(size=(n, d))
        _set_tied(rand, i, w / np.linalg.norm(w, axis=1, keepdims=True))
    out.append(_summarize("random_dictionary", "control", 0, e, k_l0, _score(rand, norm, data, eval_cfg), eval_cfg))
    truth = truth_in_normalized_space(data.dictionary, norm.std)
    k_true = max(1, int(round(float((data.acts > 0).sum(axis=1).mean()))))
    oracle = StackedBatchTopKSAE(len(SEEDS), d, truth.shape[0], k_true)
    for i in range(len(SEEDS)):
        _set_tied(oracle, i, truth)
    out.append(_summarize("oracle", "control", 0, truth.shape[0] // d, k_true,
                          _score(oracle, norm, data, eval_cfg), eval_cfg))
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
    """Train and score every member (and the controls, beside the longest-trained widest member) on Ray."""
    combos = list(itertools.product(spec.steps, spec.expansions, spec.ks))
    best = (max(spec.steps), max(spec.expansions), max(spec.ks))
    jobs = [lambda c=c: _member_task.remote(spec, sae_proto, eval_cfg, *c, c == best) for c in combos]
    rows = [r for res in run_bounded(jobs, num_workers) for r in res]
    return pd.DataFrame(rows)[COLUMNS]


def ground_truth_rho(panel: pd.DataFrame, metrics: tuple[str, ...] = (*PANEL_METRICS, "reproducibility")
                     ) -> pd.DataFrame:
    """Spearman rho of each raybench metric with GT-MCC and GT-F1 over the trained members only (controls are
    reported on their own), with one-sided p-values (a positive association) and n. dead_fraction is negated
    first, so that for every metric a positive rho means 'better tracks truth'."""
    from scipy.stats import spearmanr

    trained = panel[panel.kind == "trained"]
    rows = []
    for m in metrics:
        v = -trained[m] if m == "dead_fraction" else trained[m]
        out: dict[str, object] = {"metric": m}
        for gt in ("gt_mcc", "gt_f1"):
            ok = np.isfinite(v.to_numpy(float)) & np.isfinite(trained[gt].to_numpy(float))
            x, y = v[ok].to_numpy(float), trained[gt][ok].to_numpy(float)
            res = spearmanr(x, y, alternative="greater") if ok.sum() >= 3 and np.ptp(x) > 0 and np.ptp(y) > 0 else None
            out[f"rho_{gt}"] = float(res.statistic) if res is not None else np.nan
            out[f"p_{gt}"] = float(res.pvalue) if res is not None else np.nan
        out["n_gt"] = int(ok.sum())
        rows.append(out)
    return pd.DataFrame(rows, columns=["metric", "rho_gt_mcc", "p_gt_mcc", "rho_gt_f1", "p_gt_f1", "n_gt"])
