"""Per-criterion states of one metric (docs/protocol.md §11.8): pass, weak, fail, not established or not assessed.
Pure.

A criterion is "not assessed" when its input is missing or, for reseed noise, when no random draw is involved:
missing evidence is never a pass. Null-calibrated criteria pass above the null's 99.9% point (p < 0.001) and are
weak above its 98% point (p < 0.02); where an exact null cannot reach 0.001 (rank agreement of few models) its
smallest attainable p is the pass cut, so a perfect metric can pass. The SNR also needs the paper's cut points (1
informative, 2 comfortable). Ground truth fails only on evidence against (a significantly negative rho, or an
out-of-SAE negative control tracking as well as the metric); no significant rho either way is "not established".

Inputs (any may be missing): share_cells / share_cells_p / share_cells_df and share_snapshots / ..._p / ..._df
(variance share of the models and its run-level p, units.py), pairs (1 for seed pairs), snr / snr_p, winners /
winners_p / n_variants / n_seeds, rank_rho / rank_p / rank_p_min, rho_step / p_rise / p_decline, rho_gt_mcc /
rho_gt_f1 / n_gt and rho_gt_mcc_step / rho_gt_f1_step (partial rho given the training step), rho_gt_out /
out_tracks / saturated (the panel's flags), reseed_mrd_1 / reseed_mrd_3 / sd_variant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from raybench.analysis.reliability.nulls import P_PASS, P_WEAK, spearman_p_one_sided

PASS, WEAK, FAIL, NOT_ASSESSED = "pass", "weak", "fail", "not assessed"
NOT_ESTABLISHED = "not established"
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


def _flag(m: Mapping[str, object], key: str) -> bool:
    v = m.get(key)
    return v is True or (not isinstance(v, bool) and isinstance(v, int | float) and v == 1)


def _has(*vals: float) -> bool:
    return all(math.isfinite(v) for v in vals)


def _by_p(value: float, p: float, what: str) -> Criterion:
    state = PASS if p < P_PASS else WEAK if p < P_WEAK else FAIL
    return Criterion(state, value, f"{what} p = {p:.2g} (pass < {P_PASS:g}, weak < {P_WEAK:g})")


NA = Criterion(NOT_ASSESSED, float("nan"), "")


def _unit(m: Mapping[str, object], key: str) -> str:
    df, pairs = _num(m, f"{key}_df"), _flag(m, "pairs") and key == "share_cells"
    unit = "pair-aware F over (model, seed pair) means," if pairs else "F over (model, seed) runs,"
    return f"{unit} {df:.0f} df between runs:" if _has(df) else f"{unit}"


def share(m: Mapping[str, object], key: str) -> Criterion:
    v, p = _num(m, key), _num(m, f"{key}_p")
    return _by_p(v, p, _unit(m, key)) if _has(v, p) else NA


def snr(m: Mapping[str, object]) -> Criterion:
    v, p = _num(m, "snr"), _num(m, "snr_p")
    if not _has(v, p):
        return NA
    state = PASS if v >= 2 and p < P_PASS else WEAK if v >= 1 and p < P_WEAK else FAIL
    return Criterion(state, v, f"cut points 1 / 2; {_unit(m, 'share_snapshots')} p = {p:.2g}")


def rank_agreement(m: Mapping[str, object]) -> Criterion:
    """Against independent random orders of the seeds (pairs: orders of pairs sharing seeds); the pass cut is the
    smallest attainable p where that is above 0.001 (4 models x 3 seeds: 1/576)."""
    v, p, p_min = _num(m, "rank_rho"), _num(m, "rank_p"), _num(m, "rank_p_min")
    if not _has(v, p):
        return NA
    cut = max(P_PASS, p_min) if _has(p_min) else P_PASS
    state = PASS if p < cut or (cut > P_PASS and p <= cut * (1 + 1e-9)) else WEAK if p < P_WEAK else FAIL
    null = "seed pairs sharing seeds" if _flag(m, "pairs") else "independent random orders"
    lowest = f"; smallest attainable p {p_min:.2g}" if _has(p_min) else ""
    return Criterion(state, v, f"{null}: p = {p:.2g} (pass <= {cut:.2g}, weak < {P_WEAK:g}){lowest}")


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


def _one_sided(rho: float, n: float) -> float:
    return spearman_p_one_sided(rho, int(n)) if _has(rho) else float("nan")


def ground_truth(m: Mapping[str, object]) -> Criterion:
    """Tracks GT-MCC or GT-F1 (paper §5.4: the better one-sided Spearman p over n_gt trained members decides).
    Pass needs p < 0.001 and, where given, a partial rho given the training step with p < 0.02 (else weak: it may
    only re-measure training), no saturation and no out-of-SAE control tracking too. Fail: a significantly
    negative rho with neither tracking, or the control tracking at least as well. Else not established."""
    mcc, f1, n = _num(m, "rho_gt_mcc"), _num(m, "rho_gt_f1"), _num(m, "n_gt")
    if not math.isfinite(n) or n < 3 or not (_has(mcc) or _has(f1)):
        return NA
    rhos = {name: r for name, r in (("GT-MCC", mcc), ("GT-F1", f1)) if _has(r)}
    ps = {name: _one_sided(r, n) for name, r in rhos.items()}
    best = min(ps, key=lambda k: ps[k])
    rho, p = rhos[best], ps[best]
    text = f"best {best}, one-sided p = {p:.2g} over {int(n)} trained members"
    out_rho = _num(m, "rho_gt_out")
    if _flag(m, "out_tracks") and _has(out_rho) and out_rho >= max(rhos.values()):
        return Criterion(FAIL, rho, f"{text}; its out-of-SAE negative control tracks as well (rho {out_rho:.2f})")
    if p >= P_WEAK:
        down = min(_one_sided(-r, n) for r in rhos.values())
        if down < P_WEAK:
            return Criterion(FAIL, rho, f"{text}; significantly negative (p = {down:.2g})")
        return Criterion(NOT_ESTABLISHED, rho, f"{text}; not significant either way")
    notes = []
    partial = [r for r in (_num(m, "rho_gt_mcc_step"), _num(m, "rho_gt_f1_step")) if _has(r)]
    if partial:
        p_part = min(spearman_p_one_sided(r, int(n) - 1) for r in partial)  # n - 3 df
        if p_part >= P_WEAK:
            notes.append(f"not beyond the training step (partial rho {max(partial):.2f}, p = {p_part:.2g})")
    if _flag(m, "out_tracks"):
        notes.append(f"its out-of-SAE negative control tracks too (rho {out_rho:.2f})")
    if _flag(m, "saturated"):
        notes.append("saturated: cannot rank good SAEs")
    state = PASS if p < P_PASS and not notes else WEAK
    return Criterion(state, rho, "; ".join([text, *notes]))


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
