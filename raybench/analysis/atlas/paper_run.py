"""The paper analyses of `paper_analyses.py` on a run: inputs from analyze_run, Ray crossed bootstraps, tables.

Called by `tables.analyze_run` after the base tables; returns tables named as in PAPER_COLUMNS, each with
the denominator columns of `completeness.py`. Streams: the crossed bootstraps call
`bootstrap.crossed_bootstrap` exactly as the base `crossed` table does (so dead fraction and reproducibility
share its depth x seed draws); the paired-seed arm bootstrap draws `default_rng(inference.seed).integers`
as the published sensitivity script does with its seed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np
import pandas as pd

from raybench.analysis.atlas import paper_analyses as pa
from raybench.analysis.completeness import attach, counts, finish, sum_of
from raybench.analysis.inference import stats as st
from raybench.analysis.inference.bootstrap import crossed_bootstrap, crossed_values
from raybench.analysis.inference.packed_stats import METRIC_NAMES
from raybench.analysis.inference.streams import crossed_chunk_draws
from raybench.core.atomic import read_json
from raybench.core.config import Protocol
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

Crossed = dict[str, tuple[list[str], np.ndarray, np.ndarray]]  # metric -> (models, draws [n, M], point [M])


def _crossed(values: np.ndarray, protocol: Protocol, num_workers: int | None) -> np.ndarray:
    """The crossed bootstrap with the base `crossed` table's arguments (same stream, seed and chunking)."""
    inf = protocol.inference
    return crossed_bootstrap(values, inf.crossed_draws, inf.seed, crossed_chunk_draws(inf.crossed_draws), num_workers,
                             stream=inf.stream)


def _crossed_units(values: np.ndarray, models: Sequence[str], protocol: Protocol,
                   num_workers: int | None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Models with any unit, crossed draws [n, M'] and point values (mean of the available units)."""
    have = np.flatnonzero(np.isfinite(values).any(axis=(1, 2)))
    if have.size == 0:
        return [], np.zeros((0, 0)), np.zeros(0)
    vals = values[have]
    point = crossed_values(vals, np.ones((1, vals.shape[1])), np.ones((1, vals.shape[2])))[0]
    return [models[i] for i in have], _crossed(vals, protocol, num_workers), point


def dead_fraction_values(layout: RunLayout, ok: pd.DataFrame) -> tuple[np.ndarray, str]:
    """Each ok cell's test dead fraction (metrics.json; the split of the published inference), else validation."""
    vals = []
    for cdir in ok.cell_dir:
        path = layout.root / str(cdir) / "metrics.json"
        vals.append(float(read_json(path).get("test_dead_fraction", np.nan)) if path.exists() else np.nan)
    out = np.asarray(vals, dtype=np.float64)
    if out.size and np.isfinite(out).all():
        return out, "test"
    log.info("dead fraction: some cells record no test_dead_fraction; using the validation split for all")
    return ok["val_dead_fraction"].astype(float).to_numpy(), "val"


def paper_tables(layout: RunLayout, protocol: Protocol, ok: pd.DataFrame, point: np.ndarray, grid: pd.DataFrame,
                 crossed: Crossed, repro_pairs: pd.DataFrame, models: list[str], cohort_kind: str,
                 num_workers: int | None = None) -> dict[str, pd.DataFrame]:
    """ok: ok cells (rows aligned with point [cells, 3]); grid: completeness.grid_frame; crossed: the base
    crossed bootstrap per metric; repro_pairs: per seed pair reproducibility (model, q, expansion, seed_a, seed_b,
    matched_cosine, random_floor, excess, subspace_overlap)."""
    g, inf = protocol.grid, protocol.inference
    lo, hi = inf.ci_low, inf.ci_high
    expansions = [int(e) for e in g.expansions]
    depths = sorted({round(float(q), 6) for q in g.depths})
    seeds = sorted(int(s) for s in g.seeds)
    prim_grid = grid[grid.arm == "primary"]
    out: dict[str, pd.DataFrame] = {}

    out["fidelity_gate"], out["fidelity_gate_models"] = pa.fidelity_gate(ok, grid, protocol.eval.gate_r2,
                                                                         protocol.eval.gate_dead)

    # dead-fraction profile: curve over E, Kendall tau between E pairs, crossed-bootstrap common-scale AUC
    dead, split = dead_fraction_values(layout, ok)
    frame = ok[["arm", "model", "q", "expansion", "seed"]].assign(value=dead)
    prim = frame[frame.arm == "primary"]
    curve = pa.dead_fraction_curve(prim, split)
    out["dead_fraction"] = attach(curve, counts(prim_grid, ["model", "expansion"]),
                                  {"model": "model", "expansion": "expansion"})
    means = st.scale_means(prim.rename(columns={"value": "dead_fraction"}), ["dead_fraction"])
    rs = pa.scale_rank_stability(means, models, higher_better=False).assign(split=split)
    out["dead_fraction_rank_stability"] = sum_of(rs, counts(prim_grid, ["expansion"]), "expansion",
                                                  ("expansion_a", "expansion_b"))
    dmodels, ddraws, dpoint = _crossed_units(pa.auc_units(prim, models, depths, seeds, expansions), models,
                                             protocol, num_workers)
    rows = [(m, split, a, clo, chi) for m, a, clo, chi, _ in pa.crossed_auc_rows(dmodels, dpoint, ddraws, lo, hi)]
    out["dead_fraction_auc"] = attach(pd.DataFrame(rows, columns=["model", "split", "auc", "ci_low", "ci_high"]),
                                      counts(prim_grid, ["model"]), {"model": "model"})

    # crossed-bootstrap pairwise contrasts (the three base metrics + dead fraction), BH within each metric
    parts = [pa.pairwise_contrasts(metric, crossed[metric][0], crossed[metric][2], crossed[metric][1], lo, hi)
             for metric in METRIC_NAMES if metric in crossed]
    if dmodels:
        parts.append(pa.pairwise_contrasts("dead_fraction", dmodels, dpoint, ddraws, lo, hi))
    con = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=pa.PAPER_COLUMNS[
        "crossed_contrasts"][:8])
    out["crossed_contrasts"] = sum_of(con, counts(prim_grid, ["model"]), "model", ("model_a", "model_b"))

    # sparsity arms at the sensitivity depth
    if g.sensitivity_depth is not None:
        sq = round(float(g.sensitivity_depth), 6)
        at = ok.q == sq
        arms = ok.loc[at, ["arm", "model", "expansion", "seed"]].copy()
        for k, metric in enumerate(METRIC_NAMES):
            arms[metric] = point[at.to_numpy(), k]
        arms["dead_fraction"] = dead[at.to_numpy()]
        metrics = {**{m: True for m in METRIC_NAMES}, "dead_fraction": False}
        draws = pa.paired_seed_draws(inf.seed, inf.crossed_draws, len(seeds))
        arm = pa.arm_tables(arms, metrics, models, expansions, seeds, draws, lo, hi)
        sub = grid[grid.q == sq]
        out["arm_rank_agreement"] = attach(arm["arm_rank_agreement"], counts(sub, ["expansion"]),
                                           {"expansion": "expansion"})
        out["arm_differences"] = attach(arm["arm_differences"], counts(sub, ["model", "expansion"]),
                                        {"model": "model", "expansion": "expansion"})
        out["arm_auc_differences"] = attach(arm["arm_auc_differences"], counts(sub, ["model"]), {"model": "model"})
    else:
        for name in ("arm_rank_agreement", "arm_differences", "arm_auc_differences"):
            out[name] = pd.DataFrame(columns=pa.PAPER_COLUMNS[name])

    # reproducibility: per seed pair, and the common-scale AUC with a crossed bootstrap (depth units x seed pairs)
    pairs_at = pa.seed_pairs(seeds)
    rp = repro_pairs.assign(pair=list(zip(repro_pairs.seed_a, repro_pairs.seed_b, strict=True)))
    out["reproducibility_pairs"] = attach(repro_pairs, counts(prim_grid, ["model", "q", "expansion"]),
                                          {"model": "model", "q": "q", "expansion": "expansion"})
    rows = []
    for measure in pa.REPRO_MEASURES if pairs_at else ():  # one seed: no pair, reproducibility is undefined
        units = pa.auc_units(rp.assign(value=rp[measure]), models, depths, pairs_at, expansions, unit_col="pair")
        rmodels, rdraws, rpoint = _crossed_units(units, models, protocol, num_workers)
        pub = pa.PUBLISHED_REPRODUCIBILITY[measure]
        rows += [(m, measure, a, clo, chi, r1, pub.get(m, np.nan) if cohort_kind == "ptbxl" else np.nan)
                 for m, a, clo, chi, r1 in pa.crossed_auc_rows(rmodels, rpoint, rdraws, lo, hi)]
    out["reproducibility_auc"] = attach(pd.DataFrame(rows, columns=pa.PAPER_COLUMNS["reproducibility_auc"][:7]),
                                        counts(prim_grid, ["model"]), {"model": "model"})

    return {name: finish(df)[pa.PAPER_COLUMNS[name]].reset_index(drop=True) for name, df in out.items()}
