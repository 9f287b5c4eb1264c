"""`analyze_run`: a finished run folder -> the analysis tables (profiles, contrasts, curves, ...).

Each base table family has its builder below; all of them map the cell-level point values [cells, 3] and the
patient-bootstrap draws [draws, cells, 3] through the linear summaries of summary_weights.py, so point
values and intervals stay consistent. Only ok cells enter (run_inputs.py); grid points with no ok cell are
listed in the `missing` table and logged. An incomplete grid is refused unless allow_incomplete, and then
every table flags its short denominators (completeness.py). The paper analyses beyond these tables come
from paper_run.py, decoder reproducibility from reproducibility.py.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.atlas.paper_run import Crossed, paper_tables
from raybench.analysis.atlas.rank_tables import (
    profile_draws,
    published_draws,
    rank_and_surface_tables,
    with_denominators,
)
from raybench.analysis.atlas.reproducibility import reproducibility_tables
from raybench.analysis.completeness import AnalysisError, annotate_base, check_complete, grid_frame
from raybench.analysis.inference import stats as st
from raybench.analysis.inference.bootstrap import (
    crossed_bootstrap,
    crossed_values,
    packed_patient_bootstrap,
    patient_bootstrap,
)
from raybench.analysis.inference.metrics import trapezoid_auc
from raybench.analysis.inference.packed_stats import METRIC_NAMES, load_packed_stats, read_cell_stats
from raybench.analysis.inference.randomness import write_randomness
from raybench.analysis.inference.streams import crossed_chunk_draws
from raybench.analysis.inference.summary_weights import curve_weights, depth_auc_weights, profile_weights
from raybench.analysis.published import model_values
from raybench.analysis.run_inputs import (
    MISSING_COLUMNS,
    expected_keys,
    read_cells,
    read_concepts,
    recorded_cohort_kind,
    rounded_q,
    select_ok,
)
from raybench.cohorts.panel import concept_families
from raybench.core.atomic import write_table
from raybench.core.config import InferenceProtocol, Protocol
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

# docs/protocol.md §10.1: published PTB-XL common-scale AUCs (the report's "paper" column); the package's
# paper_values.csv (raybench.analysis.published) is their one owner.
PUBLISHED: dict[str, dict[str, float]] = model_values("table_s1", "auc")

COLUMNS: dict[str, list[str]] = {
    "profiles": ["model", "metric", "auc", "ci_low", "ci_high", "rank1_prob", "mean_rank", "published"],
    "contrasts": ["metric", "model_a", "model_b", "diff", "ci_low", "ci_high", "p", "p_bh"],
    "curves": ["model", "metric", "expansion", "value", "ci_low", "ci_high"],
    "rank_stability": ["metric", "expansion_a", "expansion_b", "kendall_tau"],
    "crossed": ["model", "metric", "auc", "ci_low", "ci_high", "rank1_prob"],
    "depth_scale": ["model", "q", "expansion", "metric", "value"],
    "sensitivity": ["model", "metric", "factor", "level", "value"],
    "reproducibility": ["model", "q", "expansion", "matched_cosine", "random_floor", "excess", "subspace_overlap"],
    "concepts": ["model", "concept", "family", "auc"],
    "arm": ["model", "expansion", "metric", "primary", "sensitivity", "diff"],
    "missing": MISSING_COLUMNS,
}
TABLE_COLUMNS = {k: v if k == "missing" else [*v, "n_expected", "n_present", "short_denominator"]
                 for k, v in COLUMNS.items()}  # as written: completeness.DENOM_COLUMNS appended
DEPTH_SCALE_METRICS = [*METRIC_NAMES, "val_r2", "val_dead_fraction"]


# ---------------------------------------------------------------- builders, one per table family


def profile_tables(point: np.ndarray, draws: np.ndarray, w_prof: np.ndarray, models: list[str],
                   inf: InferenceProtocol, cohort_kind: str,
                   ok: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """profiles (depth + seed averaged common-scale AUC, patient-bootstrap CI and ranks) and the pairwise
    contrasts (BH within each metric); models: the columns of w_prof [cells, M]. With the ok cells (rows of
    draws) under the published stream, the profile draws take the published summary's arithmetic (equal up to
    rounding, which decides ties of quantized metrics: p, rank probabilities); that stream also ranks tied
    models as the summary does (stats.published_ranks), the chunked one shares rank 1 between them."""
    prof_point = point.T @ w_prof  # [3, M]
    prof_draws, _ = profile_draws(draws, w_prof, models, inf, ok)  # [3, D, M]
    ties = "published" if inf.stream == "published" else "shared"  # rank ties within a draw (§8.2)
    prof_rows, con_rows = [], []
    for k, metric in enumerate(METRIC_NAMES):
        lo, hi = st.percentile_ci(prof_draws[k], inf.ci_low, inf.ci_high)
        r1 = st.rank1_prob(prof_draws[k], models, ties)
        mr = st.mean_rank(prof_draws[k], models, ties)
        for i, m in enumerate(models):
            pub = PUBLISHED[metric].get(m, np.nan) if cohort_kind == "ptbxl" else np.nan
            prof_rows.append((m, metric, prof_point[k, i], lo[i], hi[i], r1[i], mr[i], pub))
        fam = []
        for a, b in st.contrast_pairs(models):  # published orientation: (left, right) in MODEL_ORDER
            diff = prof_draws[k][:, a] - prof_draws[k][:, b]
            dlo, dhi = st.percentile_ci(diff, inf.ci_low, inf.ci_high)
            fam.append([metric, models[a], models[b], prof_point[k, a] - prof_point[k, b], float(dlo),
                        float(dhi), st.paired_p(diff)])
        p_bh = st.benjamini_hochberg([r[-1] for r in fam])
        con_rows += [(*r, float(p)) for r, p in zip(fam, p_bh, strict=True)]
    return pd.DataFrame(prof_rows, columns=COLUMNS["profiles"]), pd.DataFrame(con_rows, columns=COLUMNS["contrasts"])


def curve_tables(point: np.ndarray, draws: np.ndarray, w_curve: np.ndarray, targets: list,
                 inf: InferenceProtocol, ok: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """curves (matched scale: each metric per model and E) and rank_stability (primary ok cells, ranked on the
    published means: stats.scale_means); also the curve points [3, T]."""
    curve_point = point.T @ w_curve
    curve_draws = np.einsum("dck,ct->kdt", draws, w_curve)
    models = list(dict.fromkeys(m for m, _ in targets))
    es = sorted(int(e) for e in ok.expansion.unique())
    for k, scale in enumerate(published_draws(draws, ok, models, inf)):
        if scale is not None:  # the published summary's arithmetic (its matched-scale intervals)
            curve_draws[k] = np.stack([scale[:, models.index(m), es.index(int(e))] for m, e in targets], axis=1)
    rows = []
    for k, metric in enumerate(METRIC_NAMES):
        lo, hi = st.percentile_ci(curve_draws[k], inf.ci_low, inf.ci_high)
        rows += [(m, metric, e, curve_point[k, t], lo[t], hi[t]) for t, (m, e) in enumerate(targets)]
    curves = pd.DataFrame(rows, columns=COLUMNS["curves"])
    prim = ok[ok.arm == "primary"][["model", "q", "expansion", "seed"]].assign(
        **{metric: point[(ok.arm == "primary").to_numpy(), k] for k, metric in enumerate(METRIC_NAMES)})
    rs = st.rank_stability(st.scale_means(prim, METRIC_NAMES))  # the three metrics: higher is better
    rs = rs.sort_values(["metric", "expansion_a", "expansion_b"], kind="stable",
                        key=lambda c: c.map(METRIC_NAMES.index) if c.name == "metric" else c)
    return curves, rs[COLUMNS["rank_stability"]], curve_point


def crossed_table(ok: pd.DataFrame, point: np.ndarray, models: list[str], expansions: list[int],
                  depths: list[float], seeds: list[int], inf: InferenceProtocol,
                  num_workers: int | None) -> tuple[pd.DataFrame, Crossed]:
    """crossed: the crossed bootstrap over depth units x seeds of each cell-level (model, depth, seed) AUC."""
    prim = ok[ok.arm == "primary"].assign(_i=lambda d: d.index)
    rows, store = [], {}
    for k, metric in enumerate(METRIC_NAMES):
        vals = np.full((len(models), len(depths), len(seeds)), np.nan)
        for (m, q, s), sub in prim.groupby(["model", "q", "seed"], sort=True):
            if set(sub.expansion) == set(expansions):  # the published arithmetic (ties of quantized metrics)
                row_of = dict(zip(sub.expansion, sub._i, strict=True))
                vals[models.index(m), depths.index(q), seeds.index(s)] = float(
                    trapezoid_auc(point[[row_of[e] for e in expansions], k], expansions))
        have = np.flatnonzero(np.isfinite(vals).any(axis=(1, 2)))
        if have.size == 0:
            continue
        vals = vals[have]
        cdraws = crossed_bootstrap(vals, inf.crossed_draws, inf.seed, crossed_chunk_draws(inf.crossed_draws),
                                   num_workers, stream=inf.stream)
        cpoint = crossed_values(vals, np.ones((1, len(depths))), np.ones((1, len(seeds))))[0]
        lo, hi = st.percentile_ci(cdraws, inf.ci_low, inf.ci_high)
        r1 = st.rank1_prob(cdraws)
        rows += [(models[j], metric, cpoint[i], lo[i], hi[i], r1[i]) for i, j in enumerate(have)]
        store[metric] = ([models[j] for j in have], cdraws, cpoint)
    return pd.DataFrame(rows, columns=COLUMNS["crossed"]), store


def _ordered(df: pd.DataFrame, by: list[str], models: list[str]) -> pd.DataFrame:
    """Sorted by `by`, models in grid order and metrics in DEPTH_SCALE_METRICS order."""
    rank_m = {m: i for i, m in enumerate(models)}
    rank_k = {m: i for i, m in enumerate(DEPTH_SCALE_METRICS)}
    return df.sort_values(by, key=lambda c: c.map(rank_m) if c.name == "model" else (
        c.map(rank_k) if c.name == "metric" else c), kind="stable")


def scale_tables(ok: pd.DataFrame, point: np.ndarray, models: list[str], expansions: list[int],
                 per_depth: dict, curve_point: np.ndarray, curve_targets: list,
                 sensitivity_q: float | None) -> dict[str, pd.DataFrame]:
    """depth_scale (seed-averaged cell values), sensitivity (the summaries by depth, scale and arm) and arm
    (fixed k/d against fixed k/N at the sensitivity depth)."""
    vals = ok[["arm", "model", "q", "expansion", "seed"]].copy()
    for k, metric in enumerate(METRIC_NAMES):
        vals[metric] = point[:, k]
    vals["val_r2"] = ok["val_r2"].astype(float).to_numpy()
    vals["val_dead_fraction"] = ok["val_dead_fraction"].astype(float).to_numpy()
    seedavg = vals.groupby(["arm", "model", "q", "expansion"], sort=True)[DEPTH_SCALE_METRICS].mean().reset_index()
    long = seedavg.melt(id_vars=["arm", "model", "q", "expansion"], value_vars=DEPTH_SCALE_METRICS,
                        var_name="metric")
    ds = _ordered(long[long.arm == "primary"].drop(columns="arm"), ["model", "q", "expansion", "metric"], models)
    out = {"depth_scale": ds[COLUMNS["depth_scale"]].reset_index(drop=True)}

    rank_m = {m: i for i, m in enumerate(models)}
    sens_rows = []
    for k, metric in enumerate(METRIC_NAMES):
        for (m, q), w in sorted(per_depth.items(), key=lambda kv: (rank_m[kv[0][0]], kv[0][1])):
            sens_rows.append((m, metric, "depth", f"{q:g}", float(point[:, k] @ w)))
        for t, (m, e) in enumerate(curve_targets):
            sens_rows.append((m, metric, "scale", str(e), float(curve_point[k, t])))
    if sensitivity_q is not None:
        arm_pd = {arm: depth_auc_weights(ok, arm, models, expansions, [sensitivity_q])
                  for arm in ("primary", "sensitivity")}
        for k, metric in enumerate(METRIC_NAMES):
            for m in models:
                for arm in ("primary", "sensitivity"):
                    w = arm_pd[arm].get((m, sensitivity_q))
                    if w is not None:
                        sens_rows.append((m, metric, "arm", arm, float(point[:, k] @ w)))
        at = long[(long.q == sensitivity_q) & long.metric.isin(METRIC_NAMES)]
        out["arm"] = _ordered(st.arm_comparison(at), ["model", "expansion", "metric"], models).reset_index(drop=True)
    else:
        out["arm"] = pd.DataFrame(columns=COLUMNS["arm"])
    out["sensitivity"] = pd.DataFrame(sens_rows, columns=COLUMNS["sensitivity"])
    return out


def concept_table(point_r: np.ndarray, w_prof: np.ndarray, models: list[str], concepts: list[str]) -> pd.DataFrame:
    """concepts: per-concept common-scale AUC of |r_test| (depth + seed averaged, the profiles' weights)."""
    conc = np.abs(point_r).T @ w_prof  # [C, M]
    fams = concept_families(concepts)
    return pd.DataFrame([(m, c, fams[j], conc[j, i]) for i, m in enumerate(models) for j, c in enumerate(concepts)],
                        columns=COLUMNS["concepts"])


# ---------------------------------------------------------------- main entry


def analyze_run(root: Path, protocol: Protocol, num_workers: int | None = None, cohort_kind: str | None = None,
                write: bool = True, cells_per_block: int = 64,
                allow_incomplete: bool = False) -> dict[str, pd.DataFrame]:
    """Analyze a finished run folder; write every table under tables/ (parquet + csv) and return them.

    An incomplete grid (missing or failed cells) raises IncompleteGridError naming the cells, unless
    allow_incomplete: then every table flags its short denominators (completeness.py).

    cohort_kind: "ptbxl" fills the profiles' `published` column; None reads it from run.yaml.
    num_workers caps concurrent Ray tasks (results do not depend on it).
    """
    from raybench.infra.ray_session import init_ray

    init_ray()
    layout = RunLayout.at(root)
    grid, inf, ev = protocol.grid, protocol.inference, protocol.eval
    cohort_kind = cohort_kind or recorded_cohort_kind(layout)
    ok, missing = select_ok(read_cells(layout), protocol)
    if write and not missing.empty:
        write_table(layout.tables_dir / "missing.parquet", missing)
    expected = expected_keys(protocol)
    check_complete(missing, len(expected), allow_incomplete)
    for row in missing.itertuples(index=False):
        log.warning("analysis skips %s %s q=%g E=%d seed=%d: %s", row.arm, row.model, row.q, row.expansion,
                    row.seed, row.reason)
    concepts = read_concepts(layout, ok)
    paths = [layout.root / str(c) / "patient_stats.npz" for c in ok.cell_dir]
    dtype = np.dtype(inf.gemm_dtype).type
    if num_workers is None:  # a block's bootstrap tasks run while the driver packs the next block
        stats, draws = packed_patient_bootstrap(read_cell_stats(paths, list(ok.cell_id)), list(ok.cell_id),
                                                len(concepts), ev.coverage_threshold, inf.patient_draws, inf.seed,
                                                inf.chunk_draws, cells_per_block, inf.stream, dtype)
    else:
        stats = load_packed_stats(paths, list(ok.cell_id), len(concepts), ev.coverage_threshold,
                                  cells_per_block=cells_per_block, put=True, dtype=dtype)
        draws = patient_bootstrap(stats, inf.patient_draws, inf.seed, inf.chunk_draws, num_workers,
                                  stream=inf.stream)  # [D, cells, 3]
    point = stats.point  # [cells, 3]

    models = [m for m in grid.models if m in set(ok.model)]
    expansions = [int(e) for e in grid.expansions]
    depths = sorted(rounded_q(q) for q in grid.depths)  # ascending: the crossed bootstrap's unit order
    seeds = sorted(int(s) for s in grid.seeds)
    sq = None if grid.sensitivity_depth is None else rounded_q(grid.sensitivity_depth)
    out: dict[str, pd.DataFrame] = {}

    per_depth = depth_auc_weights(ok, "primary", models, expansions, depths)
    if not per_depth:
        raise AnalysisError("no (model, depth) has ok cells at every expansion; cannot form a common-scale AUC")
    w_prof, prof_models = profile_weights(per_depth, models)
    for m in set(models) - set(prof_models):
        log.warning("profiles: %s has no depth with ok cells at every expansion; left out", m)
    out["profiles"], out["contrasts"] = profile_tables(point, draws, w_prof, prof_models, inf, cohort_kind, ok)
    w_curve, curve_targets = curve_weights(ok, models, expansions)
    out["curves"], out["rank_stability"], curve_point = curve_tables(point, draws, w_curve, curve_targets, inf, ok)
    out["crossed"], crossed_store = crossed_table(ok, point, models, expansions, depths, seeds, inf, num_workers)
    out.update(scale_tables(ok, point, models, expansions, per_depth, curve_point, curve_targets, sq))
    out["reproducibility"], repro_pairs = reproducibility_tables(layout, ok, protocol, num_workers)
    if write:  # seeds, streams and index files of every random draw above (randomness/)
        write_randomness(layout.root, protocol, ok, stats, depths, seeds)
    out["concepts"] = concept_table(stats.point_r, w_prof, prof_models, concepts)
    out["missing"] = missing

    keys = grid_frame(expected, ok)
    out = {name: annotate_base(name, df[COLUMNS[name]], keys, sq)[TABLE_COLUMNS[name]] for name, df in out.items()}
    out.update(paper_tables(layout, protocol, ok, point, keys, crossed_store, repro_pairs, models, cohort_kind,
                            num_workers))
    out.update(_paper_numbers(layout, ok, point, out, models, cohort_kind, keys, sq))
    out["concept_intervals"] = _concept_intervals(stats, w_prof, prof_models, concepts, inf, num_workers, keys)
    out.update(with_denominators(rank_and_surface_tables(point, draws, ok, w_prof, prof_models, models, inf), keys))
    for name, df in out.items():
        df = df.reset_index(drop=True)
        out[name] = df
        if write:
            write_table(layout.tables_dir / f"{name}.parquet", df)
    return out


def _paper_numbers(layout: RunLayout, ok: pd.DataFrame, point: np.ndarray, out: dict[str, pd.DataFrame],
                   models: list[str], cohort_kind: str, grid: pd.DataFrame,
                   sq: float | None) -> dict[str, pd.DataFrame]:
    """The numbers the paper states beyond the tables above, and the run beside the paper (docs/protocol.md §10.3)."""
    from raybench.analysis.atlas.paper_numbers import cell_frame, number_tables, with_denominators
    from raybench.analysis.atlas.paper_run import dead_fraction_values
    from raybench.analysis.paper_vs_run.run import comparison_table

    dead, split = dead_fraction_values(layout, ok)
    numbers = number_tables(cell_frame(ok, point, dead, METRIC_NAMES), split, out, models, cohort_kind, grid, sq)
    comparison = comparison_table({**out, **numbers}, cohort_kind)
    return {**numbers, "paper_comparison": with_denominators("paper_comparison", comparison, grid, sq)}


def _concept_intervals(stats, w_prof: np.ndarray, models: list[str], concepts: list[str], inf: InferenceProtocol,
                       num_workers: int | None, grid: pd.DataFrame) -> pd.DataFrame:
    """Concept-level patient-bootstrap CIs of the concepts table's AUCs, on the profiles' draws (§10.3)."""
    from raybench.analysis.atlas.concept_bootstrap import concept_bootstrap, concept_intervals
    from raybench.analysis.atlas.paper_numbers import with_denominators

    draws = concept_bootstrap(stats, w_prof, inf.patient_draws, inf.seed, inf.chunk_draws, num_workers, inf.stream)
    ci = concept_intervals(draws, stats.point_r, w_prof, models, concepts, inf.ci_low, inf.ci_high)
    return with_denominators("concept_intervals", ci, grid, None)
