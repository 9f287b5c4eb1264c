"""From a metric's values to the numeric inputs of its criteria (docs/protocol.md §11.3, §11.5, §11.6).

Designs come from long tables: final cells give y[model, (depth, E), seed, 1]; the snapshots through training
give y[model, (depth, E), seed, post-warmup snapshot]. Values are oriented so that higher is better (the dead
fraction is negated) before winners, orders and trends are read. Incomplete blocks are dropped, so every design
is balanced. Every p-value is read at the level of the design's independent units, the training runs (units.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raybench.analysis.reliability import nulls, units

LOWER_IS_BETTER = ("dead_fraction",)
MIN_SEEDS = 3
MIN_SNAPSHOTS = 6


def orient(metric: str, values: np.ndarray) -> np.ndarray:
    return -values if metric in LOWER_IS_BETTER else values


def design(long: pd.DataFrame, snapshot: str | None = None) -> tuple[np.ndarray, list[str]]:
    """long (model, q, expansion, seed, [snapshot], value) -> (y[V, B, S, T], models); blocks (q, E) missing any
    model x seed x snapshot are dropped. An empty design has V = 0."""
    snap = long[snapshot] if snapshot else pd.Series(0, index=long.index)
    df = long.assign(_b=list(zip(long.q.round(6), long.expansion.astype(int), strict=True)), _t=snap)
    models = sorted(df.model.astype(str).unique())
    seeds, snaps = sorted(df.seed.unique()), sorted(df._t.unique())
    blocks = []
    full = len(models) * len(seeds) * len(snaps)
    for b, g in df.groupby("_b", sort=True):
        if g.groupby(["model", "seed", "_t"]).ngroups == full and g.value.notna().all():
            blocks.append(b)
    if not blocks:
        return np.zeros((0, 0, 0, 0)), models
    sub = df[df._b.isin(blocks)]
    table = sub.groupby(["model", "_b", "seed", "_t"]).value.mean()
    idx = pd.MultiIndex.from_product([models, blocks, seeds, snaps])
    y = table.reindex(idx).to_numpy(float).reshape(len(models), len(blocks), len(seeds), len(snaps))
    return y, models


def _orders(y: np.ndarray, pairs: bool = False) -> dict[str, float]:
    """Winners and cross-seed rank agreement from per-(model, seed) means over blocks and snapshots; pairs: the
    seed axis holds seed pairs (the pair-aware rank null)."""
    means = y.mean(axis=(1, 3))  # [V, S]
    v, s = means.shape
    d = nulls.distinct_winners(means)
    out = {"winners": float(d), "winners_p": float(nulls.winners_null_pmf(v, s)[: d + 1].sum()),
           "n_variants": float(v), "n_seeds": float(s)}
    if v >= 3:
        p, p_min = units.rank_p(means, pairs)
        out.update(rank_rho=nulls.rank_agreement(means), rank_p=p, rank_p_min=p_min)
    return out


def _unit_test(y: np.ndarray, key: str, pairs: bool = False) -> dict[str, float]:
    """The run-level F of the models (units.run_level_f) as `<key>_p`, its F and the runs' degrees of freedom."""
    f, p, _df1, df2 = units.run_level_f(y, pairs)
    return {f"{key}_p": float(p), f"{key}_f": float(f), f"{key}_df": float(df2)}


def cell_evidence(y: np.ndarray, pairs: bool = False) -> dict[str, float]:
    """Variance share of the models over final cells y[V, B, S, 1] with the run-level p, the sd between models,
    winners and rank agreement. pairs: the S axis holds every seed pair of >= 3 seeds (reproducibility). {} when
    the design has fewer than 2 models or 2 seeds (3 seeds for pairs)."""
    if y.ndim != 4 or y.shape[0] < 2 or y.shape[2] < 2 or (pairs and units.pair_seeds(y.shape[2]) < 3):
        return {}
    sh = nulls.variance_shares(y)
    comps = nulls._components(y)
    out = {"share_cells": sh.variant, **_unit_test(y, "share_cells", pairs), "pairs": float(pairs),
           "share_seed_cells": sh.seed,
           "share_block_cells": sh.block, "sd_variant": float(np.sqrt(comps[0]))}
    out.update(_orders(y, pairs))
    return out


def snapshot_evidence(y: np.ndarray, steps: np.ndarray) -> dict[str, float]:
    """The paper's design on post-warmup snapshots y[V, B, S, T] (>= 3 seeds, >= 6 snapshots): shares of variant,
    seed and snapshot, and the SNR, each with the run-level p (snapshots stay with their run); winners and rank
    agreement from post-warmup means. {} when the design is too small."""
    if y.ndim != 4 or y.shape[0] < 2 or y.shape[2] < MIN_SEEDS or y.shape[3] < MIN_SNAPSHOTS:
        return {}
    sh = nulls.variance_shares(y)
    value = nulls.snr(y, steps)
    test = _unit_test(y, "share_snapshots")
    out = {"share_snapshots": sh.variant, **test, "share_seed": sh.seed, "share_snapshot": sh.snapshot,
           "share_block": sh.block, "snr": value, "snr_p": test["share_snapshots_p"]}
    out.update(_orders(y))
    return out


def trend_evidence(series: list[np.ndarray]) -> dict[str, float]:
    """Mean Spearman rho with the step over equally long series (higher is better) and its permutation-null p of a
    rise and of a decline. {} without two series of >= 3 snapshots."""
    lengths = {s.size for s in series}
    if len(series) < 2 or len(lengths) != 1 or min(lengths) < 3:
        return {}
    rho = nulls.trend(series)
    null = nulls.trend_null(len(series), lengths.pop())
    return {"rho_step": rho, "p_rise": nulls.p_upper(null, rho), "p_decline": nulls.p_lower(null, rho)}
