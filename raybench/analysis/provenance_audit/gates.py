"""The validity and verification gates (docs/protocol.md §12.5; PhysioTRACE Table 16), each an estimate, a 95%
patient-bootstrap interval and pass / fail:

1. excess gap G >= epsilon with lower bound > 0 (a reliance large enough to matter);
2. control reversed advantage AUC_ctl(reversed) - AUC_exp(reversed) >= epsilon, lower bound > 0 (the control head
   is the better head once the association reverses: a control that is merely weak cannot pass);
3. exposed aligned non-inferiority AUC_exp(aligned) - AUC_ctl(aligned), lower bound >= -delta (the exposed head is
   not simply a worse model);
4. conditional device recoverability: AUROC of the device probe within each stratum of y (mean over strata and,
   for more than two groups, one-vs-rest over groups), lower bound > 0.5;
5. embedding probe above a metadata-only comparator (age, sex, recording year): gate 4's AUROC from the embedding
   minus that from the metadata alone, paired draws, lower bound > 0 (Table 16's 0.897 vs 0.750: 0.147);
6. the targeted projection reduces G: G before - G after, lower bound > 0.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from raybench.analysis.provenance_audit.probes import interval
from raybench.analysis.provenance_audit.stress import StressAUROCs, weighted_auroc

G_GATE = "excess gap G"
CONTROL_GATE = "control reversed advantage"
ALIGNED_GATE = "exposed aligned non-inferiority"
RECOVER_GATE = "conditional device recoverability"
METADATA_GATE = "embedding probe above metadata"
REDUCE_GATE = "targeted projection reduces G"
VALIDITY = (CONTROL_GATE, ALIGNED_GATE, RECOVER_GATE, METADATA_GATE)


@dataclass(frozen=True)
class Gate:
    name: str
    criterion: str
    estimate: float
    ci_low: float
    ci_high: float
    passed: bool | None  # None: not evaluated (the note says why)
    note: str = ""

    def row(self) -> dict:
        """The gates table's columns (`gate` for the name)."""
        row = asdict(self)
        return {"gate": row.pop("name"), **row}

    def describe(self) -> str:
        return f"{self.name} {self.estimate:.3f} [{self.ci_low:.3f}, {self.ci_high:.3f}] ({self.criterion})"


def rule(name: str, epsilon: float, delta: float) -> tuple[str, object]:
    """(criterion text, pass test of (point, lower bound)) of a gate."""
    effect = (f">= {epsilon:g} and 95% lower bound > 0", lambda p, lo: p >= epsilon and lo > 0)
    return {G_GATE: effect, CONTROL_GATE: effect,
            ALIGNED_GATE: (f"95% lower bound >= -{delta:g}", lambda p, lo: lo >= -delta),
            RECOVER_GATE: ("95% lower bound > 0.5", lambda p, lo: lo > 0.5),
            METADATA_GATE: ("paired 95% lower bound > 0", lambda p, lo: lo > 0),
            REDUCE_GATE: ("95% lower bound > 0", lambda p, lo: lo > 0)}[name]


def make_gate(name: str, point: float, draws: np.ndarray, epsilon: float, delta: float) -> Gate:
    criterion, test = rule(name, epsilon, delta)
    lo, hi = interval(draws)
    ok = bool(np.isfinite(point) and np.isfinite(lo) and test(point, lo))
    return Gate(name, criterion, float(point), lo, hi, ok)


def not_evaluated(name: str, note: str) -> Gate:
    return Gate(name, rule(name, 0.0, 0.0)[0] if name != G_GATE else "", float("nan"), float("nan"),
                float("nan"), None, note)


def gates_from(est: dict[str, tuple[float, np.ndarray]], rank: int, epsilon: float, delta: float) -> list[Gate]:
    """All six gates from (point, draws) estimates keyed as in fold.py (fold means when there are folds)."""
    out = [make_gate(name, *est[key], epsilon, delta) for name, key in
           ((G_GATE, "g"), (CONTROL_GATE, "ctl_adv"), (ALIGNED_GATE, "exp_adv"), (RECOVER_GATE, "cond_auroc"))]
    if "meta_auroc" in est:
        (pe, de), (pm, dm) = est["cond_auroc"], est["meta_auroc"]
        out.append(make_gate(METADATA_GATE, pe - pm, de - dm, epsilon, delta))
    else:
        out.append(not_evaluated(METADATA_GATE, "no metadata (age, sex, recording date) for these records"))
    key = f"reduction_p{rank}"
    out.append(make_gate(REDUCE_GATE, *est[key], epsilon, delta) if key in est else
               not_evaluated(REDUCE_GATE, f"no rank-{rank} removal was possible"))
    return out


def label(name: str, variable: str) -> str:
    """A gate's name as the tables show it: the recoverability gate names the audited variable."""
    if name != RECOVER_GATE:
        return name
    var, _, stratum = variable.partition("|")
    return name.replace("device", var) + (f" within {stratum}" if stratum else "")


def conditional_auroc(scores: np.ndarray, u: np.ndarray, y: np.ndarray, k: int, base: np.ndarray,
                      gs: np.ndarray | None = None) -> np.ndarray:
    """Device-probe AUROC within the strata of y, per weight row of base [B, n] -> [B]. scores [n, k]: the probe's
    log-probability of each group; for each stratum and each group j (only j = 1 when k = 2) the AUROC of
    scores[:, j] for u == j, averaged. gs (the stratum of each group): within each class of y and stratum, among
    the records of j's stratum."""
    scores, u = np.asarray(scores, dtype=np.float64), np.asarray(u)
    base = np.atleast_2d(base)
    vals = []
    for s in np.unique(y):
        in_y = np.asarray(y) == s
        for j in ([1] if k == 2 and gs is None else range(k)):
            mask = in_y if gs is None else in_y & (gs[u] == gs[j])
            vals.append(weighted_auroc(scores[:, j], (u == j).astype(np.int64), base * mask[None, :]))
    return np.nanmean(np.vstack(vals), axis=0)


def validity_gates(before_pt: StressAUROCs, before_b: StressAUROCs, recover_pt: float, recover_b: np.ndarray,
                   meta_pt: float | None, meta_b: np.ndarray | None, epsilon: float, delta: float) -> list[Gate]:
    """Gates 1-5 from the heads' AUROCs before removal and the conditional recoverability of the embedding and
    (None: no metadata) of the metadata-only probe."""
    est = {"g": (before_pt.g[0], before_b.g),
           "ctl_adv": ((before_pt.ctl_reversed - before_pt.exp_reversed)[0],
                       before_b.ctl_reversed - before_b.exp_reversed),
           "exp_adv": ((before_pt.exp_aligned - before_pt.ctl_aligned)[0], before_b.exp_aligned - before_b.ctl_aligned),
           "cond_auroc": (recover_pt, recover_b)}
    if meta_pt is not None and meta_b is not None:
        est["meta_auroc"] = (meta_pt, meta_b)
    return gates_from(est, 0, epsilon, delta)[:5]


def reduction_gate(before_pt: StressAUROCs, before_b: StressAUROCs, after_pt: StressAUROCs,
                   after_b: StressAUROCs) -> Gate:
    """Gate 6: G before - G after the targeted removal (paired draws), lower bound > 0."""
    return make_gate(REDUCE_GATE, (before_pt.g - after_pt.g)[0], before_b.g - after_b.g, 0.0, 0.0)
