"""What the ground-truth panel says about each metric (docs/protocol.md §11.4). Pure pandas/scipy.

Spearman rho with GT-MCC and GT-F1 over the trained members only (controls never enter it), one-sided p-values,
per synthetic variant. Ground truth on the panel mostly follows training steps (longer-trained members are better
and score better on nearly everything), so rho partly re-measures the training trend: the partial Spearman rho
given the step (`rho_gt_*_step`) is what the metric tracks beyond it, and `rho_step_gt_mcc` says how far ground
truth itself follows the step. Three flags from the controls: `encoder_only` (the permuted decoder scores within the
metric's reseed noise of its trained source: the metric cannot see the decoder), `saturated` (the oracle and the
best member both sit at the metric's ceiling, so it cannot rank good SAEs) and `out_tracks` (the out-of-SAE
negative control tracks ground truth: p < 0.02).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

from raybench.analysis.reliability.mrd import mrd

METRICS = ("reconstruction", "accessibility", "coverage", "dead_fraction", "reproducibility", "accessibility_out",
           "coverage_out")
CEILING = {"reconstruction": 1.0, "accessibility": 1.0, "coverage": 1.0, "dead_fraction": 0.0}
RHO_COLUMNS = ["variant", "metric", "rho_gt_mcc", "p_gt_mcc", "rho_gt_f1", "p_gt_f1", "n_gt", "rho_gt_mcc_step",
               "p_gt_mcc_step", "rho_gt_f1_step", "p_gt_f1_step", "rho_step_gt_mcc"]
FLAG_COLUMNS = ["metric", "mrd_1_task", "permuted_minus_source", "encoder_only", "saturated", "out_tracks",
                "rho_best_min_variants"]


def _oriented(df: pd.DataFrame, metric: str) -> pd.Series:
    return -df[metric] if metric == "dead_fraction" else df[metric]


def partial_spearman(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """(rho, one-sided p) of the Spearman partial correlation of x and y given z: the Pearson partial correlation
    of their ranks, p from t with n - 3 df. nan when a rank vector is constant or n < 4."""
    from raybench.analysis.reliability.nulls import spearman_p_one_sided

    r = [np.asarray(a, dtype=np.float64) for a in (x, y, z)]
    if r[0].size < 4 or any(np.ptp(a) == 0 for a in r):
        return float("nan"), float("nan")
    rxy, rxz, ryz = (spearmanr(a, b).statistic for a, b in ((r[0], r[1]), (r[0], r[2]), (r[1], r[2])))
    den = np.sqrt((1 - rxz ** 2) * (1 - ryz ** 2))
    if den <= 0:
        return float("nan"), float("nan")
    rho = float(np.clip((rxy - rxz * ryz) / den, -1.0, 1.0))
    return rho, spearman_p_one_sided(rho, r[0].size - 1)


def ground_truth_rho(panel: pd.DataFrame, metrics: tuple[str, ...] = METRICS) -> pd.DataFrame:
    """Per variant and metric: rho and one-sided p (positive association) with GT-MCC and GT-F1 over the trained
    members, n, the partial rho given the training step and Spearman(step, GT-MCC). dead_fraction is negated, so
    a positive rho always means 'tracks truth'."""
    rows = []
    for variant, sub in panel.groupby("variant", sort=False):
        trained = sub[sub.kind == "trained"]
        for m in [m for m in metrics if m in trained]:
            v = _oriented(trained, m).to_numpy(float)
            out: dict[str, object] = {"variant": variant, "metric": m}
            for gt in ("gt_mcc", "gt_f1"):
                g = trained[gt].to_numpy(float)
                ok = np.isfinite(v) & np.isfinite(g)
                res = (spearmanr(v[ok], g[ok], alternative="greater")
                       if ok.sum() >= 3 and np.ptp(v[ok]) > 0 and np.ptp(g[ok]) > 0 else None)
                out[f"rho_{gt}"] = float(res.statistic) if res is not None else np.nan
                out[f"p_{gt}"] = float(res.pvalue) if res is not None else np.nan
            out["n_gt"] = int((np.isfinite(v)).sum())
            steps = trained["steps"].to_numpy(float) if "steps" in trained else np.full(len(trained), np.nan)
            for gt in ("gt_mcc", "gt_f1"):
                g = trained[gt].to_numpy(float)
                ok = np.isfinite(v) & np.isfinite(g) & np.isfinite(steps)
                out[f"rho_{gt}_step"], out[f"p_{gt}_step"] = partial_spearman(v[ok], g[ok], steps[ok])
            g, ok = trained["gt_mcc"].to_numpy(float), np.isfinite(steps)
            out["rho_step_gt_mcc"] = (float(spearmanr(steps[ok], g[ok]).statistic)
                                      if ok.sum() >= 3 and np.ptp(steps[ok]) > 0 else np.nan)
            rows.append(out)
    return pd.DataFrame(rows, columns=RHO_COLUMNS)


def control_flags(panel: pd.DataFrame, rho: pd.DataFrame, source: str) -> pd.DataFrame:
    """The flags of the first variant's controls against its trained members; `source` names the member the
    permuted decoder was made from. |D|*_1 is that of one evaluation on the panel: the task-seed sd pooled over the
    trained members (0 for R2 and the dead fraction, which draw nothing)."""
    first = panel.variant.iloc[0]
    sub = panel[panel.variant == first].set_index("member")
    trained = sub[sub.kind == "trained"]
    rows = []
    for m in [m for m in METRICS if m in sub]:
        sd_col = f"{m}_task_sd"
        if sd_col in trained:
            sds = trained[sd_col].to_numpy(float)
            s = float(np.sqrt(np.nanmean(sds ** 2))) if np.isfinite(sds).any() else float("nan")
            df = 2 * int(np.isfinite(sds).sum())  # 3 task seeds per member: 2 df each
            d1 = mrd(s, 1, df=df) if df > 0 and np.isfinite(s) else float("nan")
        else:
            d1 = 0.0
        diff = float(sub.at["permuted_decoder", m] - sub.at[source, m]) if {"permuted_decoder", source} <= set(
            sub.index) else float("nan")
        enc_only = bool(np.isfinite(diff) and abs(diff) <= max(d1, 1e-9))
        best = float(_oriented(trained, m).max()) if len(trained) else float("nan")
        top = -CEILING[m] if m == "dead_fraction" else CEILING.get(m)  # the ceiling in the oriented scale
        tol = max(d1, 1e-3)
        oracle = float(_oriented(sub, m).get("oracle", np.nan))
        saturated = bool(top is not None and abs(top - best) <= tol and abs(top - oracle) <= tol)
        r = rho[rho.metric == m]
        ps = r[r.variant == first][["p_gt_mcc", "p_gt_f1"]].min(axis=1)
        out_tracks = bool(m.endswith("_out") and ps.lt(0.02).any())
        best_rho = r[["rho_gt_mcc", "rho_gt_f1"]].max(axis=1)
        rows.append((m, d1, diff, enc_only, saturated, out_tracks, float(best_rho.min()) if len(best_rho) else np.nan))
    return pd.DataFrame(rows, columns=FLAG_COLUMNS)
