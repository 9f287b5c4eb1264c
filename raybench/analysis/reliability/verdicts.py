"""One verdict per metric from its criteria's states, with the rule that produced it (docs/protocol.md §11.8). Pure.

  not assessed  no criterion that enters the verdict has evidence (missing evidence is never a pass)
  unreliable    the metric falls significantly through training, or tracks neither GT-MCC nor GT-F1
  no signal     the leading discriminability criterion (the variance share on snapshots, else on final cells,
                else cross-seed rank agreement, else SNR) is not beyond its null: models indistinguishable from noise
  reliable      every assessed criterion passes
  weak          otherwise (some assessed criterion is weak or fails)
Winner counts are shown beside their null but do not enter the verdict (paper Appendix S.2).
"""

from __future__ import annotations

from collections.abc import Mapping

from raybench.analysis.reliability.criteria import FAIL, NOT_ASSESSED, PASS, Criterion, assess

HARD = ("training", "ground_truth")
SIGNAL = ("share_snapshots", "share_cells", "rank_agreement", "snr")
INFO = ("winners",)
VERDICTS = ("reliable", "weak", "no signal", "unreliable", "not assessed")
RULE = ("unreliable if the metric declines significantly through training or tracks neither GT-MCC nor GT-F1; "
        "no signal if the models' variance share (else rank agreement, else SNR) is not beyond its null's 98% "
        "point; reliable if every assessed criterion passes; weak otherwise; not assessed without evidence")


def verdict_from(crit: Mapping[str, Criterion]) -> tuple[str, str]:
    used = {k: c for k, c in crit.items() if k not in INFO and c.state != NOT_ASSESSED}
    if not used:
        return "not assessed", "no criterion has evidence"
    hard = [f"{k} fails ({c.value:.3g}; {c.null})" for k, c in used.items() if k in HARD and c.state == FAIL]
    if hard:
        return "unreliable", "; ".join(hard)
    lead = next((k for k in SIGNAL if k in used), None)
    if lead is not None and used[lead].state == FAIL:
        c = used[lead]
        return "no signal", f"{lead} {c.value:.3g} not beyond its null ({c.null})"
    short = [f"{k} {c.state} ({c.value:.3g})" for k, c in used.items() if c.state != PASS]
    if not short:
        return "reliable", "every assessed criterion passes: " + ", ".join(used)
    return "weak", "; ".join(short)


def verdict(m: Mapping[str, object]) -> tuple[str, str]:
    """(verdict, rule) from a metric's numeric inputs (criteria.py lists the keys; any may be missing)."""
    return verdict_from(assess(m))
