"""The rest of the published patient-bootstrap summary (scripts/summarize_multiscale_sae_patient_bootstrap.py;
docs/protocol.md §8.2): rank probabilities of the common-scale AUC and of every E (mean and median rank, rank 1,
top 2), and patient-bootstrap intervals on the model x depth x E surface.

Tables (stable columns RANK_COLUMNS, SURFACE_COLUMNS): `rank_probabilities` (scope common_scale_auc, E1, E4,
...) and `surface` (seed means per model x depth x E with their 95 % interval). Under the published stream the
draws take the summary's arithmetic (each cell's draws stored as float32, numpy's mean over the cells; ranks by
stats.published_ranks); the chunked stream keeps float64 draws and shares tied ranks.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raybench.analysis.completeness import attach, counts, finish
from raybench.analysis.inference import stats as st
from raybench.analysis.inference.metrics import trapezoid_auc
from raybench.analysis.inference.packed_stats import METRIC_NAMES
from raybench.core.config import InferenceProtocol

RANK_COLUMNS = ["metric", "scope", "model", "mean_rank", "median_rank", "rank1_prob", "top2_prob", "n_draws"]
SURFACE_COLUMNS = ["model", "q", "expansion", "metric", "value", "ci_low", "ci_high", "n_seeds"]


def published_draws(draws: np.ndarray, ok: pd.DataFrame | None, models: list[str],
                    inf: InferenceProtocol) -> list[np.ndarray | None]:
    """Per metric, the per-E patient-bootstrap draws [D, M, E] in the published summary's arithmetic
    (stats.published_scale_draws) under the published stream on a complete grid; None otherwise."""
    if ok is None or inf.stream != "published" or not models:
        return [None] * len(METRIC_NAMES)
    es = sorted(int(e) for e in ok.expansion.unique())
    return [st.published_scale_draws(draws[:, :, k], ok, models, es) for k in range(len(METRIC_NAMES))]


def profile_draws(draws: np.ndarray, w_prof: np.ndarray, models: list[str], inf: InferenceProtocol,
                  ok: pd.DataFrame | None) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """The common-scale AUC draws [3, D, M] of the profiles (the published summary's arithmetic where
    published_draws has it), and the per-E draws published_draws gives."""
    prof = np.einsum("dck,cm->kdm", draws, w_prof)
    scales = published_draws(draws, ok, models, inf)
    for k, scale in enumerate(scales):
        if scale is not None:
            es = sorted(int(e) for e in ok.expansion.unique())
            prof[k] = np.stack([trapezoid_auc(np.ascontiguousarray(scale[:, i, :].T), es, axis=0)
                                for i in range(len(models))], axis=1)
    return prof, scales


def rank_rows(metric: str, scope: str, draws: np.ndarray, models: list[str], ties: str) -> list[tuple]:
    """Per model: mean and median rank, P(rank 1), P(rank <= 2) over the draws [D, M] (published: the summary's
    rank_summary on stats.published_ranks; shared: tied models share their average rank and rank 1)."""
    ranks = st.published_ranks(draws, models) if ties == "published" else st.ranks(draws)
    r1 = st.rank1_prob(draws, models, ties)
    return [(metric, scope, m, float(ranks[:, i].mean()), float(np.median(ranks[:, i])), float(r1[i]),
             float(np.mean(ranks[:, i] <= 2)), int(ranks.shape[0])) for i, m in enumerate(models)]


def _cell_mean(stored: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """numpy's mean over the cells idx of draws [D, cells], as the summary takes it over its [cells, D] block."""
    return np.ascontiguousarray(stored[:, idx].T).mean(axis=0)


def rank_and_surface_tables(point: np.ndarray, draws: np.ndarray, ok: pd.DataFrame, w_prof: np.ndarray,
                            prof_models: list[str], models: list[str], inf: InferenceProtocol
                            ) -> dict[str, pd.DataFrame]:
    """rank_probabilities and surface from the patient draws [D, cells, 3] of the ok cells (rows of point)."""
    ties = "published" if inf.stream == "published" else "shared"
    stored = np.asarray(draws, dtype=np.float32).astype(np.float64) if inf.stream == "published" else draws
    cells = ok.reset_index(drop=True)
    prim = cells[cells.arm == "primary"].sort_values(["q", "seed"], kind="stable")
    es = sorted(int(e) for e in prim.expansion.unique())
    prof, scales = profile_draws(draws, w_prof, prof_models, inf, ok)
    by_me = {(m, int(e)): g.index.to_numpy() for (m, e), g in prim.groupby(["model", "expansion"], sort=False)}
    have = [m for m in models if all((m, e) in by_me for e in es)]  # the models at every E
    rows: list[tuple] = []
    for k, metric in enumerate(METRIC_NAMES):
        if prof_models:
            rows += rank_rows(metric, "common_scale_auc", prof[k], prof_models, ties)
        for j, e in enumerate(es):
            if scales[k] is not None:
                per_e = scales[k][:, [prof_models.index(m) for m in have], j]
            else:
                per_e = np.stack([_cell_mean(stored[:, :, k], by_me[(m, e)]) for m in have], axis=1)
            rows += rank_rows(metric, f"E{e}", per_e, have, ties) if have else []
    groups = [(key, g.sort_values("seed", kind="stable").index.to_numpy())
              for key, g in prim.groupby(["model", "q", "expansion"], sort=False)]
    surface = []
    for k, metric in enumerate(METRIC_NAMES):  # one percentile call per metric over every group's draws
        means = np.stack([_cell_mean(stored[:, :, k], idx) for _, idx in groups], axis=1) if groups else None
        lo, hi = st.percentile_ci(means, inf.ci_low, inf.ci_high) if groups else ([], [])
        surface += [(m, float(q), int(e), metric, float(point[idx, k].mean()), float(lo[g]), float(hi[g]), len(idx))
                    for g, ((m, q, e), idx) in enumerate(groups)]
    order = {m: i for i, m in enumerate(models)}
    surf = pd.DataFrame(surface, columns=SURFACE_COLUMNS)
    surf = surf.sort_values(["model", "q", "expansion", "metric"], kind="stable", key=lambda c: c.map(order) if
                            c.name == "model" else (c.map(METRIC_NAMES.index) if c.name == "metric" else c))
    return {"rank_probabilities": pd.DataFrame(rows, columns=RANK_COLUMNS), "surface": surf.reset_index(drop=True)}


def with_denominators(tables: dict[str, pd.DataFrame], grid: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The completeness columns (analysis.completeness): a rank row draws on the model's primary cells (at its E
    for an E scope), a surface row on its model x depth x E seeds; grid: grid_frame's expected cells."""
    prim = grid[grid.arm == "primary"]
    by_model = {m: (int(e), int(p)) for m, e, p in counts(prim, ["model"]).itertuples(index=False)}
    per_e = counts(prim, ["model", "expansion"]).itertuples(index=False)
    by_e = {(m, int(x)): (int(e), int(p)) for m, x, e, p in per_e}
    ranks = tables["rank_probabilities"]
    pairs = [by_model.get(m, (0, 0)) if scope == "common_scale_auc" else by_e.get((m, int(scope[1:])), (0, 0))
             for m, scope in zip(ranks.model, ranks.scope, strict=True)]
    ranks = finish(ranks.assign(n_expected=[a for a, _ in pairs], n_present=[b for _, b in pairs]))
    surface = attach(tables["surface"], counts(prim, ["model", "q", "expansion"]),
                     {"model": "model", "q": "q", "expansion": "expansion"})
    return {"rank_probabilities": ranks, "surface": surface}
