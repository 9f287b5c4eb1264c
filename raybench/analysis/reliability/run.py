"""The audit on a finished run folder: cheap parts always, heavy parts on request; tables and figures.

    cheap  seed variance decomposition (variance.py), seed profiles and |D|*_3 of a profile (seeds.py),
           flags on the main tables' contrasts, interval-bias detection (intervals.outside_rows), verdicts
    heavy  evaluation reseeds (reseed.py), snapshots through training (training_curve.py), the ground-truth panel
           (panel.py), BCa / basic / shifted intervals of the profiles (intervals.profile_intervals)

Heavy results are kept in tables/reliability_*.parquet with tables/reliability.json naming the cells table they
were computed from; a later cheap pass reuses them while that cells table is unchanged.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.analysis.plotting import load_tables
from raybench.analysis.reliability import intervals, seeds, variance
from raybench.analysis.reliability.mrd import cv, mrd
from raybench.analysis.reliability.verdicts import verdict
from raybench.atomic import read_json, write_json, write_table
from raybench.paths import RunLayout

log = logging.getLogger(__name__)

METRICS = ("reconstruction", "accessibility", "coverage", "dead_fraction", "reproducibility")
DETERMINISTIC = ("reconstruction", "dead_fraction")  # frozen-order evaluation: no draw, reseed sd 0
HEAVY = ("reliability_reseed", "reliability_training", "reliability_training_summary", "reliability_panel",
         "reliability_panel_rho", "reliability_profile_intervals")
SUMMARY_COLUMNS = [
    "metric", "verdict", "rule", "cv_eval", "s_eval", "mrd_1", "mrd_3", "s_seed", "s_seed_profile", "s_profile",
    "mrd_3_profile", "share_model", "share_depth", "share_expansion", "share_seed", "share_interactions",
    "share_residual", "rho_gt_mcc", "rho_gt_f1", "rises_fraction", "rho_step", "discriminability", "tau_seeds",
    "tau_arms", "tau_selection", "n_outside", "contrasts_below_mrd"]


@dataclass
class ReliabilityResult:
    tables: dict[str, pd.DataFrame]
    heavy: bool
    seconds: dict[str, float] = field(default_factory=dict)
    figures: list[Path] = field(default_factory=list)


def cells_digest(layout: RunLayout) -> str:
    return hashlib.sha256(layout.cells_table.read_bytes()).hexdigest()[:16]


def run_reliability(root: str | Path, protocol: Any, rcfg: Any, heavy: bool,
                    num_workers: int | None = None) -> ReliabilityResult:
    """Run the audit on the run folder `root` (protocol: the run's; rcfg: its ReliabilityConfig) and write its
    tables, figures and stamp. heavy=False reuses earlier heavy tables of the same cells table."""
    from raybench.analysis.run_inputs import read_cells, select_ok

    layout = RunLayout.at(root)
    secs: dict[str, float] = {}
    t0 = time.perf_counter()
    tables = load_tables(layout.tables_dir)
    ok, _ = select_ok(read_cells(layout), protocol)
    expansions = sorted(int(e) for e in protocol.grid.expansions)
    long = seeds.cell_values(ok, tables)
    var_rows, s_seed = [], {}
    for metric in [m for m in METRICS if (long.metric == m).any()]:
        rows, s, _df = variance.decompose(long[long.metric == metric], "value")
        var_rows.append(rows.assign(metric=metric))
        s_seed[metric] = s
    out: dict[str, pd.DataFrame] = {
        "reliability_variance": pd.concat(var_rows, ignore_index=True)[variance.COLUMNS] if var_rows
        else pd.DataFrame(columns=variance.COLUMNS)}
    prof = seeds.seed_profiles(long, expansions)
    out["reliability_seed_profiles"] = prof
    noise = seeds.profile_noise(prof).set_index("metric")
    out["reliability_outside"] = intervals.outside_rows(tables)
    secs["cheap"] = time.perf_counter() - t0

    digest = cells_digest(layout)
    stamp_path = layout.tables_dir / "reliability.json"
    if heavy:
        out.update(_heavy(layout, protocol, rcfg, ok, num_workers, secs))
        write_json(stamp_path, {"cells_digest": digest, "heavy": list(HEAVY), "seconds": secs,
                                "reseeds": rcfg.reseeds, "sample_points": rcfg.sample_points,
                                "fractions": list(rcfg.fractions)})
    elif stamp_path.exists() and read_json(stamp_path).get("cells_digest") == digest:
        out.update({n: tables[n] for n in HEAVY if n in tables})
    else:
        for name in HEAVY:  # results of another cells table must not be shown as this one's
            for suffix in (".parquet", ".csv"):
                (layout.tables_dir / f"{name}{suffix}").unlink(missing_ok=True)

    summary, mrd3 = _summary(out, noise, s_seed, tables, protocol)
    out["reliability_contrasts"] = seeds.contrast_flags(tables, mrd3)
    below = out["reliability_contrasts"].groupby("metric").below_mrd_3.sum()
    summary["contrasts_below_mrd"] = summary.metric.map(below).fillna(0).astype(int)
    out["reliability"] = summary[SUMMARY_COLUMNS]
    for name, df in out.items():
        write_table(layout.tables_dir / f"{name}.parquet", df.reset_index(drop=True))
    from raybench.analysis.reliability.figures import make_reliability_figures

    figs = make_reliability_figures(layout.root)
    return ReliabilityResult(out, heavy, secs, figs)


def _heavy(layout: RunLayout, protocol: Any, rcfg: Any, ok: pd.DataFrame, num_workers: int | None,
           secs: dict[str, float]) -> dict[str, pd.DataFrame]:
    from raybench.analysis.reliability import panel, reseed, training_curve
    from raybench.analysis.reliability.ground_truth import SyntheticSpec
    from raybench.analysis.reliability.sampling import sample_points, sampled_stacks

    out: dict[str, pd.DataFrame] = {}
    stacks = sampled_stacks(ok, sample_points(protocol, rcfg.sample_points))
    t = time.perf_counter()
    out["reliability_reseed"] = reseed.evaluation_reseeds(layout.root, stacks, protocol, rcfg.reseeds, num_workers)
    secs["reseed"] = time.perf_counter() - t
    t = time.perf_counter()
    out["reliability_training"], out["reliability_training_summary"] = training_curve.training_curves(
        layout.root, stacks, protocol, tuple(rcfg.fractions), num_workers)
    secs["training"] = time.perf_counter() - t
    t = time.perf_counter()
    spec = panel.PanelSpec(steps=tuple(rcfg.panel_steps), expansions=tuple(rcfg.panel_expansions),
                           ks=tuple(rcfg.panel_ks), synthetic=SyntheticSpec(seed=rcfg.panel_seed))
    out["reliability_panel"] = panel.run_panel(spec, protocol.sae, protocol.eval, num_workers)
    out["reliability_panel_rho"] = panel.ground_truth_rho(out["reliability_panel"])
    secs["panel"] = time.perf_counter() - t
    t = time.perf_counter()
    out["reliability_profile_intervals"] = intervals.profile_intervals(layout.root, protocol, num_workers)
    secs["intervals"] = time.perf_counter() - t
    return out


def _get(df: pd.DataFrame | None, metric: str, col: str) -> float:
    if df is None or df.empty or col not in df or not (df.metric == metric).any():
        return float("nan")
    return float(df.loc[df.metric == metric, col].iloc[0])


def _summary(out: dict[str, pd.DataFrame], noise: pd.DataFrame, s_seed: dict[str, float],
             tables: dict[str, pd.DataFrame], protocol: Any) -> tuple[pd.DataFrame, dict[str, float]]:
    from raybench.analysis.reliability.reseed import reseed_sd

    rs = out.get("reliability_reseed")
    rsd = reseed_sd(rs) if rs is not None and not rs.empty else None
    var = out["reliability_variance"]
    arm = seeds.arm_tau(tables)
    outside = out["reliability_outside"]
    rows, mrd3 = [], {}
    for metric in [m for m in METRICS if (var.metric == m).any()]:
        share = var[var.metric == metric].set_index("factor").share
        if metric in DETERMINISTIC:
            s_eval, df_eval = 0.0, 0
        else:
            s_eval, df_eval = _get(rsd, metric, "s_eval"), int(np.nan_to_num(_get(rsd, metric, "df_eval")))
        mean = _get(rsd, metric, "mean")
        s_prof = float(noise.s_seed_profile.get(metric, np.nan))
        s_tot = float(np.sqrt(s_prof ** 2 + (s_eval if np.isfinite(s_eval) else 0.0) ** 2))
        n_seeds = int(noise.n_seeds.get(metric, 0))
        d3 = mrd(s_tot, 3) if np.isfinite(s_tot) else float("nan")
        mrd3[metric] = d3
        spread = float(noise.spread_models.get(metric, np.nan))
        crit = {
            "metric": metric,
            "cv_eval": 0.0 if metric in DETERMINISTIC else cv(s_eval, mean),
            "s_eval": s_eval,
            "mrd_1": mrd(s_eval, 1, df=df_eval) if df_eval > 0 else (0.0 if s_eval == 0 else np.nan),
            "mrd_3": mrd(s_eval, 3) if np.isfinite(s_eval) else np.nan,
            "s_seed": s_seed.get(metric, np.nan), "s_seed_profile": s_prof, "s_profile": s_tot,
            "mrd_3_profile": d3,
            **{f"share_{f}": float(share.get(f, np.nan)) for f in variance.FACTORS},
            "rho_gt_mcc": _get(out.get("reliability_panel_rho"), metric, "rho_gt_mcc"),
            "rho_gt_f1": _get(out.get("reliability_panel_rho"), metric, "rho_gt_f1"),
            "rises_fraction": _get(out.get("reliability_training_summary"), metric, "rises_fraction"),
            "rho_step": _get(out.get("reliability_training_summary"), metric, "rho_step"),
            "discriminability": spread / (s_tot / np.sqrt(n_seeds)) if s_tot > 0 and n_seeds else np.nan,
            "tau_seeds": float(noise.tau_seeds.get(metric, np.nan)),
            "tau_arms": arm.get(metric, np.nan),
            "tau_selection": _tau_selection(rs, metric),
            "n_outside": int((outside.metric == metric).sum()) if not outside.empty else 0,
        }
        crit["verdict"], crit["rule"] = verdict(crit)
        rows.append(crit)
    return pd.DataFrame(rows), mrd3


def _tau_selection(rs: pd.DataFrame | None, metric: str) -> float:
    """Mean Kendall tau between the model orders of every two selection reseeds (per sampled point and seed)."""
    import itertools

    from scipy.stats import kendalltau

    if rs is None or rs.empty:
        return float("nan")
    sub = rs[(rs.metric == metric) & (rs.source == "selection_subset")]
    taus = []
    for _, g in sub.groupby(["q", "expansion", "seed"]):
        wide = g.pivot(index="reseed", columns="model", values="value")
        if wide.shape[1] < 2:
            continue
        for a, b in itertools.combinations(wide.index, 2):
            x, y = wide.loc[a].to_numpy(float), wide.loc[b].to_numpy(float)
            taus.append(1.0 if np.array_equal(x, y) else kendalltau(x, y).statistic)
    return float(np.nanmean(taus)) if taus else float("nan")
