"""Per-criterion states of one metric (docs/protocol.md §11.8): pass, weak, fail or not assessed. Pure.

A criterion is "not assessed" when its input is missing or, for reseed noise, when no random draw is involved:
missing evidence is never a pass. Null-calibrated criteria pass above the null's 99.9% point (p < 0.001) and are
weak above its 98% point (p < 0.02); the SNR also needs the paper's cut points (1 informative, 2 comfortable).

Inputs (any may be missing): share_cells / share_cells_p and share_snapshots / share_snapshots_p (variance share
of the models and its Monte-Carlo p), snr / snr_p, winners / winners_p / n_variants / n_seeds, rank_rho / rank_p,
rho_step / p_rise / p_decline, rho_gt_mcc / rho_gt_f1 / n_gt, reseed_mrd_1 / reseed_mrd_3 / sd_variant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from raybench.analysis.reliability.nulls import P_PASS, P_WEAK, spearman_p_one_sided

PASS, WEAK, FAIL, NOT_ASSESSED = "pass", "weak", "fail", "not assessed"
CRITERIA = ("share_snapshots", "share_cells", "snr", "rank_agreement", "winners", "training", "ground_truth",
            "reseed")


@dataclass(frozen=True)
class Criterion:
    state: str
    value: float
    null: str
    """The value's null reference in words (thresholds or p-value), '' when not assessed."""


def _num(m: Mapping[str, object], key: str) -> float:
    v = m.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float):
        return float("nan")
    return float(v)


def _has(*vals: float) -> bool:
    return all(math.isfinite(v) for v in vals)


def _by_p(value: float, p: float, what: str) -> Criterion:
    state = PASS if p < P_PASS else WEAK if p < P_WEAK else FAIL
    return Criterion(state, value, f"{what} p = {p:.2g} (pass < {P_PASS:g}, weak < {P_WEAK:g})")


NA = Criterion(NOT_ASSESSED, float("nan"), "")


def share(m: Mapping[str, object], key: str) -> Criterion:
    v, p = _num(m, key), _num(m, f"{key}_p")
    return _by_p(v, p, "Monte-Carlo null of the design:") if _has(v, p) else NA


def snr(m: Mapping[str, object]) -> Criterion:
    v, p = _num(m, "snr"), _num(m, "snr_p")
    if not _has(v, p):
        return NA
    state = PASS if v >= 2 and p < P_PASS else WEAK if v >= 1 and p < P_WEAK else FAIL
    return Criterion(state, v, f"cut points 1 / 2; Monte-Carlo null p = {p:.2g}")


def rank_agreement(m: Mapping[str, object]) -> Criterion:
    v, p = _num(m, "rank_rho"), _num(m, "rank_p")
    return _by_p(v, p, "uniform-random-orders null:") if _has(v, p) else NA


def winners(m: Mapping[str, object]) -> Criterion:
    """Distinct per-seed winners: pass 1, fail when every seed crowns another variant, weak between. Shown with
    Pr(D <= d) under uniform random winners; never in the verdict (paper Appendix S.2 reads it as illustration)."""
    d, p, s = _num(m, "winners"), _num(m, "winners_p"), _num(m, "n_seeds")
    if not _has(d, p, s) or s < 2:
        return NA
    state = PASS if d == 1 else FAIL if d >= s else WEAK
    return Criterion(state, d, f"Pr(D <= {d:.0f}) = {p:.2g} under uniform random winners")


def training(m: Mapping[str, object]) -> Criterion:
    """Mean Spearman rho with the step: a significant rise passes, a significant decline fails, else weak."""
    v, rise, decline = _num(m, "rho_step"), _num(m, "p_rise"), _num(m, "p_decline")
    if not _has(v, rise, decline):
        return NA
    state = FAIL if decline < P_WEAK else PASS if rise < P_PASS else WEAK
    return Criterion(state, v, f"permutation null: p(rise) = {rise:.2g}, p(decline) = {decline:.2g}")


def ground_truth(m: Mapping[str, object]) -> Criterion:
    """Success if the metric tracks GT-MCC or GT-F1 (paper §5.4): the better one-sided Spearman p over n_gt trained
    members decides; a metric tracking neither fails."""
    mcc, f1, n = _num(m, "rho_gt_mcc"), _num(m, "rho_gt_f1"), _num(m, "n_gt")
    if not math.isfinite(n) or n < 3 or not (_has(mcc) or _has(f1)):
        return NA
    ps = {name: spearman_p_one_sided(r, int(n)) for name, r in (("GT-MCC", mcc), ("GT-F1", f1)) if _has(r)}
    best = min(ps, key=lambda k: ps[k])
    p = ps[best]
    state = PASS if p < P_PASS else WEAK if p < P_WEAK else FAIL
    rho = mcc if best == "GT-MCC" else f1
    return Criterion(state, rho, f"best {best}, one-sided p = {p:.2g} over {int(n)} trained members")


def reseed(m: Mapping[str, object]) -> Criterion:
    """Evaluation reseed noise against the spread between models: pass when one reseed's |D|*_1 is below the sd
    between models, weak when a 3-seed mean's |D|*_3 is, else fail. Not assessed without a random draw."""
    d1, d3, sd = _num(m, "reseed_mrd_1"), _num(m, "reseed_mrd_3"), _num(m, "sd_variant")
    if not _has(d1, sd):
        return NA
    state = PASS if d1 < sd else WEAK if _has(d3) and d3 < sd else FAIL
    return Criterion(state, d1, f"sd between models {sd:.3g}; |D|*_3 {d3:.3g}")


def assess(m: Mapping[str, object]) -> dict[str, Criterion]:
    """Every criterion's state and value, in CRITERIA order."""
    return {"share_snapshots": share(m, "share_snapshots"), "share_cells": share(m, "share_cells"), "snr": snr(m),
            "rank_agreement": rank_agreement(m), "winners": winners(m), "training": training(m),
            "ground_truth": ground_truth(m), "reseed": reseed(m)}
