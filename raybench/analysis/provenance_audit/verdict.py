"""Verify (docs/protocol.md §12.5): the verdict of one model x depth x provenance variable, in this order:

- "not audited": a held-out (y, u) cell is below `provenance.min_cell_records` (decided before any estimate);
- "no reliance": the 95% interval of G lies within [-epsilon, epsilon];
- "negative G (protective)": the interval lies below 0 and reaches past -epsilon (the exposed head gains when the
  association reverses) - a confident result, not "inconclusive";
- "inconclusive": the G gate fails (G < epsilon or its lower bound <= 0) without either of the above;
- "not attributable": G passes but a validity gate fails (control reversed advantage, exposed aligned
  non-inferiority, conditional device recoverability, embedding above the metadata comparator);
- at the modality's fixed rank (`provenance.verdict_rank`, ECG 1): "reliance, remedy refused: no better than random
  controls" unless the targeted removal reduces G (lower bound > 0) and beats every matched random control;
  "reliance, remedy refused: utility loss" unless the utility change's lower bound stays above -delta; else
  "reliance, remedy certified". Utility is the control head's AUROC change in the independent regime (the head and
  regime of PhysioTRACE Table 1: ECGFounder -0.004 = Table 15's control head, independent, projected - full);
- a gate that could not be evaluated is never a pass: where the rest would read "reliance ...", the verdict reads
  "reliance - confounding by age/sex/year not excluded" (no metadata comparator) or "reliance - <gate> not
  evaluated", never "remedy certified", and the reason carries what the remedy would have been.

Beside the ladder: "no reliance" only says the exposed head degrades no more than the control head; when both drop
beyond epsilon from aligned to reversed (lower bounds), it reads "no reliance; task sensitive to <variable> (both
heads degrade)". A reliance verdict of a variable audited also within strata (`device` and `device|site`) stands
only when the within-stratum row reads reliance too; else it reads "confounded with site" (`within_strata`).
"""

from __future__ import annotations

from dataclasses import dataclass

from raybench.analysis.provenance_audit.gates import G_GATE, METADATA_GATE, VALIDITY, Gate

NO_RELIANCE = "no reliance"
CERTIFIED = "reliance, remedy certified"
REFUSED = "reliance, remedy refused"
REFUSED_CONTROLS = f"{REFUSED}: no better than random controls"
REFUSED_UTILITY = f"{REFUSED}: utility loss"
NOT_ATTRIBUTABLE = "not attributable"
NEGATIVE = "negative G (protective)"
INCONCLUSIVE = "inconclusive"
NOT_AUDITED = "not audited"
NOT_EXCLUDED = "reliance - confounding by age/sex/year not excluded"
TASK_SENSITIVE = "task sensitive to"
CONFOUNDED = "confounded with"
MEANINGS = {
    NO_RELIANCE: "the exposed head loses no more AUROC than the control head when the association reverses (G "
                 "within +-epsilon); it does not say that neither head loses",
    f"{NO_RELIANCE}; {TASK_SENSITIVE} u (both heads degrade)": "both heads lose AUROC beyond epsilon from aligned "
                                                                "to reversed, so the task itself moves with u",
    CERTIFIED: "the exposed head relies on the variable, every validity gate passed, and removing the provenance "
               "component cuts G more than every matched random control at a utility cost within delta",
    REFUSED_CONTROLS: "reliance, but the targeted removal does not beat the matched random controls",
    REFUSED_UTILITY: "reliance, but the removal costs the control head more than delta AUROC under independence",
    NOT_EXCLUDED: "G passes but the metadata comparator could not be run, so age, sex or recording year may "
                  "explain it; never certified",
    NOT_ATTRIBUTABLE: "G passes but a validity gate fails, so the excess loss cannot be put on the variable",
    f"{CONFOUNDED} site": "the pooled row reads reliance but the within-site audit (device|site) does not, so the "
                          "site explains it",
    NEGATIVE: "the exposed head gains when the association reverses (G interval below 0, past -epsilon)",
    INCONCLUSIVE: "the G interval neither lies within +-epsilon nor clears epsilon",
    NOT_AUDITED: "too few records or groups to audit, named in the reason",
}
VERDICTS = (NO_RELIANCE, CERTIFIED, REFUSED_CONTROLS, REFUSED_UTILITY, NOT_ATTRIBUTABLE, NEGATIVE, INCONCLUSIVE,
            NOT_AUDITED, NOT_EXCLUDED)


@dataclass(frozen=True)
class Removal:
    """What Verify needs of one rank-p removal."""

    rank: int
    reduction: Gate  # gate 6: G before - G after
    control_max_reduction: float  # the largest G reduction among the random controls
    utility_low: float  # 95% lower bound of the control head's independent-regime AUROC change

    @property
    def beats_controls(self) -> bool:
        return self.reduction.estimate > self.control_max_reduction


def removal_verdict(rm: Removal, delta: float) -> tuple[str, str]:
    """The remedy's verdict and reason at one rank."""
    if not (rm.reduction.passed and rm.beats_controls):
        return REFUSED_CONTROLS, (f"p={rm.rank}: G reduction {rm.reduction.estimate:.3f} [{rm.reduction.ci_low:.3f}, "
                                  f"{rm.reduction.ci_high:.3f}] vs the random controls' largest "
                                  f"{rm.control_max_reduction:.3f}")
    if not rm.utility_low > -delta:
        return REFUSED_UTILITY, (f"p={rm.rank}: utility change (control head, independent regime) 95% lower bound "
                                 f"{rm.utility_low:.3f} <= -{delta:g}")
    return CERTIFIED, (f"p={rm.rank}: G reduction {rm.reduction.estimate:.3f} beats every random control (max "
                       f"{rm.control_max_reduction:.3f}); utility change 95% lower bound {rm.utility_low:.3f} > "
                       f"-{delta:g}")


def decide(gates: dict[str, Gate], removal: Removal | None, epsilon: float, delta: float) -> tuple[str, str]:
    """(verdict, reason) from the gates (by name) and the removal at the verdict rank (None: none was possible)."""
    g = gates[G_GATE]
    span = f"G {g.estimate:.3f}, 95% interval [{g.ci_low:.3f}, {g.ci_high:.3f}]"
    if -epsilon <= g.ci_low and g.ci_high <= epsilon:
        return NO_RELIANCE, f"{span} within +-{epsilon:g}"
    if g.ci_high < 0 and g.ci_low < -epsilon:
        return NEGATIVE, f"{span} below 0: the exposed head gains when the association reverses"
    if not g.passed:
        return INCONCLUSIVE, f"{span}: neither within +-{epsilon:g} nor >= {epsilon:g} with lower bound > 0"
    failed = [gates[n] for n in VALIDITY if n in gates and gates[n].passed is False]
    if failed:
        return NOT_ATTRIBUTABLE, f"{span}, but fails: " + "; ".join(f.describe() for f in failed)
    skipped = [gates[n] for n in VALIDITY if n in gates and gates[n].passed is None]
    note = "".join(f" ({s.name} not evaluated: {s.note})" for s in skipped)
    if removal is None:
        verdict, why = REFUSED_CONTROLS, "no removal was possible at the verdict rank"
    else:
        verdict, why = removal_verdict(removal, delta)
    if skipped:  # not evaluated is never passed: the verdict says which gate is missing
        names = [s.name for s in skipped]
        head = NOT_EXCLUDED if names == [METADATA_GATE] else "reliance - " + ", ".join(names) + " not evaluated"
        return head, f"{span}; remedy at p={removal.rank if removal else '-'} would read {verdict!r}: {why}{note}"
    return verdict, f"{span}; {why}{note}"


def task_sensitivity(verdict: str, reason: str, drops: dict[str, float], variable: str,
                     epsilon: float) -> tuple[str, str]:
    """"no reliance" -> "no reliance; task sensitive to <variable> (both heads degrade)" when both heads' AUROC
    drops from the aligned to the reversed regime with a lower bound beyond epsilon (the task itself depends on
    the association; neither head is the worse for it)."""
    if verdict != NO_RELIANCE or not (drops["drop_exposed_ci_low"] > epsilon and drops["drop_control_ci_low"] >
                                      epsilon):
        return verdict, reason
    shown = "; ".join(f"{h} head AUROC {drops[f'auroc_{h}_aligned']:.3f} aligned -> {drops[f'auroc_{h}_reversed']:.3f}"
                      f" reversed (drop {drops[f'drop_{h}']:.3f} [{drops[f'drop_{h}_ci_low']:.3f}, "
                      f"{drops[f'drop_{h}_ci_high']:.3f}])" for h in ("exposed", "control"))
    return f"{NO_RELIANCE}; {TASK_SENSITIVE} {variable} (both heads degrade)", f"{reason}; {shown}"


def within_strata(pooled: dict, stratified: dict, stratum: str) -> dict:
    """The pooled row of a variable (`device`) given its within-stratum row (`device|site`): a reliance verdict
    stands only when the within-stratum row reads reliance too; else it reads "confounded with <stratum>", and
    the reason names the within-stratum audit."""
    verdict = str(pooled.get("verdict", ""))
    if not verdict.startswith("reliance"):
        return pooled
    inner = str(stratified.get("verdict", ""))
    name = f"{pooled.get('variable', 'u')}|{stratum}"
    if inner.startswith("reliance"):
        return {**pooled, "reason": f"{pooled.get('reason', '')}; holds within {stratum} ({name}: {inner})"}
    return {**pooled, "verdict": f"{CONFOUNDED} {stratum}",
            "reason": f"pooled over {stratum}s the row reads {verdict!r}, but within {stratum} ({name}) it reads "
                      f"{inner!r}: {stratified.get('reason', '')}"}

