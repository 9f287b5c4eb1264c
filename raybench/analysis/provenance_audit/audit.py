"""The four axes on one embedding (one model x depth x provenance variable): Recover, Stress, Intervene,
Verify (docs/protocol.md §12). Pure of the run folder: arrays in, table rows out, so the tests can feed it
planted embeddings directly and run.py feeds it the activation store.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit import groups as gp
from raybench.analysis.provenance_audit import probes as pr
from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit.fold import FoldStats, combine, fold_stats
from raybench.analysis.provenance_audit.verdict import (
    NOT_AUDITED,
    Removal,
    decide,
    removal_verdict,
    task_sensitivity,
)
from raybench.core.config import ProvenanceConfig

SPLITS = ("train", "val", "test")
FOLD_STREAM = 4099  # second word of the outer folds' seed sequence


@dataclass(frozen=True)
class Inputs:
    """Per split: embedding [n, d], provenance labels [n] (str; empty or "nan": no value), target [n] (0/1),
    patient ids [n], optionally the metadata-only comparator's features [n, m] (age, sex, recording year; NaN
    where missing) and strata [n] (str: `device|site` compares the devices within each site). `variable` names u
    in verdicts and gate labels."""

    x: dict[str, np.ndarray]
    u: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    patients: dict[str, np.ndarray]
    meta: dict[str, np.ndarray] | None = None
    strata: dict[str, np.ndarray] | None = None
    variable: str = "device"


@dataclass
class AuditResult:
    recover: dict = field(default_factory=dict)
    stress: list[dict] = field(default_factory=list)
    controls: list[dict] = field(default_factory=list)
    verdict: dict = field(default_factory=dict)
    gates: list[dict] = field(default_factory=list)
    odds: list[dict] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)  # provenance value -> audited group
    fold_ids: dict[str, np.ndarray] | None = None  # outer fold of every input record (None: the run's split)


def _pooled(a: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(a[s]) for s in SPLITS])


def selection(inp: Inputs, fold_ids: dict[str, np.ndarray] | None, cfg: ProvenanceConfig) -> gp.Selection:
    """The audited groups on these folds (groups.py), stratified labels read stratum / value."""
    values = _pooled(inp.u).astype(str)
    strata = None
    if inp.strata is not None:
        strata = _pooled(inp.strata).astype(str)
        values = np.where(gp.missing(values) | gp.missing(strata), "",
                          np.char.add(np.char.add(strata, gp.STRATUM_SEP), values))
    roles = gp.Roles.of(None if fold_ids is None else _pooled(fold_ids), tuple(len(inp.y[s]) for s in SPLITS))
    rule = gp.Rule(cfg.min_group_records, cfg.min_cell_records, cfg.target)
    return gp.select_groups(values, strata, _pooled(inp.y).astype(np.int64), roles, rule,
                            inp.variable.partition("|")[2] or "stratum")


def _labels(inp: Inputs, s: str) -> np.ndarray:
    u = np.asarray(inp.u[s]).astype(str)
    if inp.strata is None:
        return u
    return np.char.add(np.char.add(np.asarray(inp.strata[s]).astype(str), gp.STRATUM_SEP), u)


def _subset(inp: Inputs, sel: gp.Selection, fold_ids: dict | None) -> tuple[list[str], dict, np.ndarray | None]:
    """Audited records of every split, u coded 0..k-1; and the stratum code of each group (None: no strata)."""
    labels = sorted(set(sel.groups.values()))
    code = {g: labels.index(label) for g, label in sel.groups.items()}
    arrays: dict[str, dict | None] = {n: {} for n in ("x", "u", "y", "pat", "meta", "fid")}
    for s in SPLITS:
        names = _labels(inp, s)
        m = np.isin(names, list(sel.groups))
        arrays["x"][s] = np.asarray(inp.x[s], dtype=np.float64)[m]
        arrays["u"][s] = np.array([code[g] for g in names[m]], dtype=np.int64)
        arrays["y"][s] = np.asarray(inp.y[s], dtype=np.int64)[m]
        arrays["pat"][s] = np.asarray(inp.patients[s])[m]
        if inp.meta is not None:
            arrays["meta"][s] = np.asarray(inp.meta[s], dtype=np.float64).reshape(len(m), -1)[m]
        if fold_ids is not None:
            arrays["fid"][s] = fold_ids[s][m]
    arrays["meta"] = arrays["meta"] if inp.meta is not None else None
    gs = None
    if sel.stratum is not None:
        names = sorted(set(sel.stratum.values()))
        gs = np.array([names.index(sel.stratum[g]) for g in labels], dtype=np.int64)
    return labels, arrays, gs


def support_note(counts: np.ndarray, labels: list[str], minimum: int) -> str | None:
    """"cell (y=1, u=B) has 5 held-out records (minimum 75)" for the smallest cell below the minimum, else None."""
    yi, ui = np.unravel_index(int(np.argmin(counts)), counts.shape)
    n = int(counts[yi, ui])
    return None if n >= minimum else f"cell (y={yi}, u={labels[ui]}) has {n} held-out records (minimum {minimum})"


def not_audited(reason: str, notes: dict[str, str] | None = None, fold_hash: str = "",
                fold_ids: dict[str, np.ndarray] | None = None) -> AuditResult:
    note = "; ".join(f"{g}: {why}" for g, why in sorted((notes or {}).items()))
    return AuditResult(verdict={"verdict": NOT_AUDITED, "reason": reason + (f" (left out: {note})" if note else ""),
                                "groups_dropped": len(notes or {}), "dropped": note, "fold_hash": fold_hash},
                       fold_ids=fold_ids)


def outer_folds(pat: dict[str, np.ndarray], n_folds: int, seed: int) -> dict[str, np.ndarray]:
    """Patient-disjoint outer folds over all records: fold id per record of each split. Patients are ordered by
    id and permuted by `seed` alone, so every model, depth and variable sees the same folds (the audit deals them
    over every patient of the run, before any group is chosen)."""
    ids = np.unique(np.concatenate([np.asarray(pat[s]).astype(str) for s in SPLITS]))
    fold_of = dict(zip(ids[np.random.default_rng([seed, FOLD_STREAM]).permutation(len(ids))],
                       np.arange(len(ids)) % n_folds, strict=True))
    return {s: np.array([fold_of[p] for p in np.asarray(pat[s]).astype(str)], dtype=np.int64) for s in SPLITS}


def fold_hash(pat: dict[str, np.ndarray], fold_ids: dict[str, np.ndarray] | None) -> str:
    """A short fingerprint of the patient -> fold assignment (equal for every variable of a run)."""
    if fold_ids is None:
        return "run split"
    pairs = sorted(set(zip(_pooled(pat).astype(str), _pooled(fold_ids).tolist(), strict=True)))
    return f"{zlib.crc32(repr(pairs).encode()):08x}"


def fold_splits(arrays: dict[str, dict | None], pat: dict, n_folds: int, seed: int,
                fold_ids: dict[str, np.ndarray] | None = None) -> list[dict[str, dict | None]]:
    """Per outer fold f: test = fold f, val = fold f + 1, train = the rest (each array dict re-split); one fold
    (n_folds = 1): the run's own split. fold_ids: the folds already dealt (else dealt over `pat`)."""
    if n_folds == 1:
        return [arrays]
    fid = outer_folds(pat, n_folds, seed) if fold_ids is None else fold_ids
    pooled = {name: None if a is None else np.concatenate([np.asarray(a[s]) for s in SPLITS]) for name, a in
              arrays.items()}
    f_all = np.concatenate([fid[s] for s in SPLITS])
    out = []
    for f in range(n_folds):
        role = {"test": f_all == f, "val": f_all == (f + 1) % n_folds}
        role["train"] = ~(role["test"] | role["val"])
        out.append({name: None if a is None else {s: a[role[s]] for s in SPLITS} for name, a in pooled.items()})
    return out


def _support(folds: list[dict], labels: list[str], minimum: int) -> tuple[str | None, int]:
    """The smallest held-out cell over the folds: its note when below `minimum` (else None) and its count."""
    counts = [rg.cell_counts(f["y"]["test"], f["u"]["test"], len(labels)) for f in folds]
    worst = int(np.argmin([c.min() for c in counts]))
    note = support_note(counts[worst], labels, minimum)
    if note and len(folds) > 1:
        note = note.replace(" held-out records", f" held-out records in fold {worst + 1} of {len(folds)}")
    return note, int(counts[worst].min())


def _rank_columns(est: dict, ctl: list[dict], info: dict, p: int, rm: Removal, delta: float) -> dict:
    red = np.asarray([c["g_reduction"] for c in ctl])
    cos, err = [c["cos_u"] for c in ctl], [c["variance_rel_error"] for c in ctl]
    var = [c["removed_variance"] for c in ctl]
    out = {f"control_max_reduction_p{p}": rm.control_max_reduction,
           f"controls_beaten_p{p}": int((rm.reduction.estimate > red).sum()), f"controls_p{p}": len(ctl),
           f"removed_variance_p{p}": info.get(f"removed_variance_p{p}", float("nan")),
           f"control_removed_variance_p{p}": float(np.median(var)),
           f"control_variance_error_max_p{p}": float(max(err)),
           f"controls_orthogonal_p{p}": int(sum(c["orthogonal"] for c in ctl)),
           f"control_median_cos_p{p}": float(np.median(cos)), f"remedy_p{p}": removal_verdict(rm, delta)[0]}
    for key, name in (("g_after", "g_after"), ("reduction", "g_reduction"), ("util", "utility_change"),
                      ("nat", "exposed_natural_change")):
        pt, draws = est[f"{key}_p{p}"]
        lo, hi = pr.interval(draws)
        out |= {f"{name}_p{p}": pt, f"{name}_p{p}_ci_low": lo, f"{name}_p{p}_ci_high": hi}
    return out


def _drops(est: dict, info: dict) -> dict:
    """Both heads' AUROC in the aligned and reversed regimes and their drops (aligned - reversed, with intervals)."""
    out = {f"auroc_{h}_{r}": info[f"auroc_{h}_{r}"] for h in ("exposed", "control") for r in ("aligned", "reversed")}
    for head, key in (("exposed", "drop_exp"), ("control", "drop_ctl")):
        lo, hi = pr.interval(est[key][1])
        out |= {f"drop_{head}": est[key][0], f"drop_{head}_ci_low": lo, f"drop_{head}_ci_high": hi}
    return out


def _odds(comb: FoldStats, kept: list[str]) -> tuple[list[dict], float, str]:
    """The natural (train) local odds ratios of y, each group against the first group of its stratum (fold
    geometric means; the regimes raise every one to the power e), and kappa: the one furthest from 1."""
    rows = [{"group": kept[j], "reference": kept[ref], "odds_ratio": float(np.exp(np.mean(np.log(v))))}
            for (j, ref), v in sorted(comb.odds.items())]
    if not rows:
        return rows, float("nan"), ""
    top = max(rows, key=lambda r: abs(np.log(r["odds_ratio"])) if r["odds_ratio"] > 0 else np.inf)
    return rows, top["odds_ratio"], f"{top['group']} vs {top['reference']}"


def run_audit(inp: Inputs, cfg: ProvenanceConfig, seed_key: tuple[int, ...] = ()) -> AuditResult:
    """Recover, Stress, Intervene and Verify on one embedding (rows without model/depth keys), averaged over
    `provenance.folds` patient-disjoint outer folds (1: the run's own split), dealt over every patient before the
    groups are chosen."""
    fold_ids = outer_folds(inp.patients, cfg.folds, cfg.seed) if cfg.folds > 1 else None
    fhash = fold_hash(inp.patients, fold_ids)
    sel = selection(inp, fold_ids, cfg)
    n_groups = sel.n_groups
    if n_groups < 2:
        need = f"{cfg.min_group_records} records and {gp.MIN_CLASS_RECORDS} of each target class in every fold"
        within = " within a stratum" if inp.strata is not None else ""
        return not_audited(f"too small to audit: {n_groups} provenance group(s){within} with {need}, 2 needed",
                           sel.notes, fhash, fold_ids)
    kept, arrays, gs = _subset(inp, sel, fold_ids)
    if fold_ids is None:
        arrays["fid"] = None
    y = arrays["y"]
    if len(y["val"]) == 0 or np.unique(y["val"]).size < 2:
        return not_audited("the validation split lacks a target class, so C cannot be chosen", sel.notes, fhash,
                           fold_ids)
    k = len(kept)
    fid = arrays.pop("fid")
    folds = fold_splits(arrays, arrays["pat"], cfg.folds, cfg.seed, fid)
    support, smallest = _support(folds, kept, cfg.min_cell_records)
    if support and not cfg.cell_support_sensitivity:
        return not_audited(support, sel.notes, fhash, fold_ids)
    if any(np.any(rg.cell_counts(f["y"][s], f["u"][s], k) == 0) for f in folds for s in ("train", "val")):
        return not_audited("a train or validation (y, u) cell is empty: the natural odds ratio is undefined",
                           sel.notes, fhash, fold_ids)
    rng = np.random.default_rng([cfg.seed, *seed_key])
    stats: list[FoldStats] = []
    for f in folds:
        scaler = pr.Scaler.fit(f["x"]["train"])
        xs = {s: scaler(f["x"][s]) for s in SPLITS}
        stats.append(fold_stats(xs, f["u"], f["y"], f["pat"], f["meta"], k, cfg, rng, gs))
    comb = combine(stats)
    est, info = comb.est, comb.info
    groups_note = {"groups": k, "groups_dropped": sum(g not in sel.groups for g in sel.notes), "folds": len(folds),
                   "dropped": "; ".join(f"{g}: {why}" for g, why in sorted(sel.notes.items())), "fold_hash": fhash}
    lpi, lpi_draws = est["lpi"]
    lo, hi = pr.interval(lpi_draws)
    h = info["prior_bits"]
    recover = {"lpi_bits": lpi, "ci_low": lo, "ci_high": hi, "prior_bits": h,
               "lpi_fraction": lpi / h if h > 0 else float("nan"), "conditional_auroc": est["cond_auroc"][0],
               **{c: info[c] for c in ("accuracy", "c", "temperature", "n_train", "n_test", "test_patients")},
               **groups_note}
    gates = gt.gates_from(est, cfg.verdict_rank, cfg.epsilon, cfg.delta)
    removals, cols = {}, {}
    for p, ctl in comb.controls.items():
        red = gt.make_gate(gt.REDUCE_GATE, *est[f"reduction_p{p}"], cfg.epsilon, cfg.delta)
        removals[p] = Removal(p, red, max(c["g_reduction"] for c in ctl), pr.interval(est[f"util_p{p}"][1])[0])
        cols[p] = _rank_columns(est, ctl, info, p, removals[p], cfg.delta)
    drops = _drops(est, info)
    odds, kappa, kappa_pair = _odds(comb, kept)
    verdict, reason = decide({g.name: g for g in gates}, removals.get(cfg.verdict_rank), cfg.epsilon, cfg.delta)
    verdict, reason = task_sensitivity(verdict, reason, drops, inp.variable, cfg.epsilon)
    reason = reason.replace(gt.RECOVER_GATE, gt.label(gt.RECOVER_GATE, inp.variable))
    if support:
        verdict, reason = f"{verdict} [sensitivity analysis]", f"sensitivity analysis, {support}; {reason}"
    g_lo, g_hi = pr.interval(est["g"][1])
    row = {"verdict": verdict, "reason": reason, "verdict_rank": cfg.verdict_rank, "g": est["g"][0],
           "g_ci_low": g_lo, "g_ci_high": g_hi, "kappa": kappa, "kappa_pair": kappa_pair,
           "min_cell_records": smallest, "sensitivity": support or "", "auroc_exposed": info["auroc_exposed"],
           "auroc_control": info["auroc_control"], **drops, "lpi_bits": lpi,
           "conditional_auroc": est["cond_auroc"][0], "stratified_by": "" if inp.strata is None else "yes",
           **groups_note}
    if "meta_auroc" in est:
        (gm, gm_d), (g, g_d) = est["g_meta"], est["g"]
        m_lo, m_hi = pr.interval(gm_d)
        e_lo, e_hi = pr.interval(g_d - gm_d)
        row |= {"metadata_recoverability": est["meta_auroc"][0], "g_metadata": gm, "g_metadata_ci_low": m_lo,
                "g_metadata_ci_high": m_hi, "g_excess_over_metadata": g - gm,
                "g_excess_over_metadata_ci_low": e_lo, "g_excess_over_metadata_ci_high": e_hi}
    for p in cfg.ranks:
        row.update(cols.get(p, {}))
    controls = [c for p in sorted(comb.controls) for c in comb.controls[p]]
    gate_rows = [{"rank": cfg.verdict_rank, **g.row(), "gate": gt.label(g.name, inp.variable)} for g in gates]
    return AuditResult(recover, comb.curves, controls, row, gate_rows, odds, dict(sel.groups),
                       fold_ids)
