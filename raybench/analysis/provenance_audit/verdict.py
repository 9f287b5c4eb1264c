"""Verify (docs/protocol.md §12.5): the verdict of one model x depth x provenance variable.

- "no reliance": the 95% interval of G lies within [-epsilon, epsilon];
- reliance (the interval's lower bound exceeds epsilon), then per rank p in order:
  "reliance, remedy certified" when the removal's G reduction beats every matched random control and the 95%
  lower bound of the utility change (exposed-head AUROC on observed held-out data, after minus before) stays
  above -delta; else "reliance, remedy refused" with the reason of every rank;
- "inconclusive": neither (the interval reaches past epsilon without clearing it) - more patients needed.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_RELIANCE = "no reliance"
CERTIFIED = "reliance, remedy certified"
REFUSED = "reliance, remedy refused"
INCONCLUSIVE = "inconclusive"
NOT_AUDITED = "not audited"


@dataclass(frozen=True)
class Removal:
    """What Verify needs of one rank-p removal."""

    rank: int
    g_reduction: float  # G before - G after (point)
    control_max_reduction: float  # the largest G reduction among the random controls
    utility_low: float  # 95% lower bound of the exposed head's observed AUROC change


def removal_reasons(rm: Removal, delta: float) -> list[str]:
    """Why a removal is not certified ([] when it is)."""
    reasons = []
    if not rm.g_reduction > rm.control_max_reduction:
        reasons.append(f"p={rm.rank}: G reduction {rm.g_reduction:.3f} does not beat the random controls' "
                       f"{rm.control_max_reduction:.3f}")
    if not rm.utility_low > -delta:
        reasons.append(f"p={rm.rank}: utility loss beyond delta (AUROC change 95% lower bound "
                       f"{rm.utility_low:.3f} <= -{delta:g})")
    return reasons


def decide(g_low: float, g_high: float, removals: list[Removal], epsilon: float, delta: float
           ) -> tuple[str, str, int | None]:
    """(verdict, reason, certified rank or None)."""
    if -epsilon <= g_low and g_high <= epsilon:
        return NO_RELIANCE, f"G 95% interval [{g_low:.3f}, {g_high:.3f}] within +-{epsilon:g}", None
    if not g_low > epsilon:
        return INCONCLUSIVE, (f"G 95% interval [{g_low:.3f}, {g_high:.3f}] neither within +-{epsilon:g} nor above "
                              f"{epsilon:g}"), None
    reasons: list[str] = []
    for rm in removals:
        why = removal_reasons(rm, delta)
        if not why:
            return CERTIFIED, (f"p={rm.rank}: G reduction {rm.g_reduction:.3f} beats every random control (max "
                               f"{rm.control_max_reduction:.3f}); utility change 95% lower bound "
                               f"{rm.utility_low:.3f} > -{delta:g}"), rm.rank
        reasons += why
    return REFUSED, "; ".join(reasons) or "no removal was possible", None
