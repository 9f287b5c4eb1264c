"""Scores of one panel SAE (docs/protocol.md §11.4): raybench's metrics on the synthetic concept tasks, split by
family (in-SAE, out-of-SAE, mixed) and task seed, and ground truth; and the oracle at a member's width, scored
from the true activations with the evaluator's own selection and correlation code.

`accessibility` and `coverage` are the means over the in-SAE and mixed tasks (what a good SAE should serve);
`accessibility_out` and `coverage_out` the out-of-SAE negative control. Each is computed per task seed too, so
the spread over task seeds is the evaluation's reseed noise on the panel.
"""

from __future__ import annotations

import numpy as np

from raybench.analysis.reliability.ground_truth import (
    SyntheticData,
    concept_tasks,
    gt_f1,
    gt_mcc,
    in_sae_features,
    truth_in_normalized_space,
)
from raybench.core.config import EvalProtocol
from raybench.core.sufficient_stats import paired_corr
from raybench.sae.evaluate import SplitCodes, encode_split, evaluate_cell, select_coordinates
from raybench.sae.model import Normalizer, StackedBatchTopKSAE

TASK_METRICS = ("accessibility", "coverage", "accessibility_out", "coverage_out")


def splits(n: int) -> dict[str, np.ndarray]:
    a, b = int(0.7 * n), int(0.85 * n)
    return {"train": np.arange(a), "val": np.arange(a, b), "test": np.arange(b, n)}


def tasks(data: SyntheticData, n_in_sae: int, task_seeds: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray,
                                                                                      np.ndarray]:
    """(y [n, C], family [C], task seed [C]) of every task seed's concepts, side by side (selection is per
    concept, so one evaluation scores them all)."""
    ys, fams, seeds = [], [], []
    for ts in task_seeds:
        y, _, fam = concept_tasks(data.acts, n_in_sae, ts)
        ys.append(y)
        fams += list(fam)
        seeds += [ts] * len(fam)
    return np.concatenate(ys, axis=1), np.asarray(fams), np.asarray(seeds)


def family_metrics(r_test: np.ndarray, fams: np.ndarray, seeds: np.ndarray, threshold: float) -> dict[str, float]:
    """Task metrics over all task seeds, and each one's sd over task seeds (`<metric>_task_sd`)."""
    r = np.abs(np.asarray(r_test, dtype=np.float64))
    out: dict[str, float] = {}
    for name, keep in (("", np.isin(fams, ("in", "mixed"))), ("_out", fams == "out")):
        for metric, f in (("accessibility", lambda v: v.mean()), ("coverage", lambda v: (v >= threshold).mean())):
            out[f"{metric}{name}"] = float(f(r[keep]))
            per = [float(f(r[keep & (seeds == s)])) for s in np.unique(seeds)]
            out[f"{metric}{name}_task_sd"] = float(np.std(per, ddof=1)) if len(per) > 1 else float("nan")
    return out


def score_stack(sae: StackedBatchTopKSAE, norm: Normalizer, data: SyntheticData, y: np.ndarray, fams: np.ndarray,
                seeds: np.ndarray, eval_cfg: EvalProtocol) -> list[dict]:
    """raybench metrics (evaluate_cell, as for grid cells), task metrics and ground truth of each SAE of a stack."""
    idx = splits(data.x.shape[0])
    acts = {s: data.x[i] for s, i in idx.items()}
    concepts = {s: y[i] for s, i in idx.items()}
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
        row = {"reconstruction": float(ev.metrics["test_r2"]), "dead_fraction": float(ev.metrics["val_dead_fraction"]),
               **family_metrics(ev.r_test, fams, seeds, eval_cfg.coverage_threshold),
               "gt_mcc": gt_mcc(dec, truth), "gt_f1": gt_f1(z, dec, truth, fire), "decoder_top": ev.decoder_top,
               "l0": float(ev.metrics["val_mean_l0"])}
        out.append(row)
    return out


def _true_codes(data: SyntheticData, norm: Normalizer, rows: np.ndarray, features: np.ndarray) -> SplitCodes:
    """The true activations of `features` as codes, and their reconstruction c D + b scored in the SAE's z-scored
    space."""
    c = data.acts[np.ix_(rows, features)]
    xn = norm.apply(data.x[rows]).astype(np.float64)
    x_hat = norm.apply((c @ data.dictionary[features] + data.bias).astype(np.float32)).astype(np.float64)
    sse = ((x_hat - xn) ** 2).sum(axis=1)
    sst = ((xn - xn.mean(axis=0)) ** 2).sum(axis=1)
    r, col = np.nonzero(c > 0)
    return SplitCodes(rows.size, r, col, c[r, col], sse, sst)


def oracle_scores(data: SyntheticData, norm: Normalizer, y: np.ndarray, fams: np.ndarray, seeds: np.ndarray,
                  eval_cfg: EvalProtocol, n_in_sae: int) -> dict:
    """The oracle as the paper builds it (§5.2): a member's width N, decoder = the N in-SAE true directions (the
    most frequent features), codes = their true activations. GT-MCC = 1 by construction, GT-F1 = 1 but for an
    in-SAE feature that never fires on the test split; its R2 leaves the out-of-SAE features and the noise."""
    idx = splits(data.x.shape[0])
    feats = in_sae_features(data.acts, n_in_sae)
    sel = _true_codes(data, norm, idx["train"], feats)
    selected = select_coordinates(sel, y[idx["train"]].astype(np.float64), feats.size).selected
    test, val = _true_codes(data, norm, idx["test"], feats), _true_codes(data, norm, idx["val"], feats)
    r_test = paired_corr(test.dense_columns(selected), y[idx["test"]].astype(np.float64))
    truth = truth_in_normalized_space(data.dictionary, norm.std)
    fire = data.acts[idx["test"]] > 0
    return {"reconstruction": float(1.0 - test.sse.sum() / test.sst.sum()),
            "dead_fraction": float((val.firing_counts(feats.size) == 0).mean()),
            **family_metrics(r_test, fams, seeds, eval_cfg.coverage_threshold),
            "gt_mcc": gt_mcc(truth[feats], truth), "gt_f1": gt_f1(fire[:, feats], truth[feats], truth, fire),
            "l0": float(val.vals.size / val.n)}
