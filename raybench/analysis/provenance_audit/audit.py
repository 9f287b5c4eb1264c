"""The four axes on one embedding (one model x depth x provenance variable): Recover, Stress, Intervene,
Verify (docs/protocol.md §12). Pure of the run folder: arrays in, table rows out, so the tests can feed it
planted embeddings directly and run.py feeds it the activation store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit import probes as pr
from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit.fold import FoldStats, combine, fold_stats
from raybench.analysis.provenance_audit.verdict import NOT_AUDITED, Removal, decide, removal_verdict
from raybench.core.config import ProvenanceConfig

SPLITS = ("train", "val", "test")
MIN_CLASS_RECORDS = 2  # records of each target class a provenance group needs in train and in test
OTHER = "other"  # the pooled group of provenance values too small on their own
FOLD_STREAM = 4099  # second word of the outer folds' seed sequence


@dataclass(frozen=True)
class Inputs:
    """Per split: embedding [n, d], provenance labels [n] (str), target [n] (0/1), patient ids [n], and optionally
    the metadata-only comparator's features [n, m] (age, sex, recording year; NaN where missing)."""

    x: dict[str, np.ndarray]
    u: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    patients: dict[str, np.ndarray]
    meta: dict[str, np.ndarray] | None = None


@dataclass
class AuditResult:
    recover: dict = field(default_factory=dict)
    stress: list[dict] = field(default_factory=list)
    controls: list[dict] = field(default_factory=list)
    verdict: dict = field(default_factory=dict)
    gates: list[dict] = field(default_factory=list)


def _large_enough(inp: Inputs, members: list[str], min_records: int, min_cell: int = 0) -> tuple[bool, str]:
    ok, counts = True, {}
    for s in ("train", "test"):
        m = np.isin(inp.u[s].astype(str), members)
        n, n_pos = int(m.sum()), int(inp.y[s][m].sum())
        counts[s] = n
        need = max(MIN_CLASS_RECORDS, min_cell if s == "test" else 0)
        ok &= n >= min_records and min(n_pos, n - n_pos) >= need
        if s == "test":
            counts["cell"] = min(n_pos, n - n_pos)
    cell = f", smallest held-out cell {counts['cell']}" if min_cell else ""
    return ok, f"{counts['train']} train / {counts['test']} test records{cell}"


def _groups(inp: Inputs, min_records: int, min_cell: int) -> tuple[dict[str, str], dict[str, str]]:
    names = sorted(set(map(str, inp.u["train"])) | set(map(str, inp.u["test"])))
    groups, notes, small = {}, {}, []
    for g in names:
        ok, counts = _large_enough(inp, [g], min_records, min_cell)
        if ok:
            groups[g] = g
        else:
            small.append(g)
            notes[g] = counts
    if small and _large_enough(inp, small, min_records, min_cell)[0] and OTHER not in groups:
        for g in small:
            groups[g] = OTHER
            notes[g] += f", pooled into {OTHER!r}"
    return groups, notes


def eligible_groups(inp: Inputs, min_records: int, min_cell: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    """Which provenance value joins which audited group: a value with enough records (and of each target class;
    in the held-out split at least `min_cell` of each) in train and in test is its own group; the others are
    pooled into OTHER when the pool qualifies, else left out. When that leaves fewer than two groups, the grouping
    without `min_cell` is returned, so the cell-support gate names the small cell. Returns ({value: group},
    {value: why it is pooled or left out})."""
    groups, notes = _groups(inp, min_records, min_cell)
    if min_cell and len(set(groups.values())) < 2:
        groups, notes = _groups(inp, min_records, 0)
    return groups, notes


def _subset(inp: Inputs, groups: dict[str, str]) -> tuple[list[str], dict, dict, dict, dict, dict | None]:
    labels = sorted(set(groups.values()))
    code = {g: labels.index(label) for g, label in groups.items()}
    x, u, y, pat, meta = {}, {}, {}, {}, {}
    for s in SPLITS:
        names = inp.u[s].astype(str)
        m = np.isin(names, list(groups))
        x[s] = np.asarray(inp.x[s], dtype=np.float64)[m]
        u[s] = np.array([code[g] for g in names[m]], dtype=np.int64)
        y[s] = np.asarray(inp.y[s], dtype=np.int64)[m]
        pat[s] = np.asarray(inp.patients[s])[m]
        if inp.meta is not None:
            meta[s] = np.asarray(inp.meta[s], dtype=np.float64).reshape(len(m), -1)[m]
    return labels, x, u, y, pat, (meta if inp.meta is not None else None)


def support_note(counts: np.ndarray, labels: list[str], minimum: int) -> str | None:
    """"cell (y=1, u=B) has 5 held-out records (minimum 75)" for the smallest cell below the minimum, else None."""
    yi, ui = np.unravel_index(int(np.argmin(counts)), counts.shape)
    n = int(counts[yi, ui])
    return None if n >= minimum else f"cell (y={yi}, u={labels[ui]}) has {n} held-out records (minimum {minimum})"


def not_audited(reason: str, groups: dict[str, str] | None = None) -> AuditResult:
    note = "; ".join(f"{g}: {why}" for g, why in sorted((groups or {}).items()))
    return AuditResult(verdict={"verdict": NOT_AUDITED, "reason": reason + (f" (left out: {note})" if note else ""),
                                "groups_dropped": len(groups or {}), "dropped": note})


def outer_folds(pat: dict[str, np.ndarray], n_folds: int, seed: int) -> dict[str, np.ndarray]:
    """Patient-disjoint outer folds over all records: fold id per record of each split. Patients are ordered by
    id and permuted by `seed` alone, so every model, depth and variable sees the same folds."""
    ids = np.unique(np.concatenate([np.asarray(pat[s]).astype(str) for s in SPLITS]))
    fold_of = dict(zip(ids[np.random.default_rng([seed, FOLD_STREAM]).permutation(len(ids))],
                       np.arange(len(ids)) % n_folds, strict=True))
    return {s: np.array([fold_of[p] for p in np.asarray(pat[s]).astype(str)], dtype=np.int64) for s in SPLITS}


def fold_splits(arrays: dict[str, dict | None], pat: dict, n_folds: int, seed: int) -> list[dict[str, dict | None]]:
    """Per outer fold f: test = fold f, val = fold f + 1, train = the rest (each array dict re-split); one fold
    (n_folds = 1): the run's own split."""
    if n_folds == 1:
        return [arrays]
    fid = outer_folds(pat, n_folds, seed)
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
    cos, err = [c["cos_u"] for c in ctl], [c["energy_rel_error"] for c in ctl]
    out = {f"control_max_reduction_p{p}": rm.control_max_reduction,
           f"controls_beaten_p{p}": int((rm.reduction.estimate > red).sum()), f"controls_p{p}": len(ctl),
           f"control_median_cos_p{p}": float(np.median(cos)), f"control_energy_error_max_p{p}": float(max(err)),
           f"removed_energy_p{p}": info.get(f"removed_energy_p{p}", float("nan")),
           f"remedy_p{p}": removal_verdict(rm, delta)[0]}
    for key, name in (("g_after", "g_after"), ("reduction", "g_reduction"), ("util", "utility_change"),
                      ("nat", "exposed_natural_change")):
        pt, draws = est[f"{key}_p{p}"]
        lo, hi = pr.interval(draws)
        out |= {f"{name}_p{p}": pt, f"{name}_p{p}_ci_low": lo, f"{name}_p{p}_ci_high": hi}
    return out


def run_audit(inp: Inputs, cfg: ProvenanceConfig, seed_key: tuple[int, ...] = ()) -> AuditResult:
    """Recover, Stress, Intervene and Verify on one embedding (rows without model/depth keys), averaged over
    `provenance.folds` patient-disjoint outer folds (1: the run's own split)."""
    groups, dropped = eligible_groups(inp, cfg.min_group_records, cfg.min_cell_records)
    n_groups = len(set(groups.values()))
    if n_groups < 2:
        need = f"{cfg.min_group_records} records per split and {MIN_CLASS_RECORDS} of each target class"
        return not_audited(f"too small to audit: {n_groups} provenance group(s) with {need}, 2 needed", dropped)
    kept, x, u, y, pat, meta = _subset(inp, groups)
    if len(y["val"]) == 0 or np.unique(y["val"]).size < 2:
        return not_audited("the validation split lacks a target class, so C cannot be chosen", dropped)
    k = len(kept)
    folds = fold_splits({"x": x, "u": u, "y": y, "pat": pat, "meta": meta}, pat, cfg.folds, cfg.seed)
    support, smallest = _support(folds, kept, cfg.min_cell_records)
    if support and not cfg.cell_support_sensitivity:
        return not_audited(support, dropped)
    if any(np.any(rg.cell_counts(f["y"][s], f["u"][s], k) == 0) for f in folds for s in ("train", "val")):
        return not_audited("a train or validation (y, u) cell is empty: the natural odds ratio is undefined",
                           dropped)
    rng = np.random.default_rng([cfg.seed, *seed_key])
    stats: list[FoldStats] = []
    for f in folds:
        scaler = pr.Scaler.fit(f["x"]["train"])
        xs = {s: scaler(f["x"][s]) for s in SPLITS}
        stats.append(fold_stats(xs, f["u"], f["y"], f["pat"], f["meta"], k, cfg, rng))
    comb = combine(stats)
    est, info = comb.est, comb.info
    groups_note = {"groups": k, "groups_dropped": sum(g not in groups for g in dropped), "folds": len(folds),
                   "dropped": "; ".join(f"{g}: {why}" for g, why in sorted(dropped.items()))}
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
    verdict, reason = decide({g.name: g for g in gates}, removals.get(cfg.verdict_rank), cfg.epsilon, cfg.delta)
    if support:
        verdict, reason = f"{verdict} [sensitivity analysis]", f"sensitivity analysis, {support}; {reason}"
    g_lo, g_hi = pr.interval(est["g"][1])
    row = {"verdict": verdict, "reason": reason, "verdict_rank": cfg.verdict_rank, "g": est["g"][0],
           "g_ci_low": g_lo, "g_ci_high": g_hi, "kappa": info["kappa"], "min_cell_records": smallest,
           "sensitivity": support or "", "auroc_exposed": info["auroc_exposed"],
           "auroc_control": info["auroc_control"], "lpi_bits": lpi, "conditional_auroc": est["cond_auroc"][0],
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
    gate_rows = [{"rank": cfg.verdict_rank, **g.row()} for g in gates]
    return AuditResult(recover, comb.curves, controls, row, gate_rows)
