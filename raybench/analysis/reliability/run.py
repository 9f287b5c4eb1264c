"""The audit on a finished run folder: cheap parts always, heavy parts on request; its tables (figures.py draws
the figures from them at render).

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

from raybench.analysis.reliability import evidence, intervals, seeds, variance
from raybench.analysis.reliability.criteria import CRITERIA, assess
from raybench.analysis.reliability.mrd import mrd
from raybench.analysis.reliability.verdicts import CLASSES, class_states, verdict_from
from raybench.analysis.report.plotting import load_tables
from raybench.core.atomic import read_json, write_json, write_table
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

METRICS = ("reconstruction", "accessibility", "coverage", "dead_fraction", "reproducibility")
DETERMINISTIC = ("reconstruction", "dead_fraction")  # frozen-order evaluation: no draw, reseed sd 0
HEAVY = ("reliability_reseed", "reliability_reseed_cells", "reliability_training", "reliability_training_summary",
         "reliability_panel", "reliability_panel_rho", "reliability_panel_flags", "reliability_profile_intervals")
VALUE_COLUMNS = [
    "share_cells", "share_cells_p", "share_seed_cells", "sd_variant", "share_snapshots", "share_snapshots_p",
    "share_seed", "share_snapshot", "snr", "snr_p", "winners", "winners_p", "n_variants", "n_seeds", "rank_rho",
    "rank_p", "rho_step", "p_rise", "p_decline", "rho_gt_mcc", "p_gt_mcc", "rho_gt_f1", "p_gt_f1", "n_gt",
    "reseed_s", "reseed_s_min", "reseed_s_max", "reseed_cv", "reseed_mrd_1", "reseed_mrd_3", "s_seed_profile",
    "mrd_3_profile", "tau_seeds", "tau_arms", "tau_selection", "n_outside", "encoder_only", "saturated",
    "out_tracks", "rho_gt_min_variants", "share_cells_df", "share_snapshots_df", "pairs", "rank_p_min",
    "rho_gt_mcc_step", "rho_gt_f1_step", "rho_step_gt_mcc", "rho_gt_out"]
SUMMARY_COLUMNS = ["metric", "verdict", "rule", *[f"class_{c}" for c in CLASSES],
                   *[f"state_{c}" for c in CRITERIA], *[f"null_{c}" for c in CRITERIA],
                   *VALUE_COLUMNS, "contrasts_below_mrd"]


@dataclass
class ReliabilityResult:
    tables: dict[str, pd.DataFrame]
    heavy: bool
    seconds: dict[str, float] = field(default_factory=dict)


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
    var_rows = []
    for metric in [m for m in METRICS if (long.metric == m).any()]:
        rows, _s, _df = variance.decompose(long[long.metric == metric], "value")
        var_rows.append(rows.assign(metric=metric))
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

    summary, mrd3 = _summary(out, noise, long, tables, rcfg)
    out["reliability_contrasts"] = seeds.contrast_flags(tables, mrd3)
    below = out["reliability_contrasts"].groupby("metric").below_mrd_3.sum()
    summary["contrasts_below_mrd"] = summary.metric.map(below).fillna(0).astype(int)
    out["reliability"] = summary[SUMMARY_COLUMNS]
    for name, df in out.items():
        write_table(layout.tables_dir / f"{name}.parquet", df.reset_index(drop=True))
    return ReliabilityResult(out, heavy, secs)


def _heavy(layout: RunLayout, protocol: Any, rcfg: Any, ok: pd.DataFrame, num_workers: int | None,
           secs: dict[str, float]) -> dict[str, pd.DataFrame]:
    from raybench.analysis.reliability import panel, panel_rho, reseed, training_curve
    from raybench.analysis.reliability.sampling import sample_points, sampled_stacks

    out: dict[str, pd.DataFrame] = {}
    stacks = sampled_stacks(ok, sample_points(protocol, rcfg.sample_points))
    t = time.perf_counter()
    out["reliability_reseed"] = reseed.evaluation_reseeds(layout.root, stacks, protocol, rcfg.reseeds, num_workers)
    out["reliability_reseed_cells"] = reseed.per_cell(out["reliability_reseed"],
                                                      reseed.selection_is_drawn(layout.root, protocol))
    secs["reseed"] = time.perf_counter() - t
    t = time.perf_counter()
    out["reliability_training"], out["reliability_training_summary"] = training_curve.training_curves(
        layout.root, stacks, protocol, tuple(rcfg.fractions), num_workers)
    secs["training"] = time.perf_counter() - t
    t = time.perf_counter()
    spec = panel.panel_spec(rcfg)
    out["reliability_panel"] = panel.run_panel(spec, protocol.sae, protocol.eval, num_workers)
    out["reliability_panel_rho"] = panel_rho.ground_truth_rho(out["reliability_panel"])
    source = f"s{max(spec.steps)}-E{max(spec.expansions)}-k{max(spec.ks)}"
    out["reliability_panel_flags"] = panel_rho.control_flags(out["reliability_panel"], out["reliability_panel_rho"],
                                                             source)
    secs["panel"] = time.perf_counter() - t
    t = time.perf_counter()
    out["reliability_profile_intervals"] = intervals.profile_intervals(layout.root, protocol, num_workers)
    secs["intervals"] = time.perf_counter() - t
    return out


def _get(df: pd.DataFrame | None, metric: str, col: str) -> float:
    if df is None or df.empty or col not in df or not (df.metric == metric).any():
        return float("nan")
    return float(df.loc[df.metric == metric, col].iloc[0])


def _training_evidence(training: pd.DataFrame | None, metric: str, warmup: float) -> dict[str, float]:
    """The snapshot design (post-warmup fractions, per-cell series) and the trend over every snapshot (per cell,
    or per stack for reproducibility, whose series carry seed -1)."""
    if training is None or training.empty or not (training.metric == metric).any():
        return {}
    sub = training[training.metric == metric]
    sub = sub.assign(value=evidence.orient(metric, sub.value.to_numpy(float)))
    series = [g.sort_values("step").value.to_numpy(float) for _, g in sub.groupby(["model", "q", "expansion", "seed"])]
    out = evidence.trend_evidence(series)
    post = sub[(sub.fraction >= warmup - 1e-9) & (sub.seed >= 0)]
    y, _ = evidence.design(post, snapshot="fraction")
    if y.size:
        out.update(evidence.snapshot_evidence(y, np.array(sorted(post.fraction.unique()))))
    return out


def _metric_inputs(metric: str, out: dict[str, pd.DataFrame], noise: pd.DataFrame, long: pd.DataFrame,
                   tables: dict[str, pd.DataFrame], rcfg: Any) -> dict[str, float]:
    m: dict[str, float] = {}
    cells = long[long.metric == metric]
    y, _ = evidence.design(cells.assign(value=evidence.orient(metric, cells.value.to_numpy(float))))
    if y.size:
        m.update(evidence.cell_evidence(y, pairs=metric == "reproducibility"))
    m.update(_training_evidence(out.get("reliability_training"), metric, float(rcfg.warmup_fraction)))
    rho = out.get("reliability_panel_rho")
    if rho is not None and not rho.empty:
        first = rho[rho.variant == rho.variant.iloc[0]] if "variant" in rho else rho  # older tables: one model
        for col in ("rho_gt_mcc", "p_gt_mcc", "rho_gt_f1", "p_gt_f1", "n_gt", "rho_gt_mcc_step", "rho_gt_f1_step",
                    "rho_step_gt_mcc"):
            m[col] = _get(first, metric, col)
        out_rhos = [_get(first, f"{metric}_out", c) for c in ("rho_gt_mcc", "rho_gt_f1")]
        m["rho_gt_out"] = max((r for r in out_rhos if np.isfinite(r)), default=float("nan"))
    flags = out.get("reliability_panel_flags")
    if flags is not None and not flags.empty:
        m["encoder_only"] = _get(flags, metric, "encoder_only")
        m["saturated"] = _get(flags, metric, "saturated")
        m["out_tracks"] = _get(flags, f"{metric}_out", "out_tracks")
        m["rho_gt_min_variants"] = _get(flags, metric, "rho_best_min_variants")
    rc = out.get("reliability_reseed_cells")
    if rc is not None and not rc.empty:
        from raybench.analysis.reliability.reseed import reseed_summary

        rs = reseed_summary(rc)
        for key, col in (("reseed_s", "s_median"), ("reseed_s_min", "s_min"), ("reseed_s_max", "s_max"),
                         ("reseed_cv", "cv_median"), ("reseed_mrd_1", "mrd_1_median"),
                         ("reseed_mrd_3", "mrd_3_median")):
            m[key] = _get(rs, metric, col)
    s_prof = float(noise.s_seed_profile.get(metric, np.nan))
    outside = out["reliability_outside"]
    m.update(s_seed_profile=s_prof, mrd_3_profile=mrd(s_prof, 3) if np.isfinite(s_prof) else float("nan"),
             tau_seeds=float(noise.tau_seeds.get(metric, np.nan)), tau_arms=seeds.arm_tau(tables).get(metric, np.nan),
             tau_selection=_tau_selection(out.get("reliability_reseed"), metric),
             n_outside=float((outside.metric == metric).sum()) if not outside.empty else 0.0)
    return m


def _summary(out: dict[str, pd.DataFrame], noise: pd.DataFrame, long: pd.DataFrame,
             tables: dict[str, pd.DataFrame], rcfg: Any) -> tuple[pd.DataFrame, dict[str, float]]:
    """One row per metric: the verdict and its rule, each criterion's state, and the numbers behind them.
    |D|*_3 of a profile (training seeds only: the scale of the main tables' contrasts) flags the contrasts."""
    rows, mrd3 = [], {}
    for metric in [m for m in METRICS if (long.metric == m).any()]:
        m = _metric_inputs(metric, out, noise, long, tables, rcfg)
        crit = assess(m)
        row: dict[str, object] = {"metric": metric}
        row["verdict"], row["rule"] = verdict_from(crit)
        row.update({f"class_{k}": v for k, v in class_states(crit).items()})
        row.update({f"state_{k}": c.state for k, c in crit.items()})
        row.update({f"null_{k}": c.null for k, c in crit.items()})
        row.update({c: m.get(c, np.nan) for c in VALUE_COLUMNS})
        mrd3[metric] = float(m["mrd_3_profile"])
        rows.append(row)
    return pd.DataFrame(rows, columns=SUMMARY_COLUMNS[:-1]), mrd3


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


def closing_note(rel: pd.DataFrame) -> str:
    """Per metric, one line: variance shares, SNR, distinct winners, rho with GT-MCC / GT-F1 and the verdict."""
    lines = [f"{'metric':15s} {'share v/s/t':>17s} {'cells':>6s} {'SNR':>6s} {'win':>4s} {'rho MCC':>8s} "
             f"{'rho F1':>7s}  verdict"]
    for r in rel.itertuples(index=False):
        shares = f"{r.share_snapshots:.2f}/{r.share_seed:.2f}/{r.share_snapshot:.2f}"
        lines.append(f"{r.metric:15s} {shares:>17s} {r.share_cells:6.2f} {r.snr:6.2f} {r.winners:4.0f} "
                     f"{r.rho_gt_mcc:8.2f} {r.rho_gt_f1:7.2f}  {r.verdict} ({r.rule})")
    return "\n".join(lines)
