"""The paper's summaries as weight matrices over the ok cells (docs/protocol.md §7, §8).

Every summary the paper reports (seed average, depth average, common-scale AUC over E) is linear in the
cell-level metric, so each one is a weight vector over the ok cells (rows of `ok`, the analysis' cell order);
`analyze_run` maps both the point values [cells, 3] and the bootstrap draws [draws, cells, 3] through the same
weights, which keeps point values and intervals consistent.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from raybench.analysis.inference.metrics import auc_weights


def seed_weights(ok: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """1 / (number of ok seeds) for each selected row (within its arm, model, depth, E); 0 elsewhere."""
    w = np.zeros(len(ok))
    sub = ok.iloc[rows]
    counts = sub.groupby(["arm", "model", "q", "expansion"])["seed"].transform("count").to_numpy()
    w[rows] = 1.0 / counts
    return w


def curve_weights(ok: pd.DataFrame, models: list[str], expansions: list[int]) -> tuple[np.ndarray, list]:
    """Targets (model, E): mean over depths of the seed mean (primary arm) -> ([cells, targets], targets)."""
    prim = np.flatnonzero((ok.arm == "primary").to_numpy())
    ws = seed_weights(ok, prim)
    targets, cols = [], []
    for m, e in itertools.product(models, expansions):
        sel = prim[((ok.model.iloc[prim] == m) & (ok.expansion.iloc[prim] == e)).to_numpy()]
        if sel.size == 0:
            continue
        w = np.zeros(len(ok))
        w[sel] = ws[sel] / ok.q.iloc[sel].nunique()
        targets.append((m, e))
        cols.append(w)
    return (np.stack(cols, axis=1) if cols else np.zeros((len(ok), 0))), targets


def depth_auc_weights(ok: pd.DataFrame, arm: str, models: list[str], expansions: list[int],
                      depths: list[float]) -> dict[tuple[str, float], np.ndarray]:
    """Targets (model, q): common-scale AUC of the seed mean; only depths with ok cells at every E."""
    rows = np.flatnonzero((ok.arm == arm).to_numpy())
    ws = seed_weights(ok, rows)
    aw = dict(zip(expansions, auc_weights(expansions), strict=True))
    per_depth: dict[tuple[str, float], np.ndarray] = {}
    for m, q in itertools.product(models, depths):
        sel = rows[((ok.model.iloc[rows] == m) & (ok.q.iloc[rows] == q)).to_numpy()]
        if set(ok.expansion.iloc[sel]) != set(expansions):
            continue  # an E with no ok seed: no AUC at this depth
        w = np.zeros(len(ok))
        w[sel] = ws[sel] * ok.expansion.iloc[sel].map(aw).to_numpy()
        per_depth[(m, q)] = w
    return per_depth


def profile_weights(per_depth: dict[tuple[str, float], np.ndarray], models: list[str]) -> tuple[np.ndarray, list[str]]:
    """Targets model: mean over the complete depths of the per-depth AUC weights -> ([cells, M'], models kept)."""
    cols, kept = [], []
    for m in models:
        ws = [w for (mm, _), w in per_depth.items() if mm == m]
        if ws:
            cols.append(np.mean(ws, axis=0))
            kept.append(m)
    return np.stack(cols, axis=1), kept
