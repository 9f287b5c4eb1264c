"""`analyze_run`: a finished run folder -> the analysis tables (profiles, contrasts, curves, ...).

Every summary the paper reports (seed average, depth average, common-scale AUC over E) is linear in
the cell-level metric, so each one is a weight matrix [cells, targets]; the bootstrap draws
[draws, cells] are mapped through the same matrices, which keeps point values and intervals consistent.
Only ok cells enter; grid points with no ok cell are listed in the `missing` table and logged. An
incomplete grid is refused unless allow_incomplete, and then every table flags its short denominators
(completeness.py). The paper analyses beyond these tables come from paper_run.py.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import yaml

from raybench.analysis import stats as st
from raybench.analysis.bootstrap import (
    METRIC_NAMES,
    StatsError,
    _run_bounded,
    crossed_bootstrap,
    crossed_values,
    load_patient_stats,
    patient_bootstrap,
)
from raybench.analysis.completeness import AnalysisError, annotate_base, check_complete, grid_frame
from raybench.analysis.metrics import auc_weights, reproducibility, trapezoid_auc
from raybench.analysis.randomness import crossed_chunk_draws, pair_floor_seeds, write_randomness
from raybench.config import Protocol
from raybench.io import read_json, write_table
from raybench.paths import RunLayout

log = logging.getLogger(__name__)

# docs/protocol.md §10.1: published PTB-XL common-scale AUCs (the report's "paper" column).
PUBLISHED: dict[str, dict[str, float]] = {
    "reconstruction": {"hubert_ecg": .985, "ecg_jepa": .972, "csfm": .964, "ecg_fm": .940, "cardiac_fm": .936,
                       "st_mem": .916},
    "accessibility": {"ecg_jepa": .351, "ecg_fm": .331, "cardiac_fm": .331, "st_mem": .314, "hubert_ecg": .272,
                      "csfm": .266},
    "coverage": {"cardiac_fm": .806, "ecg_fm": .788, "ecg_jepa": .772, "st_mem": .726, "hubert_ecg": .663,
                 "csfm": .659},
}

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
    "missing": ["arm", "model", "q", "expansion", "seed", "cell_id", "reason"],
}
TABLE_COLUMNS = {k: v if k == "missing" else [*v, "n_expected", "n_present", "short_denominator"]
                 for k, v in COLUMNS.items()}  # as written: completeness.DENOM_COLUMNS appended
CELL_COLUMNS = ("cell_id", "model", "q", "arm", "expansion", "seed", "status", "val_r2", "val_dead_fraction",
                "cell_dir")


# ---------------------------------------------------------------- inputs


def _q(q: float) -> float:
    return round(float(q), 6)


def _read_cells(layout: RunLayout) -> pd.DataFrame:
    if not layout.cells_table.exists():
        raise AnalysisError(f"{layout.cells_table}: no cells table; run `raybench train` (or `raybench grid`) first")
    cells = pd.read_parquet(layout.cells_table)
    lacking = [c for c in CELL_COLUMNS if c not in cells.columns]
    if lacking:
        raise AnalysisError(f"{layout.cells_table}: missing column(s) {lacking}; rewrite it with the SAE stage")
    cells = cells.copy()
    cells["q"] = cells["q"].map(_q)
    cells["expansion"] = cells["expansion"].astype(int)
    cells["seed"] = cells["seed"].astype(int)
    return cells


def _expected(protocol: Protocol) -> list[tuple[str, str, float, int, int]]:
    g = protocol.grid
    keys = [("primary", m, _q(q), int(e), int(s))
            for m, q, e, s in itertools.product(g.models, g.depths, g.expansions, g.seeds)]
    if g.sensitivity_depth is not None:
        keys += [("sensitivity", m, _q(g.sensitivity_depth), int(e), int(s))
                 for m, e, s in itertools.product(g.models, g.expansions, g.seeds)]
    return keys


def _select_ok(cells: pd.DataFrame, protocol: Protocol) -> tuple[pd.DataFrame, pd.DataFrame]:
    """-> (ok cells of the protocol grid in a fixed order, missing grid points with reasons)."""
    key_cols = ["arm", "model", "q", "expansion", "seed"]
    by_key: dict[tuple, dict] = {}
    for r in cells.to_dict("records"):  # a retried cell may have several rows: an ok one wins
        key = tuple(r[c] for c in key_cols)
        if key not in by_key or str(r["status"]) == "ok":
            by_key[key] = r
    ok_rows, missing = [], []
    for key in _expected(protocol):
        row = by_key.get(key)
        if row is None:
            missing.append((*key, "", "no row in cells table"))
        elif str(row["status"]) != "ok":
            missing.append((*key, str(row["cell_id"]), str(row["status"])))
        else:
            ok_rows.append(row)
    missing_df = pd.DataFrame(missing, columns=COLUMNS["missing"])
    if not ok_rows:
        raise AnalysisError("no ok cells of the protocol grid in the cells table; nothing to analyze")
    ok = pd.DataFrame(ok_rows).reset_index(drop=True)
    return ok, missing_df


def _concepts(layout: RunLayout, ok: pd.DataFrame) -> list[str]:
    names: list[str] | None = None
    for cid, cdir in zip(ok.cell_id, ok.cell_dir, strict=True):
        path = layout.root / str(cdir) / "metrics.json"
        if not path.exists():
            raise StatsError(f"{path}: missing for ok cell {cid}; rerun the SAE stage for it")
        got = list(read_json(path).get("concepts", []))
        if not got:
            raise StatsError(f"{path}: no 'concepts' list")
        if names is None:
            names = got
        elif got != names:
            raise StatsError(f"{path}: concept list differs from the other cells; every cell must use one panel")
    return names or []


def _cohort_kind(layout: RunLayout) -> str:
    if layout.run_yaml.exists():
        raw = yaml.safe_load(layout.run_yaml.read_text()) or {}
        return str((raw.get("cohort") or {}).get("kind", "synth"))
    return "synth"


# ---------------------------------------------------------------- linear summaries


def _seed_weights(ok: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """1 / (number of ok seeds) for each selected row (within its arm, model, depth, E)."""
    w = np.zeros(len(ok))
    sub = ok.iloc[rows]
    counts = sub.groupby(["arm", "model", "q", "expansion"])["seed"].transform("count").to_numpy()
    w[rows] = 1.0 / counts
    return w


def _curve_weights(ok: pd.DataFrame, models: list[str], expansions: list[int]) -> tuple[np.ndarray, list]:
    """Targets (model, E): mean over depths of the seed mean (primary arm)."""
    prim = np.flatnonzero((ok.arm == "primary").to_numpy())
    ws = _seed_weights(ok, prim)
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


def _auc_weights(ok: pd.DataFrame, arm: str, models: list[str], expansions: list[int],
                 depths: list[float]) -> dict[tuple[str, float], np.ndarray]:
    """Targets (model, q): common-scale AUC of the seed mean; only depths with ok cells at every E."""
    rows = np.flatnonzero((ok.arm == arm).to_numpy())
    ws = _seed_weights(ok, rows)
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


def _profile_weights(per_depth: dict, models: list[str]) -> tuple[np.ndarray, list[str]]:
    """Targets model: mean over the complete depths of the per-depth AUC weights."""
    cols, kept = [], []
    for m in models:
        ws = [w for (mm, _), w in per_depth.items() if mm == m]
        if ws:
            cols.append(np.mean(ws, axis=0))
            kept.append(m)
    return np.stack(cols, axis=1), kept


# ---------------------------------------------------------------- reproducibility (Ray tasks)


@ray.remote(num_cpus=1)
def _repro_task(paths: list[str], top: int, n_perm: int, seed: int,
                pair_seeds: list[int] | None = None) -> dict[str, float]:
    decs = []
    for p in paths:
        with np.load(p, allow_pickle=False) as z:
            if "columns" not in z.files:
                raise StatsError(f"{p}: no 'columns' array; expected columns [d, m] and indices [m]")
            decs.append(z["columns"])
    return reproducibility(decs, top, n_perm, seed, pair_seeds)


def _repro_seed(base: int, model: str, q: float, e: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{base}:{model}:{q:g}:{e}".encode()).digest()[:8], "big")


def _reproducibility(layout: RunLayout, ok: pd.DataFrame, protocol: Protocol,
                     num_workers: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """-> (the reproducibility table, its values per seed pair: paper_analyses 'reproducibility_pairs')."""
    prim = ok[ok.arm == "primary"]
    jobs, keys = [], []
    for (m, q, e), sub in prim.groupby(["model", "q", "expansion"], sort=True):
        if len(sub) < 2:
            log.warning("reproducibility: %s q=%g E=%d has %d ok seed(s); needs 2", m, q, e, len(sub))
            continue
        paths = []
        for cdir in sub.sort_values("seed").cell_dir:
            path = (layout.root / str(cdir) / "decoder_top.npz").resolve()
            if not path.exists():
                raise StatsError(f"{path}: missing; rerun the SAE stage for this cell")
            paths.append(str(path))
        seed = _repro_seed(protocol.inference.seed, m, q, e)
        pair_seeds = pair_floor_seeds(protocol.inference.stream, m, int(sub.layer.iloc[0]), q, int(e), "primary",
                                      [int(s) for s in sub.seed])  # published stream: one generator per seed pair
        jobs.append(lambda p=paths, s=seed, ps=pair_seeds: _repro_task.remote(
            p, protocol.eval.repro_top, protocol.eval.repro_permutations, s, ps))
        keys.append((m, q, e, sorted(int(s) for s in sub.seed)))
    results = _run_bounded(jobs, num_workers)
    rows = [{"model": m, "q": q, "expansion": int(e), **{k: r[k] for k in COLUMNS["reproducibility"][3:]}}
            for (m, q, e, _), r in zip(keys, results, strict=True)]
    pairs = [(m, q, int(e), ss[i], ss[j], mc, rf, mc - rf, ov)
             for (m, q, e, ss), r in zip(keys, results, strict=True) for i, j, mc, rf, ov in r["pairs"]]
    return pd.DataFrame(rows, columns=COLUMNS["reproducibility"]), pd.DataFrame(pairs, columns=[
        "model", "q", "expansion", "seed_a", "seed_b", "matched_cosine", "random_floor", "excess", "subspace_overlap"])


# ---------------------------------------------------------------- concept family


def _family(name: str) -> str:
    from raybench.cohorts.panel import family_of

    try:
        return family_of(name)
    except KeyError:
        return "WAVEFORM"


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
    from raybench.ray_session import init_ray

    init_ray()
    layout = RunLayout.at(root)
    grid, inf, ev = protocol.grid, protocol.inference, protocol.eval
    cohort_kind = cohort_kind or _cohort_kind(layout)
    cells = _read_cells(layout)
    ok, missing = _select_ok(cells, protocol)
    if write and not missing.empty:
        write_table(layout.tables_dir / "missing.parquet", missing)
    check_complete(missing, len(_expected(protocol)), allow_incomplete)
    for row in missing.itertuples(index=False):
        log.warning("analysis skips %s %s q=%g E=%d seed=%d: %s", row.arm, row.model, row.q, row.expansion,
                    row.seed, row.reason)
    concepts = _concepts(layout, ok)
    stats = load_patient_stats([layout.root / str(c) / "patient_stats.npz" for c in ok.cell_dir], list(ok.cell_id),
                               len(concepts), ev.coverage_threshold, cells_per_block=cells_per_block, put=True,
                               dtype=np.dtype(inf.gemm_dtype).type)
    draws = patient_bootstrap(stats, inf.patient_draws, inf.seed, inf.chunk_draws, num_workers,
                              stream=inf.stream)  # [D, cells, 3]
    point = stats.point  # [cells, 3]

    models = [m for m in grid.models if m in set(ok.model)]
    expansions = [int(e) for e in grid.expansions]
    depths = sorted(_q(q) for q in grid.depths)  # ascending: the crossed bootstrap's unit order
    lo_p, hi_p = inf.ci_low, inf.ci_high
    out: dict[str, pd.DataFrame] = {}

    # profiles + contrasts (patient bootstrap, depth + seed averaged common-scale AUC)
    per_depth = _auc_weights(ok, "primary", models, expansions, depths)
    if not per_depth:
        raise AnalysisError("no (model, depth) has ok cells at every expansion; cannot form a common-scale AUC")
    w_prof, prof_models = _profile_weights(per_depth, models)
    for m in set(models) - set(prof_models):
        log.warning("profiles: %s has no depth with ok cells at every expansion; left out", m)
    prof_point = point.T @ w_prof  # [3, M]
    prof_draws = np.einsum("dck,cm->kdm", draws, w_prof)  # [3, D, M]
    prof_rows, con_rows = [], []
    for k, metric in enumerate(METRIC_NAMES):
        lo, hi = st.percentile_ci(prof_draws[k], lo_p, hi_p)
        r1, mr = st.rank1_prob(prof_draws[k]), st.mean_rank(prof_draws[k])
        for i, m in enumerate(prof_models):
            pub = PUBLISHED[metric].get(m, np.nan) if cohort_kind == "ptbxl" else np.nan
            prof_rows.append((m, metric, prof_point[k, i], lo[i], hi[i], r1[i], mr[i], pub))
        order = sorted(range(len(prof_models)), key=lambda i: (-prof_point[k, i], prof_models[i]))
        fam = []
        for a, b in itertools.combinations(order, 2):
            diff = prof_draws[k][:, a] - prof_draws[k][:, b]
            dlo, dhi = st.percentile_ci(diff, lo_p, hi_p)
            fam.append([metric, prof_models[a], prof_models[b], prof_point[k, a] - prof_point[k, b], float(dlo),
                        float(dhi), st.paired_p(diff)])
        p_bh = st.benjamini_hochberg([r[-1] for r in fam])
        con_rows += [(*r, float(p)) for r, p in zip(fam, p_bh, strict=True)]
    out["profiles"] = pd.DataFrame(prof_rows, columns=COLUMNS["profiles"])
    out["contrasts"] = pd.DataFrame(con_rows, columns=COLUMNS["contrasts"])

    # curves (matched scale) + rank stability
    w_curve, curve_targets = _curve_weights(ok, models, expansions)
    curve_point = point.T @ w_curve
    curve_draws = np.einsum("dck,ct->kdt", draws, w_curve)
    curve_rows = []
    for k, metric in enumerate(METRIC_NAMES):
        lo, hi = st.percentile_ci(curve_draws[k], lo_p, hi_p)
        curve_rows += [(m, metric, e, curve_point[k, t], lo[t], hi[t]) for t, (m, e) in enumerate(curve_targets)]
    out["curves"] = pd.DataFrame(curve_rows, columns=COLUMNS["curves"])
    rs = st.rank_stability(out["curves"])
    rs = rs.sort_values(["metric", "expansion_a", "expansion_b"], kind="stable",
                        key=lambda c: c.map(METRIC_NAMES.index) if c.name == "metric" else c)
    out["rank_stability"] = rs[COLUMNS["rank_stability"]]

    # crossed bootstrap over depth units x seeds of the cell-level AUC
    prim = ok[ok.arm == "primary"].assign(_i=lambda d: d.index)
    seeds = sorted(int(s) for s in grid.seeds)
    crossed_rows, crossed_store = [], {}
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
        lo, hi = st.percentile_ci(cdraws, lo_p, hi_p)
        r1 = st.rank1_prob(cdraws)
        crossed_rows += [(models[j], metric, cpoint[i], lo[i], hi[i], r1[i]) for i, j in enumerate(have)]
        crossed_store[metric] = ([models[j] for j in have], cdraws, cpoint)
    out["crossed"] = pd.DataFrame(crossed_rows, columns=COLUMNS["crossed"])

    # depth x scale table (seed-averaged cell values), sensitivity factors, arm comparison
    vals = ok[["arm", "model", "q", "expansion", "seed"]].copy()
    for k, metric in enumerate(METRIC_NAMES):
        vals[metric] = point[:, k]
    vals["val_r2"] = ok["val_r2"].astype(float).to_numpy()
    vals["val_dead_fraction"] = ok["val_dead_fraction"].astype(float).to_numpy()
    ds_metrics = [*METRIC_NAMES, "val_r2", "val_dead_fraction"]
    seedavg = vals.groupby(["arm", "model", "q", "expansion"], sort=True)[ds_metrics].mean().reset_index()
    long = seedavg.melt(id_vars=["arm", "model", "q", "expansion"], value_vars=ds_metrics, var_name="metric")
    rank_m = {m: i for i, m in enumerate(models)}
    rank_k = {m: i for i, m in enumerate(ds_metrics)}
    ds = long[long.arm == "primary"].drop(columns="arm")
    ds = ds.sort_values(["model", "q", "expansion", "metric"], key=lambda c: c.map(rank_m) if c.name == "model" else (
        c.map(rank_k) if c.name == "metric" else c), kind="stable")
    out["depth_scale"] = ds[COLUMNS["depth_scale"]].reset_index(drop=True)

    sens_rows = []
    for k, metric in enumerate(METRIC_NAMES):
        for (m, q), w in sorted(per_depth.items(), key=lambda kv: (rank_m[kv[0][0]], kv[0][1])):
            sens_rows.append((m, metric, "depth", f"{q:g}", float(point[:, k] @ w)))
        for t, (m, e) in enumerate(curve_targets):
            sens_rows.append((m, metric, "scale", str(e), float(curve_point[k, t])))
    arm_pd: dict[str, dict] = {}
    if grid.sensitivity_depth is not None:
        sq = _q(grid.sensitivity_depth)
        for arm in ("primary", "sensitivity"):
            arm_pd[arm] = _auc_weights(ok, arm, models, expansions, [sq])
        for k, metric in enumerate(METRIC_NAMES):
            for m in models:
                for arm in ("primary", "sensitivity"):
                    w = arm_pd[arm].get((m, sq))
                    if w is not None:
                        sens_rows.append((m, metric, "arm", arm, float(point[:, k] @ w)))
        at = long[(long.q == sq) & long.metric.isin(METRIC_NAMES)]
        arm_tab = st.arm_comparison(at)
        arm_tab = arm_tab.sort_values(["model", "expansion", "metric"], key=lambda c: c.map(rank_m) if c.name == "model"
                                      else (c.map(rank_k) if c.name == "metric" else c), kind="stable")
        out["arm"] = arm_tab.reset_index(drop=True)
    else:
        out["arm"] = pd.DataFrame(columns=COLUMNS["arm"])
    out["sensitivity"] = pd.DataFrame(sens_rows, columns=COLUMNS["sensitivity"])

    out["reproducibility"], repro_pairs = _reproducibility(layout, ok, protocol, num_workers)
    if write:  # seeds, streams and index files of every random draw above (randomness/)
        write_randomness(layout.root, protocol, ok, stats, depths, seeds)

    # per-concept common-scale AUC of |r_test| (depth + seed averaged, same weights as the profiles)
    conc = np.abs(stats.point_r).T @ w_prof  # [C, M]
    fams = [_family(c) for c in concepts]
    out["concepts"] = pd.DataFrame(
        [(m, c, fams[j], conc[j, i]) for i, m in enumerate(prof_models) for j, c in enumerate(concepts)],
        columns=COLUMNS["concepts"])
    out["missing"] = missing

    from raybench.analysis.paper_run import paper_tables

    keys = grid_frame(_expected(protocol), ok)
    sq = None if grid.sensitivity_depth is None else _q(grid.sensitivity_depth)
    out = {name: annotate_base(name, df[COLUMNS[name]], keys, sq)[TABLE_COLUMNS[name]] for name, df in out.items()}
    out.update(paper_tables(layout, protocol, ok, point, keys, crossed_store, repro_pairs, models, cohort_kind,
                            num_workers))
    for name, df in out.items():
        df = df.reset_index(drop=True)
        out[name] = df
        if write:
            write_table(layout.tables_dir / f"{name}.parquet", df)
    return out
