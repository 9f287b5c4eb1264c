"""One verdict per metric from its criteria's states, by a decision table a reader can apply by hand
(docs/protocol.md §11.8; the report prints the same TABLE). Pure.

The criteria fall into three evidence classes: signal (can the models be told apart beyond their training runs?),
stability (does the metric rise through training, is one evaluation's noise below the spread between models?) and
validity (does it track ground truth, better than its negative control?). A class is assessed when any of its
criteria has evidence and passes when every assessed one passes. "Reliable" needs all three classes; missing
evidence is never a pass, and a non-significant result is never a failure. Winner counts are shown beside their
null but enter no class (paper Appendix S.2).
"""

from __future__ import annotations

from collections.abc import Mapping

from raybench.analysis.reliability.criteria import FAIL, NOT_ASSESSED, PASS, Criterion, assess

CLASSES = {"signal": ("share_snapshots", "share_cells", "rank_agreement", "snr"),
           "stability": ("training", "reseed"),
           "validity": ("ground_truth",)}
"""Evidence class -> its criteria; the signal class's leading criterion is the first assessed one."""
HEAVY_COMMAND = "raybench reliability --run-dir R"
ASSESSED_BY = {"signal": "final cells of >= 2 models x 2 seeds (every analyze), or " + HEAVY_COMMAND,
               "stability": HEAVY_COMMAND + " (snapshots through training, evaluation reseeds)",
               "validity": HEAVY_COMMAND + " (the ground-truth panel)"}
"""What assesses a class that has no evidence (named in an "incomplete" rule)."""
AGAINST = ("training", "ground_truth")
"""Criteria whose failure is evidence against the metric (a significant decline; a significantly negative
ground-truth rho or a negative control tracking as well)."""
INFO = ("winners",)
VERDICTS = ("reliable", "incomplete", "weak", "no signal", "unreliable", "not assessed")
TABLE = (
    ("not assessed", "no class has evidence"),
    ("unreliable", "evidence against: a significant decline through training (p < 0.02), a significantly "
                   "negative ground-truth rho (p < 0.02, neither GT-MCC nor GT-F1 tracking), or an out-of-SAE "
                   "negative control tracking ground truth at least as well as the metric"),
    ("no signal", "the signal class's leading criterion (variance share on snapshots, else on final cells, else "
                  "rank agreement, else SNR) is not beyond its run-level null (p >= 0.02)"),
    ("incomplete", "every assessed class passes but some class has no evidence; the rule names the missing "
                   "classes and the command that assesses them"),
    ("reliable", "signal, stability and validity are all assessed and all pass"),
    ("weak", "otherwise; the rule names each criterion short of pass (a validity result significant neither way "
             "is 'not established', never a failure)"),
)
"""The decision table, first matching row wins (docs/protocol.md §11.8 prints it; a test holds them equal)."""
RULE = "; ".join(f"{v} if {w}" for v, w in TABLE)


def class_states(crit: Mapping[str, Criterion]) -> dict[str, str]:
    """Per class: not assessed (no criterion has evidence), pass (every assessed one passes), fail (the signal
    class's leading criterion fails, or a criterion of evidence against fails) or weak."""
    out = {}
    for name, keys in CLASSES.items():
        used = [(k, crit[k]) for k in keys if k in crit and crit[k].state != NOT_ASSESSED]
        if not used:
            out[name] = NOT_ASSESSED
        elif (name == "signal" and used[0][1].state == FAIL) or any(k in AGAINST and c.state == FAIL
                                                                    for k, c in used):
            out[name] = FAIL
        else:
            out[name] = PASS if all(c.state == PASS for _, c in used) else "weak"
    return out


def verdict_from(crit: Mapping[str, Criterion]) -> tuple[str, str]:
    """(verdict, the rule that produced it) by TABLE, first match wins."""
    used = {k: c for k, c in crit.items() if k not in INFO and c.state != NOT_ASSESSED}
    classes = class_states(crit)
    if not used:
        return "not assessed", "no class has evidence"
    against = [f"{k} fails ({c.value:.3g}; {c.null})" for k, c in used.items() if k in AGAINST and c.state == FAIL]
    if against:
        return "unreliable", "; ".join(against)
    if classes["signal"] == FAIL:
        lead = next(k for k in CLASSES["signal"] if k in used)
        c = used[lead]
        return "no signal", f"{lead} {c.value:.3g} not beyond its null ({c.null})"
    missing = [k for k, s in classes.items() if s == NOT_ASSESSED]
    short = [f"{k} {c.state} ({c.value:.3g}; {c.null})" for k, c in used.items() if c.state != PASS]
    gaps = "; ".join(f"{k} not assessed: {ASSESSED_BY[k]}" for k in missing)
    if not short and missing:
        return "incomplete", f"assessed classes pass ({', '.join(k for k in classes if k not in missing)}); " + gaps
    if not short:
        return "reliable", "signal, stability and validity all pass: " + ", ".join(used)
    return "weak", "; ".join(short + ([gaps] if gaps else []))


def verdict(m: Mapping[str, object]) -> tuple[str, str]:
    """(verdict, rule) from a metric's numeric inputs (criteria.py lists the keys; any may be missing)."""
    return verdict_from(assess(m))
