"""The four axes on one embedding (one model x depth x provenance variable): Recover, Stress, Intervene,
Verify (docs/protocol.md §12). Pure of the run folder: arrays in, table rows out, so the tests can feed it
planted embeddings directly and run.py feeds it the activation store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit import intervene as iv
from raybench.analysis.provenance_audit import probes as pr
from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit import stress as st
from raybench.analysis.provenance_audit.verdict import NOT_AUDITED, Removal, decide
from raybench.config import ProvenanceConfig

SPLITS = ("train", "val", "test")
MIN_CLASS_RECORDS = 2  # records of each target class a provenance group needs in train and in test
OTHER = "other"  # the pooled group of provenance values too small on their own


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


def _meta_features(meta: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Standardize with train mean / std; a missing value becomes the train mean (0)."""
    tr = meta["train"]
    mean = np.nanmean(np.where(np.isfinite(tr), tr, np.nan), axis=0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    std = np.nanstd(np.where(np.isfinite(tr), tr, np.nan), axis=0)
    std = np.where(np.isfinite(std) & (std > 1e-8), std, 1.0)
    return {s: np.where(np.isfinite(v), (v - mean) / std, 0.0) for s, v in meta.items()}


def not_audited(reason: str, groups: dict[str, str] | None = None) -> AuditResult:
    note = "; ".join(f"{g}: {why}" for g, why in sorted((groups or {}).items()))
    return AuditResult(verdict={"verdict": NOT_AUDITED, "reason": reason + (f" (left out: {note})" if note else ""),
                                "certified_rank": None, "groups_dropped": len(groups or {}), "dropped": note})


def _intervene(xs: dict, y: dict, u: dict, k: int, heads: st.Heads, reg: st.Regimes, base: np.ndarray,
               b0: tuple[st.StressAUROCs, st.StressAUROCs], c: float, cfg: ProvenanceConfig,
               rng: np.random.Generator) -> tuple[list[dict], list[dict], dict[int, Removal], dict[int, dict]]:
    """Every rank's removal and its random controls -> (stress rows, control rows, removals, verdict columns)."""
    from raybench.analysis.provenance_audit.verdict import removal_verdict

    wh = iv.Whitener.fit(xs["train"], y["train"])
    z_tr, z_te = wh(xs["train"]), wh(xs["test"])
    before = heads.scores(xs["test"])
    # a head's score after removal: s(x') = s(x) - (z U)(U^T W^-1 w), no embedding rebuilt per control
    head_dirs = wh.w_inv @ np.hstack([heads.exposed.coef.T, heads.control.coef.T])  # [d, 2]

    def removed(basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        delta = (z_te @ basis) @ (basis.T @ head_dirs)
        return before[0] - delta[:, 0], before[1] - delta[:, 1]

    yt, ut = y["test"], u["test"]
    energy = iv.EnergyForm.fit(z_tr)
    w_pt = np.vstack([reg.weights(yt, ut, 1.0), reg.weights(yt, ut, -1.0)])
    g0 = float(b0[0].g[0])
    # rank of the stacked within-class probe weights: (K - 1) per class of y that holds two groups
    max_rank = sum(1 for c_ in np.unique(y["train"]) if np.unique(u["train"][y["train"] == c_]).size >= 2) * (k - 1)
    stress, controls, removals, cols = [], [], {}, {}
    for p in cfg.ranks:
        if p > min(max_rank, xs["train"].shape[1]):
            continue
        basis = iv.provenance_subspace(z_tr, y["train"], u["train"], p, c)
        after = removed(basis)
        stress += [{"stage": f"removed_p{p}", "rank": p, **r} for r in st.curve(after, yt, ut, reg,
                                                                                 cfg.association_levels)]
        a_pt, a_b = st.stress_aurocs(after, yt, ut, reg), st.stress_aurocs(after, yt, ut, reg, base)
        red = gt.reduction_gate(b0[0], b0[1], a_pt, a_b)
        bases, errors, cosines = iv.matched_random_subspaces(energy, basis, cfg.random_controls, rng)
        reductions = np.empty(len(bases))
        for i, q in enumerate(bases):
            sc = removed(q)
            a_e, a_c = st.weighted_auroc(sc[0], yt, w_pt), st.weighted_auroc(sc[1], yt, w_pt)
            g_c = float((a_e[0] - a_e[1]) - (a_c[0] - a_c[1]))
            reductions[i] = g0 - g_c
            controls.append({"rank": p, "control": i, "g_after": g_c, "g_reduction": g0 - g_c,
                             "energy_rel_error": float(errors[i]), "cos_u": float(cosines[i])})
        util_lo, util_hi = pr.interval(a_b.ctl_independent - b0[1].ctl_independent)
        nat_lo, nat_hi = pr.interval(a_b.exp_observed - b0[1].exp_observed)
        rm = Removal(p, red, float(reductions.max()), util_lo)
        removals[p] = rm
        gl, gh = pr.interval(a_b.g)
        cols[p] = {f"g_after_p{p}": float(a_pt.g[0]), f"g_after_p{p}_ci_low": gl, f"g_after_p{p}_ci_high": gh,
                   f"g_reduction_p{p}": red.estimate, f"g_reduction_p{p}_ci_low": red.ci_low,
                   f"control_max_reduction_p{p}": rm.control_max_reduction,
                   f"controls_beaten_p{p}": int((red.estimate > reductions).sum()), f"controls_p{p}": len(bases),
                   f"control_median_cos_p{p}": float(np.median(cosines)),
                   f"control_energy_error_max_p{p}": float(errors.max()), f"removed_energy_p{p}": energy(basis),
                   f"utility_change_p{p}": float((a_pt.ctl_independent - b0[0].ctl_independent)[0]),
                   f"utility_change_p{p}_ci_low": util_lo, f"utility_change_p{p}_ci_high": util_hi,
                   f"exposed_natural_change_p{p}": float((a_pt.exp_observed - b0[0].exp_observed)[0]),
                   f"exposed_natural_change_p{p}_ci_low": nat_lo, f"exposed_natural_change_p{p}_ci_high": nat_hi,
                   f"remedy_p{p}": removal_verdict(rm, cfg.delta)[0]}
    return stress, controls, removals, cols


def _metadata(meta: dict | None, y: dict, u: dict, k: int, reg: st.Regimes, base: np.ndarray,
              cfg: ProvenanceConfig) -> tuple[float | None, np.ndarray | None, dict]:
    """The metadata-only comparator: its conditional device recoverability (point, draws) for gate 5, and the G
    of heads fitted on the metadata alone (PhysioTRACE Table 18's comparator, reported beside the embedding's)."""
    if meta is None:
        return None, None, {}
    mf = _meta_features(meta)
    probe = pr.calibrated_probe(mf["train"], u["train"], mf["val"], u["val"], cfg.c_grid)
    logp = probe.log_proba(mf["test"])
    yt, ut = y["test"], u["test"]
    pt = float(gt.conditional_auroc(logp, ut, yt, k, np.ones((1, len(yt))))[0])
    draws = gt.conditional_auroc(logp, ut, yt, k, base)
    heads = st.fit_heads(mf["train"], y["train"], u["train"], mf["val"], y["val"], u["val"], k, cfg.c_grid)
    sc = heads.scores(mf["test"])
    g_b = st.stress_aurocs(sc, yt, ut, reg, base).g
    lo, hi = pr.interval(g_b)
    return pt, draws, {"metadata_recoverability": pt, "g_metadata": float(st.stress_aurocs(sc, yt, ut, reg).g[0]),
                       "g_metadata_ci_low": lo, "g_metadata_ci_high": hi, "_g_metadata_draws": g_b}


def run_audit(inp: Inputs, cfg: ProvenanceConfig, seed_key: tuple[int, ...] = ()) -> AuditResult:
    """Recover, Stress, Intervene and Verify on one embedding (rows without model/depth keys)."""
    groups, dropped = eligible_groups(inp, cfg.min_group_records, cfg.min_cell_records)
    n_groups = len(set(groups.values()))
    if n_groups < 2:
        need = f"{cfg.min_group_records} records per split and {MIN_CLASS_RECORDS} of each target class"
        return not_audited(f"too small to audit: {n_groups} provenance group(s) with {need}, 2 needed", dropped)
    kept, x, u, y, pat, meta = _subset(inp, groups)
    if len(y["val"]) == 0 or np.unique(y["val"]).size < 2:
        return not_audited("the validation split lacks a target class, so C cannot be chosen", dropped)
    k = len(kept)
    support = support_note(rg.cell_counts(y["test"], u["test"], k), kept, cfg.min_cell_records)
    if support and not cfg.cell_support_sensitivity:
        return not_audited(support, dropped)
    if np.any(rg.cell_counts(y["train"], u["train"], k) == 0):
        return not_audited("a train (y, u) cell is empty: the natural odds ratio is undefined", dropped)
    rng = np.random.default_rng([cfg.seed, *seed_key])
    scaler = pr.Scaler.fit(x["train"])
    xs = {s: scaler(x[s]) for s in SPLITS}
    yt, ut = y["test"], u["test"]
    base = rg.cell_bootstrap(pat["test"], yt, ut, k, cfg.draws, rng)
    groups_note = {"groups": k, "groups_dropped": sum(g not in groups for g in dropped),
                   "dropped": "; ".join(f"{g}: {why}" for g, why in sorted(dropped.items()))}

    # Recover
    probe = pr.calibrated_probe(xs["train"], u["train"], xs["val"], u["val"], cfg.c_grid)
    idx = pr.class_index(probe.classes, ut)
    prior = pr.prior_log_proba(u["train"], probe.classes)
    logp = probe.log_proba(xs["test"])
    terms = pr.lpi_terms(logp, prior, idx)
    lo, hi = pr.interval(base @ terms / base.sum(1))
    h = pr.entropy_bits(prior, idx)
    rec_pt = float(gt.conditional_auroc(logp, ut, yt, k, np.ones((1, len(yt))))[0])
    rec_b = gt.conditional_auroc(logp, ut, yt, k, base)
    recover = {"lpi_bits": float(terms.mean()), "ci_low": lo, "ci_high": hi, "prior_bits": h,
               "lpi_fraction": float(terms.mean() / h) if h > 0 else float("nan"),
               "accuracy": float((logp.argmax(1) == idx).mean()), "conditional_auroc": rec_pt,
               "c": probe.c, "temperature": probe.temperature, "n_train": len(u["train"]), "n_test": len(ut),
               "test_patients": len(np.unique(pat["test"].astype(str))), **groups_note}

    # Stress
    heads = st.fit_heads(xs["train"], y["train"], u["train"], xs["val"], y["val"], u["val"], k, cfg.c_grid)
    before = heads.scores(xs["test"])
    reg = st.Regimes.build(y["train"], u["train"], yt, ut, k, cfg.association_levels)
    stress = [{"stage": "before", "rank": 0, **r} for r in st.curve(before, yt, ut, reg, cfg.association_levels)]
    b0 = st.stress_aurocs(before, yt, ut, reg), st.stress_aurocs(before, yt, ut, reg, base)
    meta_pt, meta_b, meta_cols = _metadata(meta, y, u, k, reg, base, cfg)
    gates = gt.validity_gates(b0[0], b0[1], rec_pt, rec_b, meta_pt, meta_b, cfg.epsilon, cfg.delta)

    # Intervene + Verify
    stress_after, controls, removals, cols = _intervene(xs, y, u, k, heads, reg, base, b0, probe.c, cfg, rng)
    rm = removals.get(cfg.verdict_rank)
    gates.append(rm.reduction if rm is not None else gt.not_evaluated(
        gt.REDUCE_GATE, "95% lower bound > 0", f"no rank-{cfg.verdict_rank} removal was possible"))
    verdict, reason = decide({g.name: g for g in gates}, rm, cfg.epsilon, cfg.delta)
    if support:
        verdict, reason = f"{verdict} [sensitivity analysis]", f"sensitivity analysis, {support}; {reason}"
    g_draws = b0[1].g
    g_lo, g_hi = pr.interval(g_draws)
    if meta_cols:
        e_lo, e_hi = pr.interval(g_draws - meta_cols.pop("_g_metadata_draws"))
        meta_cols.update(g_excess_over_metadata=float(b0[0].g[0]) - meta_cols["g_metadata"],
                         g_excess_over_metadata_ci_low=e_lo, g_excess_over_metadata_ci_high=e_hi)
    row = {"verdict": verdict, "reason": reason, "verdict_rank": cfg.verdict_rank, "g": float(b0[0].g[0]),
           "g_ci_low": g_lo, "g_ci_high": g_hi, "kappa": reg.kappa,
           "min_cell_records": int(rg.cell_counts(yt, ut, k).min()), "sensitivity": support or "",
           "auroc_exposed": float(b0[0].exp_observed[0]), "auroc_control": float(b0[0].ctl_independent[0]),
           "lpi_bits": recover["lpi_bits"], "conditional_auroc": rec_pt, **meta_cols, **groups_note}
    for p in cfg.ranks:
        row.update(cols.get(p, {}))
    gate_rows = [{"rank": cfg.verdict_rank, **g.row()} for g in gates]
    return AuditResult(recover, stress + stress_after, controls, row, gate_rows)
