"""The four axes on one embedding (one model x depth x provenance variable): Recover, Stress, Intervene,
Verify (docs/protocol.md §12). Pure of the run folder: arrays in, table rows out, so the tests can feed it
planted embeddings directly and run.py feeds it the activation store.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from raybench.analysis.provenance_audit import intervene as iv
from raybench.analysis.provenance_audit import probes as pr
from raybench.analysis.provenance_audit import stress as st
from raybench.analysis.provenance_audit.verdict import NOT_AUDITED, Removal, decide
from raybench.config import ProvenanceConfig

SPLITS = ("train", "val", "test")
MIN_CLASS_RECORDS = 2  # records of each target class a provenance group needs in train and in test
OTHER = "other"  # the pooled group of provenance values too small on their own


@dataclass(frozen=True)
class Inputs:
    """Per split: embedding [n, d], provenance labels [n] (str), target [n] (0/1), patient ids [n]."""

    x: dict[str, np.ndarray]
    u: dict[str, np.ndarray]
    y: dict[str, np.ndarray]
    patients: dict[str, np.ndarray]


@dataclass
class AuditResult:
    recover: dict = field(default_factory=dict)
    stress: list[dict] = field(default_factory=list)
    controls: list[dict] = field(default_factory=list)
    verdict: dict = field(default_factory=dict)


def _large_enough(inp: Inputs, members: list[str], min_records: int) -> tuple[bool, str]:
    ok, counts = True, {}
    for s in ("train", "test"):
        m = np.isin(inp.u[s].astype(str), members)
        n, n_pos = int(m.sum()), int(inp.y[s][m].sum())
        counts[s] = n
        ok &= n >= min_records and min(n_pos, n - n_pos) >= MIN_CLASS_RECORDS
    return ok, f"{counts['train']} train / {counts['test']} test records"


def eligible_groups(inp: Inputs, min_records: int) -> tuple[dict[str, str], dict[str, str]]:
    """Which provenance value joins which audited group: a value with enough records (and of each target class)
    in train and in test is its own group; the others are pooled into OTHER when the pool is large enough,
    else left out. Returns ({value: group}, {value: why it is pooled or left out})."""
    names = sorted(set(map(str, inp.u["train"])) | set(map(str, inp.u["test"])))
    groups, notes, small = {}, {}, []
    for g in names:
        ok, counts = _large_enough(inp, [g], min_records)
        if ok:
            groups[g] = g
        else:
            small.append(g)
            notes[g] = counts
    if small and _large_enough(inp, small, min_records)[0] and OTHER not in groups:
        for g in small:
            groups[g] = OTHER
            notes[g] += f", pooled into {OTHER!r}"
    return groups, notes


def _subset(inp: Inputs, groups: dict[str, str]) -> tuple[list[str], dict, dict, dict, dict]:
    labels = sorted(set(groups.values()))
    code = {g: labels.index(label) for g, label in groups.items()}
    x, u, y, pat = {}, {}, {}, {}
    for s in SPLITS:
        names = inp.u[s].astype(str)
        m = np.isin(names, list(groups))
        x[s] = np.asarray(inp.x[s], dtype=np.float64)[m]
        u[s] = np.array([code[g] for g in names[m]], dtype=np.int64)
        y[s] = np.asarray(inp.y[s], dtype=np.int64)[m]
        pat[s] = np.asarray(inp.patients[s])[m]
    return labels, x, u, y, pat


def not_audited(reason: str, groups: dict[str, str] | None = None) -> AuditResult:
    note = "; ".join(f"{g}: {why}" for g, why in sorted((groups or {}).items()))
    return AuditResult(verdict={"verdict": NOT_AUDITED, "reason": reason + (f" (left out: {note})" if note else ""),
                                "certified_rank": None, "groups_dropped": len(groups or {}), "dropped": note})


def run_audit(inp: Inputs, cfg: ProvenanceConfig, seed_key: tuple[int, ...] = ()) -> AuditResult:
    """Recover, Stress, Intervene and Verify on one embedding (rows without model/depth keys)."""
    groups, dropped = eligible_groups(inp, cfg.min_group_records)
    n_groups = len(set(groups.values()))
    if n_groups < 2:
        need = f"{cfg.min_group_records} records per split and {MIN_CLASS_RECORDS} of each target class"
        return not_audited(f"too small to audit: {n_groups} provenance group(s) with {need}, 2 needed", dropped)
    kept, x, u, y, pat = _subset(inp, groups)
    if len(y["val"]) == 0 or np.unique(y["val"]).size < 2:
        return not_audited("the validation split lacks a target class, so C cannot be chosen", dropped)
    k = len(kept)
    rng = np.random.default_rng([cfg.seed, *seed_key])
    scaler = pr.Scaler.fit(x["train"])
    xs = {s: scaler(x[s]) for s in SPLITS}
    codes, n_pat = pr.patient_codes(pat["test"])
    counts = pr.patient_draws(n_pat, cfg.draws, rng)
    base = pr.record_weights(counts, codes)
    groups_note = {"groups": k, "groups_dropped": sum(g not in groups for g in dropped),
                   "dropped": "; ".join(f"{g}: {why}" for g, why in sorted(dropped.items()))}

    # Recover
    probe = pr.calibrated_probe(xs["train"], u["train"], xs["val"], u["val"], cfg.c_grid)
    idx = pr.class_index(probe.classes, u["test"])
    prior = pr.prior_log_proba(u["train"], probe.classes)
    logp = probe.log_proba(xs["test"])
    terms = pr.lpi_terms(logp, prior, idx)
    lo, hi = pr.interval(pr.bootstrap_mean(terms, codes, counts))
    h = pr.entropy_bits(prior, idx)
    recover = {"lpi_bits": float(terms.mean()), "ci_low": lo, "ci_high": hi, "prior_bits": h,
               "lpi_fraction": float(terms.mean() / h) if h > 0 else float("nan"),
               "accuracy": float((logp.argmax(1) == idx).mean()), "c": probe.c, "temperature": probe.temperature,
               "n_train": len(u["train"]), "n_test": len(u["test"]), "test_patients": n_pat, **groups_note}

    # Stress
    heads = st.fit_heads(xs["train"], y["train"], u["train"], xs["val"], y["val"], u["val"], k, cfg.c_grid)
    before = heads.scores(xs["test"])
    stress = [{"stage": "before", "rank": 0, **r} for r in st.curve(before, y["test"], u["test"], k,
                                                                      cfg.association_levels)]
    g0 = st.g_point(before, y["test"], u["test"], k)
    g0_draws = st.g_draws(before, y["test"], u["test"], k, base)
    g_lo, g_hi = pr.interval(g0_draws)
    util0 = st.auroc(before[0], y["test"])
    util0_draws = st.weighted_auroc(before[0], y["test"], base)

    # Intervene + controls
    wh = iv.Whitener.fit(xs["train"], y["train"])
    z_tr, z_te = wh(xs["train"]), wh(xs["test"])
    # a head's score after removal: s(x') = s(x) - (z U)(U^T W^-1 w), no embedding rebuilt per control
    head_dirs = wh.w_inv @ np.hstack([heads.exposed.coef.T, heads.control.coef.T])  # [d, 2]

    def removed(basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        delta = (z_te @ basis) @ (basis.T @ head_dirs)
        return before[0] - delta[:, 0], before[1] - delta[:, 1]

    energy = iv.EnergyForm.fit(z_tr, wh, y["train"])
    p_obs = st.joint(y["test"], u["test"], k)
    w_two = np.vstack([np.ones(len(y["test"])),
                       st.level_weights(y["test"], u["test"], k, st.feasible_level(p_obs, -1.0))])
    controls, removals = [], []
    rank_rows = {}
    # rank of the stacked within-class probe weights: (K - 1) per class of y that holds two groups
    max_rank = sum(1 for c in np.unique(y["train"]) if np.unique(u["train"][y["train"] == c]).size >= 2) * (k - 1)
    for p in cfg.ranks:
        if p > min(max_rank, xs["train"].shape[1]):
            continue
        basis = iv.provenance_subspace(z_tr, y["train"], u["train"], p, probe.c)
        target = energy(basis)
        after = removed(basis)
        stress += [{"stage": f"removed_p{p}", "rank": p, **r}
                   for r in st.curve(after, y["test"], u["test"], k, cfg.association_levels)]
        g1 = st.g_point(after, y["test"], u["test"], k)
        g1_draws = st.g_draws(after, y["test"], u["test"], k, base)
        util_draws = st.weighted_auroc(after[0], y["test"], base) - util0_draws
        u_lo, u_hi = pr.interval(util_draws)
        bases, errors = iv.matched_random_subspaces(energy, target, p, cfg.random_controls, rng)
        reductions = []
        for i, (q, err) in enumerate(zip(bases, errors, strict=True)):
            sc = removed(q)
            a_e, a_c = st.weighted_auroc(sc[0], y["test"], w_two), st.weighted_auroc(sc[1], y["test"], w_two)
            g_c = float((a_e[0] - a_e[1]) - (a_c[0] - a_c[1]))
            reductions.append(g0 - g_c)
            controls.append({"rank": p, "control": i, "g_after": g_c, "g_reduction": g0 - g_c,
                             "energy_rel_error": float(err)})
        rm = Removal(p, g0 - g1, float(np.max(reductions)), u_lo)
        removals.append(rm)
        gl, gh = pr.interval(g1_draws)
        rank_rows[p] = {f"g_after_p{p}": g1, f"g_after_p{p}_ci_low": gl, f"g_after_p{p}_ci_high": gh,
                        f"g_reduction_p{p}": rm.g_reduction, f"control_max_reduction_p{p}": rm.control_max_reduction,
                        f"removed_energy_p{p}": target,
                        f"utility_change_p{p}": st.auroc(after[0], y["test"]) - util0,
                        f"utility_change_p{p}_ci_low": u_lo, f"utility_change_p{p}_ci_high": u_hi}
    verdict, reason, rank = decide(g_lo, g_hi, removals, cfg.epsilon, cfg.delta)
    row = {"verdict": verdict, "reason": reason, "certified_rank": rank, "g": g0, "g_ci_low": g_lo,
           "g_ci_high": g_hi, "auroc_exposed": util0, "auroc_control": st.auroc(before[1], y["test"]),
           "lpi_bits": recover["lpi_bits"], **groups_note}
    for p in cfg.ranks:
        row.update(rank_rows.get(p, {}))
    return AuditResult(recover, stress, controls, row)
