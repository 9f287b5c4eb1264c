"""Statistics on bootstrap draws (docs/protocol.md §8, §9.2): CIs, ranks, paired p, BH, Kendall tau, arm comparison."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import pandas as pd

from raybench.core.protocol import analysis_order

RankSort = Literal["stable", "pandas"]
"""How models are sorted by value before Kendall tau (docs/protocol.md §8.5, §8.8): stable - Python's sorted(), ties
in PUBLISHED_MODEL_ORDER (the published sparsity-sensitivity script); pandas - Series.sort_values() over the models
in that order (the published inference script's scale rank stability; ties fall as numpy's default sort leaves
them, which on SIMD builds is not always that order)."""


def percentile_ci(draws: np.ndarray, low: float = 2.5, high: float = 97.5,
                  axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap draws along `axis` (NaN draws ignored)."""
    lo, hi = np.nanpercentile(np.asarray(draws, dtype=np.float64), [low, high], axis=axis)
    return lo, hi


def _complete(draws: np.ndarray) -> np.ndarray:
    """Draws where every model has a value (a crossed draw can pick only missing cells for a model)."""
    draws = np.asarray(draws, dtype=np.float64)
    return draws[np.all(np.isfinite(draws), axis=1)]


def ranks(draws: np.ndarray) -> np.ndarray:
    """Per draw, rank of each model (1 = highest value); draws [n, M]. Tied models share their average rank.

    Draws with a missing (NaN) value are left out.
    """
    draws = _complete(draws)
    better = np.sum(draws[:, None, :] > draws[:, :, None], axis=2)
    tied = np.sum(draws[:, None, :] == draws[:, :, None], axis=2) - 1
    return 1.0 + better + 0.5 * tied


def published_ranks(draws: np.ndarray, models: Sequence[str]) -> np.ndarray:
    """Per draw, rank of each model (1 = highest; draws [n, M], columns = models), as the published patient-
    bootstrap summary ranks them: np.argsort(-matrix, axis=0) over the [M, n] matrix of the models in
    analysis_order, so a tie goes to whichever model numpy's default sort puts first (docs/protocol.md §8.8).
    Draws with a missing (NaN) value are left out."""
    draws = _complete(draws)
    cols = [list(models).index(m) for m in analysis_order(models)]
    matrix = draws[:, cols].T
    order = np.argsort(-matrix, axis=0)
    ranked = np.empty_like(order)
    np.put_along_axis(ranked, order, np.arange(1, len(cols) + 1)[:, None], axis=0)
    out = np.empty(draws.shape, dtype=np.float64)
    out[:, cols] = ranked.T
    return out


def rank1_prob(draws: np.ndarray, models: Sequence[str] | None = None, ties: str = "shared") -> np.ndarray:
    """Probability of ranking first. ties "shared": a draw with t models tied at the top gives each 1/t (sums
    to 1); "published": published_ranks (needs `models`, the columns' names)."""
    if ties == "published":
        return np.mean(published_ranks(draws, _names(models, draws)) == 1, axis=0)
    draws = _complete(draws)
    top = draws == np.max(draws, axis=1, keepdims=True)
    return np.mean(top / top.sum(axis=1, keepdims=True), axis=0)


def mean_rank(draws: np.ndarray, models: Sequence[str] | None = None, ties: str = "shared") -> np.ndarray:
    """Mean rank over the draws; ties as in rank1_prob (shared: tied models share their average rank)."""
    if ties == "published":
        return np.mean(published_ranks(draws, _names(models, draws)), axis=0)
    return np.mean(ranks(draws), axis=0)


def _names(models: Sequence[str] | None, draws: np.ndarray) -> list[str]:
    if models is None or len(models) != np.shape(draws)[1]:
        raise ValueError("published ranks need the name of every column (models)")
    return list(models)


def paired_p(diff: np.ndarray) -> float:
    """Two-sided bootstrap p of a paired difference: 2 min((1+#(d<=0))/(n+1), (1+#(d>=0))/(n+1)), capped at 1."""
    diff = np.asarray(diff, dtype=np.float64)
    diff = diff[np.isfinite(diff)]
    n = diff.size
    p = 2 * min((1 + np.sum(diff <= 0)) / (n + 1), (1 + np.sum(diff >= 0)) / (n + 1))
    return float(min(1.0, p))


def benjamini_hochberg(p: Sequence[float]) -> np.ndarray:
    """BH-adjusted p-values (step-up, monotone, capped at 1); NaN entries stay NaN and are not counted."""
    p = np.asarray(p, dtype=np.float64)
    out = np.full_like(p, np.nan)
    ok = np.flatnonzero(np.isfinite(p))
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    scaled = p[order] * m / np.arange(1, m + 1)
    adj = np.minimum.accumulate(scaled[::-1])[::-1]
    out[order] = np.minimum(adj, 1.0)
    return out


def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau-b of two value vectors (ties handled as in scipy.stats.kendalltau).

    Only where the published code takes tau of raw values too: the input-harmonization rank agreement
    (docs/protocol.md §8.8). Model rankings across E and across arms use rank_tau instead.
    """
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two equal-length vectors, got {x.shape} and {y.shape}")
    i, j = np.triu_indices(x.size, k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    s = float(np.sum(sx * sy))
    n_x, n_y = float(np.sum(sx != 0)), float(np.sum(sy != 0))
    return s / math.sqrt(n_x * n_y) if n_x > 0 and n_y > 0 else float("nan")


def rank_order(values: Mapping[str, float], models: Sequence[str], higher_better: bool = True,
               sort: RankSort = "stable") -> list[str]:
    """`models` best first by `values`, ties kept as `sort` keeps them (the models listed in analysis_order)."""
    order = analysis_order(models)
    if sort == "stable":
        return sorted(order, key=lambda m: values[m], reverse=higher_better)
    if sort == "pandas":
        series = pd.Series([float(values[m]) for m in order], index=order, dtype=np.float64)
        return [str(m) for m in series.sort_values(ascending=not higher_better).index]
    raise ValueError(f"unknown rank sort {sort!r}: expected stable or pandas")


def rank_tau(a: Mapping[str, float], b: Mapping[str, float], models: Sequence[str], higher_better: bool = True,
             sort: RankSort = "stable") -> tuple[float, float, str, str, int]:
    """Kendall tau (scipy) between the model ranks under values a and b, as the published scripts rank models.

    Each side is sorted into ranks 1..n (rank_order), and tau and its p compare the two rank vectors: tied values
    still get distinct ranks, which is why the tie order matters. Only models with a finite value on both sides
    count. -> (tau, p, order_a, order_b, n_models); orders are 'best>...>worst' strings.
    """
    common = [m for m in analysis_order(models) if np.isfinite(a.get(m, np.nan)) and np.isfinite(b.get(m, np.nan))]
    oa = rank_order(a, common, higher_better, sort)
    ob = rank_order(b, common, higher_better, sort)
    if len(common) < 2:
        return float("nan"), float("nan"), ">".join(oa), ">".join(ob), len(common)
    from scipy.stats import kendalltau  # here, not at the top: the bootstrap and figure workers that import this
    # module never rank models, and scipy.stats costs them ~0.6 CPU-s each to import

    res = kendalltau([oa.index(m) + 1 for m in common], [ob.index(m) + 1 for m in common])
    return float(res.statistic), float(res.pvalue), ">".join(oa), ">".join(ob), len(common)


def contrast_pairs(models: Sequence[str]) -> list[tuple[int, int]]:
    """Index pairs (a, b) into `models` of every pairwise contrast, as the published scripts list them: a before b
    in analysis_order (the published MODEL_ORDER), rows left-major; the contrast is a - b, whichever is higher
    (docs/protocol.md §8.8)."""
    pos = {m: i for i, m in enumerate(models)}
    order = analysis_order(models)
    return [(pos[a], pos[b]) for i, a in enumerate(order) for b in order[i + 1:]]


def scale_means(cells: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """Per metric, model and E: the mean of the cells over depths and seeds, in the published inference script's
    arithmetic, which its scale rank stability ranks: the cells listed as its cell table lists them (model in
    analysis_order, then depth, E, seed), split by E, then pandas' grouped mean by model. Quantized metrics
    (coverage k/C, dead fraction k/N) of two models often have equal sums; whether their means then tie rests on
    the rounding of exactly these calls (pandas' grouped mean depends on the rows around a group), so neither
    the curves' weighted sums nor plain numpy means are used for the ranking.

    cells: columns model, q, expansion, seed and one per metric (one arm). -> metric, model, expansion, value.
    """
    rank = {m: i for i, m in enumerate(analysis_order(list(dict.fromkeys(cells.model))))}
    listed = cells.assign(_order=cells.model.map(rank)).sort_values(["_order", "q", "expansion", "seed"],
                                                                     kind="stable")
    rows = []
    for metric in metrics:
        for e, part in listed.groupby("expansion", sort=True):
            rows += [(metric, str(m), int(e), float(v)) for m, v in part.groupby("model")[metric].mean().items()]
    return pd.DataFrame(rows, columns=["metric", "model", "expansion", "value"])


def published_scale_draws(draws: np.ndarray, cells: pd.DataFrame, models: Sequence[str],
                          expansions: Sequence[int]) -> np.ndarray | None:
    """Patient-bootstrap draws of each model's per-E mean over depth x seed [D, M, E], in the published summary's
    arithmetic (docs/protocol.md §8.8): each cell's draws rounded to float32 (as the published run stores them),
    then numpy's mean over the [cells, D] block of the model and E, its cells listed by depth, then seed.
    Rounding decides whether quantized metrics (coverage k/C) of two models tie in a draw, hence the paired p
    and the rank ties. draws: [D, cells] of one metric (cells: rows aligned, columns arm, model, q, expansion,
    seed). None unless every model has the same complete depth x seed block at every E (the published summary
    refuses anything else).
    """
    prim = cells.reset_index(drop=True)
    prim = prim[prim.arm == "primary"].sort_values(["q", "seed"], kind="stable")
    blocks = {key: g.index.to_numpy() for key, g in prim.groupby(["model", "expansion"], sort=False)}
    sizes = {len(v) for v in blocks.values()}
    if len(sizes) != 1 or any((m, int(e)) not in blocks for m in models for e in expansions):
        return None
    stored = np.asarray(draws, dtype=np.float32).astype(np.float64)
    out = np.empty((stored.shape[0], len(models), len(expansions)))
    for i, m in enumerate(models):
        for j, e in enumerate(expansions):
            out[:, i, j] = np.ascontiguousarray(stored[:, blocks[(m, int(e))]].T).mean(axis=0)
    return out


RANK_STABILITY_COLUMNS = ["metric", "expansion_a", "expansion_b", "kendall_tau", "p_value", "order_a", "order_b",
                          "n_models"]


def rank_stability(values: pd.DataFrame, higher_better: bool | Mapping[str, bool] = True) -> pd.DataFrame:
    """Kendall tau between the model orders at every pair of expansions (docs/protocol.md §8.5).

    The published inference script's rule: per E the models' values are sorted (rank_order, sort="pandas") and
    tau compares the two rank vectors (rank_tau) - not tau-b of the raw values, which counts a tie as neither
    concordant nor discordant.
    values: columns metric, model, expansion, value (one value per model and E); higher_better: for every metric
    or per metric name. -> RANK_STABILITY_COLUMNS, expansion_a < expansion_b, only models present at both E.
    """
    rows = []
    for metric, sub in values.groupby("metric", sort=True):
        hb = higher_better.get(str(metric), True) if isinstance(higher_better, Mapping) else higher_better
        wide = sub.pivot_table(index="model", columns="expansion", values="value", aggfunc="mean")
        models = [str(m) for m in wide.index]
        es = sorted(wide.columns)
        for a in range(len(es)):
            for b in range(a + 1, len(es)):
                va, vb = (dict(zip(models, wide[e].to_numpy(np.float64), strict=True)) for e in (es[a], es[b]))
                tau, p, oa, ob, n = rank_tau(va, vb, models, hb, sort="pandas")
                rows.append((metric, int(es[a]), int(es[b]), tau, p, oa, ob, n))
    return pd.DataFrame(rows, columns=RANK_STABILITY_COLUMNS)


def arm_comparison(values: pd.DataFrame) -> pd.DataFrame:
    """Fixed-k/d (primary) vs fixed-k/N (sensitivity) arm at the sensitivity depth, per model and E.

    values: seed-averaged point values with columns model, expansion, metric, arm, value (one depth).
    -> model, expansion, metric, primary, sensitivity, diff (= sensitivity - primary); both arms required.
    """
    wide = values.pivot_table(index=["model", "expansion", "metric"], columns="arm", values="value", aggfunc="mean")
    for arm in ("primary", "sensitivity"):
        if arm not in wide.columns:
            wide[arm] = np.nan
    wide = wide[["primary", "sensitivity"]].dropna(how="any").reset_index()
    wide["diff"] = wide["sensitivity"] - wide["primary"]
    wide.columns.name = None
    return wide[["model", "expansion", "metric", "primary", "sensitivity", "diff"]]
