"""What the three training seeds already say (docs/protocol.md §11.2, §11.6): each model's common-scale AUC per
seed, the seed noise of a model's profile, the minimum reliable difference between two S-seed profiles, the
flags on the main tables' pairwise contrasts, and how well seeds (and other interchangeable choices) agree on
the model order. Cheap: reads tables/cells.parquet and the finished tables only.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy.stats import kendalltau

from raybench.analysis.inference.metrics import trapezoid_auc
from raybench.analysis.reliability.mrd import mrd, pooled_sd

# audited metric -> its cell-level column in tables/cells.parquet
CELL_COLUMNS = {"reconstruction": "test_r2", "accessibility": "test_accessibility", "coverage": "test_coverage",
                "dead_fraction": "val_dead_fraction"}
CONTRAST_TABLES = ("contrasts", "crossed_contrasts")
LONG_COLUMNS = ["metric", "model", "q", "expansion", "seed", "value"]
CONTRAST_COLUMNS = ["table", "metric", "model_a", "model_b", "diff", "mrd_3", "below_mrd_3"]


def cell_values(ok: pd.DataFrame, tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Long (metric, model, q, expansion, seed, value) of every audited metric on the primary arm: the cell
    columns of tables/cells.parquet, and reproducibility's excess per seed pair ("a-b" in the seed column)."""
    prim = ok[ok.arm == "primary"]
    parts = [pd.DataFrame({"metric": metric, "model": prim.model.astype(str), "q": prim.q.astype(float),
                           "expansion": prim.expansion.astype(int), "seed": prim.seed.astype(str),
                           "value": prim[col].astype(float)}) for metric, col in CELL_COLUMNS.items() if col in prim]
    pairs = tables.get("reproducibility_pairs")
    if pairs is not None and not pairs.empty:
        parts.append(pd.DataFrame({"metric": "reproducibility", "model": pairs.model.astype(str),
                                   "q": pairs.q.astype(float), "expansion": pairs.expansion.astype(int),
                                   "seed": pairs.seed_a.astype(str) + "-" + pairs.seed_b.astype(str),
                                   "value": pairs.excess.astype(float)}))
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=LONG_COLUMNS)


def seed_profiles(long: pd.DataFrame, expansions: list[int]) -> pd.DataFrame:
    """(metric, model, seed, value): the common-scale AUC over E of one seed's cells, averaged over the depths
    that have every E (the profiles' summary, one seed at a time)."""
    wide = long.pivot_table(index=["metric", "model", "seed", "q"], columns="expansion", values="value",
                            aggfunc="mean", sort=False).reindex(columns=expansions)
    wide = wide[wide.notna().all(axis=1)]
    if wide.empty:
        return pd.DataFrame(columns=["metric", "model", "seed", "value"])
    auc = pd.Series(trapezoid_auc(wide.to_numpy(float), expansions), index=wide.index)
    return auc.groupby(level=["metric", "model", "seed"], sort=False).mean().rename("value").reset_index()


def profile_noise(prof: pd.DataFrame) -> pd.DataFrame:
    """Per metric: pooled across-seed sd of a model's profile (s_seed_profile, df), the number of seeds S, the
    spread between models (sd of the seed-mean profiles) and the mean pairwise Kendall tau between the model
    orders of single seeds (tau_seeds)."""
    rows = []
    for metric, sub in prof.groupby("metric", sort=False):
        s, df = pooled_sd(g.value.to_numpy() for _, g in sub.groupby("model"))
        means = sub.groupby("model").value.mean()
        wide = sub.pivot(index="seed", columns="model", values="value")
        # a one-model grid has no model order to agree on: tau_seeds is NaN (scipy would warn on each pair)
        pairs = itertools.combinations(wide.index, 2) if wide.shape[1] > 1 else ()
        taus = [t for a, b in pairs if np.isfinite(t := kendalltau(wide.loc[a], wide.loc[b]).statistic)]
        rows.append((metric, s, df, int(sub.groupby("model").size().max()),
                     float(means.std(ddof=1)) if len(means) > 1 else np.nan,
                     float(np.mean(taus)) if taus else np.nan))
    return pd.DataFrame(rows, columns=["metric", "s_seed_profile", "df_seed_profile", "n_seeds", "spread_models",
                                       "tau_seeds"])


def contrast_flags(tables: dict[str, pd.DataFrame], mrd3: dict[str, float]) -> pd.DataFrame:
    """Every pairwise model contrast of the main tables with the metric's |D|*_3 and whether |diff| is below it."""
    rows = []
    for name in CONTRAST_TABLES:
        con = tables.get(name)
        if con is None or con.empty:
            continue
        for r in con.itertuples(index=False):
            d = mrd3.get(str(r.metric), np.nan)
            rows.append((name, str(r.metric), str(r.model_a), str(r.model_b), float(r.diff), d,
                         bool(np.isfinite(d) and abs(float(r.diff)) < d)))
    return pd.DataFrame(rows, columns=CONTRAST_COLUMNS)


def arm_tau(tables: dict[str, pd.DataFrame]) -> dict[str, float]:
    """Mean Kendall tau between the two sparsity arms' model orders, per metric (the arm_rank_agreement table)."""
    arm = tables.get("arm_rank_agreement")
    if arm is None or arm.empty:
        return {}
    return {str(m): float(g.kendall_tau.mean()) for m, g in arm.groupby("metric")}


def mrd_pair(s: float, n_seeds: int, df_s: int) -> tuple[float, float]:
    """(|D|*_1, |D|*_S): S = 1 uses the df of s itself (mrd.py); nan when s is not estimable."""
    if not np.isfinite(s) or df_s < 1:
        return float("nan"), float("nan")
    return mrd(s, 1, df=df_s), (mrd(s, n_seeds) if n_seeds >= 2 else float("nan"))
