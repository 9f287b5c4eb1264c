"""One-word verdicts per metric, each with the rule that produced it (docs/protocol.md §11.8). Pure.

Rules, first match wins (a criterion whose input is missing is skipped):
  unreliable: discriminability < 1 (models differ less than the noise of a profile), or the training-seed
              residual explains more of the metric's variance across cells than the model does, or the metric
              does not track ground truth at all (rho with GT-MCC <= 0 and rho with GT-F1 <= 0)
  caution:    discriminability < 3, or seeds disagree on the model order (tau_seeds < 0.6), or it rises through
              training in under half of the sampled cells, or rho with GT-MCC < 0.3, or a point estimate lies
              outside its own percentile interval, or the evaluation reseed CV exceeds 0.10
  reliable:   none of the above
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def _has(v: object) -> bool:
    return v is not None and isinstance(v, int | float) and math.isfinite(float(v))


def verdict(m: Mapping[str, float | int | None]) -> tuple[str, str]:
    """(verdict, rule) from a metric's criteria: discriminability, share_model, share_residual, rho_gt_mcc,
    rho_gt_f1, tau_seeds, rises_fraction, n_outside, cv_eval (any may be missing)."""
    g = m.get
    bad = []
    if _has(g("discriminability")) and g("discriminability") < 1:
        bad.append(f"discriminability {g('discriminability'):.2f} < 1")
    if _has(g("share_residual")) and _has(g("share_model")) and g("share_residual") > g("share_model"):
        bad.append(f"seed residual share {g('share_residual'):.2f} > model share {g('share_model'):.2f}")
    if _has(g("rho_gt_mcc")) and _has(g("rho_gt_f1")) and g("rho_gt_mcc") <= 0 and g("rho_gt_f1") <= 0:
        bad.append(f"no ground-truth tracking (rho {g('rho_gt_mcc'):.2f}, {g('rho_gt_f1'):.2f})")
    if bad:
        return "unreliable", "; ".join(bad)
    warn = []
    checks = (("discriminability", lambda v: v < 3, "discriminability {:.2f} < 3"),
              ("tau_seeds", lambda v: v < 0.6, "seed orders agree weakly (tau {:.2f} < 0.6)"),
              ("rises_fraction", lambda v: v < 0.5, "rises through training in {:.0%} of cells"),
              ("rho_gt_mcc", lambda v: v < 0.3, "rho with GT-MCC {:.2f} < 0.3"),
              ("n_outside", lambda v: v > 0, "{:.0f} point estimate(s) outside their percentile CI"),
              ("cv_eval", lambda v: v > 0.10, "evaluation reseed CV {:.2f} > 0.10"))
    for key, test, text in checks:
        if _has(g(key)) and test(float(g(key))):
            warn.append(text.format(float(g(key))))
    if warn:
        return "caution", "; ".join(warn)
    return "reliable", "every criterion met"
