"""Inference of the matched-effect interventions (docs/protocol.md §9.4): seed averaging, the paired patient
bootstrap of every comparison, and the BH family.

The published scripts' rules: scripts/bootstrap_final_layer_matched_effect.py averages each design cell's
per-patient metric means over the SAE seeds where it is eligible, forms record-weighted means under
patient-count draws, and compares methods on the concepts eligible in every seed;
scripts/summarize_final_layer_matched_effect.py then adjusts the p-values with Benjamini-Hochberg within
each metric across every model x candidate arm x k x comparison. Pure numpy on arrays indexed
[arm, k, method, concept, patient, metric]; intervention.py builds them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from raybench.analysis.inference.stats import benjamini_hochberg, paired_p
from raybench.analysis.secondary.matched_effect import RECORD_METRICS

OUTPUT_METRICS = (*RECORD_METRICS, "wbi_cross", "target_retention")
INFERENCE_METRICS = ("off_cross_rms", "wbi_cross", "off_all_rms", "activation_l2")
WBI_FLOOR = 1e-8


def seed_average(patient_means: np.ndarray, effects: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Average over seeds where each cell is eligible.

    patient_means [S, ..., P, R]: per seed, the patient means of each record metric averaged over the cell's
    eligible designs (NaN where none); effects [S, ...]: the matching mean validation effect (NaN where none).
    Returns (means [..., P, R] NaN where no seed is eligible, seeds eligible [...], mean effect [...]).
    """
    pm = np.asarray(patient_means, dtype=np.float64)
    valid = np.isfinite(pm[..., 0, 0])
    count = valid.sum(axis=0)
    avg = np.full(pm.shape[1:], np.nan)
    np.divide(np.nansum(pm, axis=0), count[..., None, None], out=avg, where=count[..., None, None] > 0)
    eff = np.full(count.shape, np.nan)
    np.divide(np.nansum(np.asarray(effects, dtype=np.float64), axis=0), count, out=eff, where=count > 0)
    return avg, count, eff


def weighted_means(values: np.ndarray, patient_counts: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Record-weighted means [D, R] of patient means values [P, R] (patient_counts [P]) under weights [D, P]."""
    counts = np.asarray(patient_counts, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    return (w @ (np.asarray(values, dtype=np.float64) * counts[:, None])) / (w @ counts)[:, None]


def with_ratios(means: np.ndarray, matched_effect: float) -> np.ndarray:
    """[..., 5] record metrics -> [..., 7]: + WBI (cross-family off-target RMS / |target|) and target retention."""
    wbi = means[..., 1] / np.maximum(np.abs(means[..., 0]), WBI_FLOOR)
    return np.concatenate([means, wbi[..., None], (means[..., 0] / matched_effect)[..., None]], axis=-1)


def observed_and_draws(avg: np.ndarray, matched: np.ndarray, patient_counts: np.ndarray, weights: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Point values [..., C, 7] and draws [..., C, D, 7] of every cell avg [..., C, P, 5] whose patient means
    are all finite (NaN elsewhere)."""
    lead = avg.shape[:-2]
    n_draws = np.asarray(weights).shape[0]
    observed = np.full((*lead, len(OUTPUT_METRICS)), np.nan)
    draws = np.full((*lead, n_draws, len(OUTPUT_METRICS)), np.nan)
    ones = np.ones((1, avg.shape[-2]))
    for index in np.ndindex(lead):
        values = avg[index]
        if not np.all(np.isfinite(values)):
            continue
        observed[index] = with_ratios(weighted_means(values, patient_counts, ones)[0], matched[index])
        draws[index] = with_ratios(weighted_means(values, patient_counts, weights), matched[index])
    return observed, draws


def paired_contrasts(observed: np.ndarray, draws: np.ndarray, seeds_eligible: np.ndarray, n_seeds: int,
                     arms: Sequence[str], ks: Sequence[int], methods: Sequence[str],
                     comparisons: Sequence[tuple[str, str]], ci: tuple[float, float]) -> pd.DataFrame:
    """Left minus right per arm x k x comparison x inference metric over the concepts where both methods are
    finite and eligible in all n_seeds seeds: mean difference, percentile CI and two-sided p over the draws.

    observed [A, K, M, C, 7], draws [A, K, M, C, D, 7], seeds_eligible [A, K, M, C]."""
    where = {m: i for i, m in enumerate(methods)}
    col = {m: i for i, m in enumerate(OUTPUT_METRICS)}
    rows = []
    for a, arm in enumerate(arms):
        for ki, k in enumerate(ks):
            for left, right in comparisons:
                li, ri = where[left], where[right]
                for metric in INFERENCE_METRICS:
                    j = col[metric]
                    lp, rp = observed[a, ki, li, :, j], observed[a, ki, ri, :, j]
                    ok = (np.isfinite(lp) & np.isfinite(rp) & (seeds_eligible[a, ki, li] == n_seeds)
                          & (seeds_eligible[a, ki, ri] == n_seeds))
                    if ok.any():
                        delta = float(np.mean(lp[ok] - rp[ok]))
                        diff = np.nanmean(draws[a, ki, li, ok, :, j] - draws[a, ki, ri, ok, :, j], axis=0)
                    else:
                        delta, diff = np.nan, np.full(draws.shape[-2], np.nan)
                    finite = diff[np.isfinite(diff)]
                    rows.append({"arm": arm, "k": int(k), "comparison": f"{left}_minus_{right}", "left_method": left,
                                 "right_method": right, "metric": metric, "concepts_paired": int(ok.sum()),
                                 "delta": delta,
                                 "ci_low": float(np.percentile(finite, ci[0])) if finite.size else np.nan,
                                 "ci_high": float(np.percentile(finite, ci[1])) if finite.size else np.nan,
                                 "p_value": paired_p(finite) if finite.size else np.nan,
                                 "n_draws": int(finite.size)})
    return pd.DataFrame(rows)


def bh_family(contrasts: pd.DataFrame) -> np.ndarray:
    """BH q-values within each metric over every row (model x arm x k x comparison), as the published summary;
    NaN p-values stay NaN and are not counted."""
    q = np.full(len(contrasts), np.nan)
    p = contrasts["p_value"].to_numpy(np.float64)
    for _, idx in contrasts.groupby("metric", sort=False).indices.items():
        q[idx] = benjamini_hochberg(p[idx])
    return q
