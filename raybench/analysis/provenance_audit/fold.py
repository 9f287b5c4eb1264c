"""One fold of the audit (docs/protocol.md §12.2-12.5): every estimate the gates and the verdict read, each as a
point value and its patient-bootstrap draws, so folds combine by averaging both (PhysioTRACE Figure 4: means over
five patient-disjoint outer folds, each random control fold-averaged too).

Keys of `FoldStats.est`: lpi, cond_auroc, g, ctl_adv (AUC_ctl - AUC_exp reversed), exp_adv (AUC_exp - AUC_ctl
aligned), drop_exp and drop_ctl (each head's AUROC aligned - reversed), meta_auroc and g_meta (with metadata), and
per rank p g_after_p, reduction_p, util_p (control head, independent regime, after - before), nat_p (exposed head,
observed, after - before). With strata (gs: the stratum of each group), every step works within them (audit.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import logsumexp

from raybench.analysis.provenance_audit import gates as gt
from raybench.analysis.provenance_audit import intervene as iv
from raybench.analysis.provenance_audit import probes as pr
from raybench.analysis.provenance_audit import regimes as rg
from raybench.analysis.provenance_audit import stress as st
from raybench.core.config import ProvenanceConfig

Estimate = tuple[float, np.ndarray]  # (point, draws [B])


@dataclass
class FoldStats:
    est: dict[str, Estimate] = field(default_factory=dict)
    info: dict[str, float] = field(default_factory=dict)  # point-only descriptors (kappa, AUROCs, energies)
    curves: list[dict] = field(default_factory=list)
    controls: dict[int, list[dict]] = field(default_factory=dict)  # rank -> one row per control
    odds: dict[tuple[int, int], list[float]] = field(default_factory=dict)  # (group, reference) -> natural ORs


def _est(points: np.ndarray, draws: np.ndarray) -> Estimate:
    return float(np.asarray(points).ravel()[0]), np.asarray(draws, dtype=np.float64)


def meta_features(meta: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Standardize with train mean / std; a missing value becomes the train mean (0)."""
    tr = np.where(np.isfinite(meta["train"]), meta["train"], np.nan)
    with np.errstate(all="ignore"):
        mean, std = np.nanmean(tr, axis=0), np.nanstd(tr, axis=0)
    mean = np.where(np.isfinite(mean), mean, 0.0)
    std = np.where(np.isfinite(std) & (std > 1e-8), std, 1.0)
    return {s: np.where(np.isfinite(v), (v - mean) / std, 0.0) for s, v in meta.items()}


def within_strata(logp: np.ndarray, classes: np.ndarray, u: np.ndarray, gs: np.ndarray | None) -> np.ndarray:
    """A probe's log-probabilities renormalized over the groups of each record's own stratum (no strata: as is),
    so a within-site probe earns nothing for telling the sites apart."""
    if gs is None:
        return logp
    own = gs[np.asarray(classes)][None, :] == gs[np.asarray(u)][:, None]
    masked = np.where(own, logp, -np.inf)
    return masked - logsumexp(masked, axis=1, keepdims=True)


def stratum_prior(u_tr: np.ndarray, classes: np.ndarray, gs: np.ndarray | None) -> np.ndarray:
    """log P(group | its stratum) on train [K] (the prevalence-only predictor; no strata: log P(group))."""
    prior = pr.prior_log_proba(u_tr, classes)
    if gs is None:
        return prior
    st = gs[np.asarray(classes)]
    return prior - np.array([logsumexp(prior[st == s_]) for s_ in st])


def fold_stats(x: dict, u: dict, y: dict, pat: dict, meta: dict | None, k: int, cfg: ProvenanceConfig,
               rng: np.random.Generator, gs: np.ndarray | None = None) -> FoldStats:
    """Recover, Stress, Intervene and the controls on one train / val / test split (x standardized on train);
    gs: the stratum of each group (None: no strata)."""
    out = FoldStats()
    yt, ut = y["test"], u["test"]
    base = rg.cell_bootstrap(pat["test"], yt, ut, k, cfg.draws, rng)
    one = np.ones((1, len(yt)))
    # Recover
    probe = pr.calibrated_probe(x["train"], u["train"], x["val"], u["val"], cfg.c_grid)
    idx = pr.class_index(probe.classes, ut)
    prior = stratum_prior(u["train"], probe.classes, gs)
    logp = within_strata(probe.log_proba(x["test"]), probe.classes, ut, gs)
    terms = pr.lpi_terms(logp, prior, idx)
    out.est["lpi"] = _est(terms.mean(keepdims=True), base @ terms / base.sum(1))
    out.est["cond_auroc"] = _est(gt.conditional_auroc(logp, ut, yt, k, one, gs),
                                 gt.conditional_auroc(logp, ut, yt, k, base, gs))
    out.info.update(prior_bits=pr.entropy_bits(prior, idx), accuracy=float((logp.argmax(1) == idx).mean()),
                    c=probe.c, temperature=probe.temperature, n_train=len(u["train"]), n_test=len(ut),
                    test_patients=len(np.unique(np.asarray(pat["test"]).astype(str))))
    # Stress
    heads = st.fit_heads(x["train"], y["train"], u["train"], x["val"], y["val"], u["val"], k, cfg.c_grid, gs)
    before = heads.scores(x["test"])
    reg = st.Regimes.build(y["train"], u["train"], yt, ut, k, cfg.association_levels, gs)
    out.odds = {pair: [v] for pair, v in reg.odds.items()}
    out.curves = [{"stage": "before", "rank": 0, **r} for r in st.curve(before, yt, ut, reg, cfg.association_levels)]
    b_pt, b_b = st.stress_aurocs(before, yt, ut, reg), st.stress_aurocs(before, yt, ut, reg, base)
    out.est["g"] = _est(b_pt.g, b_b.g)
    out.est["ctl_adv"] = _est(b_pt.ctl_reversed - b_pt.exp_reversed, b_b.ctl_reversed - b_b.exp_reversed)
    out.est["exp_adv"] = _est(b_pt.exp_aligned - b_pt.ctl_aligned, b_b.exp_aligned - b_b.ctl_aligned)
    out.est["drop_exp"] = _est(b_pt.exp_aligned - b_pt.exp_reversed, b_b.exp_aligned - b_b.exp_reversed)
    out.est["drop_ctl"] = _est(b_pt.ctl_aligned - b_pt.ctl_reversed, b_b.ctl_aligned - b_b.ctl_reversed)
    out.info.update(auroc_exposed=float(b_pt.exp_observed[0]), auroc_control=float(b_pt.ctl_independent[0]),
                    auroc_exposed_aligned=float(b_pt.exp_aligned[0]),
                    auroc_exposed_reversed=float(b_pt.exp_reversed[0]),
                    auroc_control_aligned=float(b_pt.ctl_aligned[0]),
                    auroc_control_reversed=float(b_pt.ctl_reversed[0]))
    if meta is not None:
        _metadata(meta_features(meta), y, u, k, reg, base, cfg, out, gs)
    _intervene(x, y, u, k, heads, reg, base, (b_pt, b_b), probe.c, cfg, rng, out, gs)
    return out


def _metadata(mf: dict, y: dict, u: dict, k: int, reg: st.Regimes, base: np.ndarray, cfg: ProvenanceConfig,
              out: FoldStats, gs: np.ndarray | None) -> None:
    """The metadata-only comparator: its conditional device recoverability (gate 5) and the G of heads fitted on
    the metadata alone (PhysioTRACE Table 18's comparator, reported beside the embedding's)."""
    yt, ut = y["test"], u["test"]
    probe = pr.calibrated_probe(mf["train"], u["train"], mf["val"], u["val"], cfg.c_grid)
    logp = within_strata(probe.log_proba(mf["test"]), probe.classes, ut, gs)
    out.est["meta_auroc"] = _est(gt.conditional_auroc(logp, ut, yt, k, np.ones((1, len(yt))), gs),
                                 gt.conditional_auroc(logp, ut, yt, k, base, gs))
    heads = st.fit_heads(mf["train"], y["train"], u["train"], mf["val"], y["val"], u["val"], k, cfg.c_grid, gs)
    sc = heads.scores(mf["test"])
    out.est["g_meta"] = _est(st.stress_aurocs(sc, yt, ut, reg).g, st.stress_aurocs(sc, yt, ut, reg, base).g)


def _intervene(x: dict, y: dict, u: dict, k: int, heads: st.Heads, reg: st.Regimes, base: np.ndarray,
               b0: tuple[st.StressAUROCs, st.StressAUROCs], c: float, cfg: ProvenanceConfig,
               rng: np.random.Generator, out: FoldStats, gs: np.ndarray | None) -> None:
    """Every rank's removal and its matched random controls."""
    wh = iv.Whitener.fit(x["train"], y["train"])
    z_tr, z_te = wh(x["train"]), wh(x["test"])
    before = heads.scores(x["test"])
    # a head's score after removal: s(x') = s(x) - (z U)(U^T W^-1 w), no embedding rebuilt per control
    head_dirs = wh.w_inv @ np.hstack([heads.exposed.coef.T, heads.control.coef.T])  # [d, 2]

    def removed(basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        delta = (z_te @ basis) @ (basis.T @ head_dirs)
        return before[0] - delta[:, 0], before[1] - delta[:, 1]

    yt, ut = y["test"], u["test"]
    form = iv.RemovedVariance.fit(z_tr, y["train"], wh.w_inv)
    w_pt = np.vstack([reg.weights(yt, ut, 1.0), reg.weights(yt, ut, -1.0)])
    g0 = float(b0[0].g[0])
    # rank of the stacked within-cell probe weights: (groups - 1) per class of y (and stratum)
    cells = y["train"] if gs is None else y["train"] * (int(gs.max()) + 1) + gs[u["train"]]
    max_rank = sum(np.unique(u["train"][cells == c_]).size - 1 for c_ in np.unique(cells))
    for p in cfg.ranks:
        if p > min(max_rank, x["train"].shape[1]):
            continue
        basis = iv.provenance_subspace(z_tr, cells, u["train"], p, c)
        after = removed(basis)
        out.curves += [{"stage": f"removed_p{p}", "rank": p, **r} for r in st.curve(after, yt, ut, reg,
                                                                                     cfg.association_levels)]
        a_pt, a_b = st.stress_aurocs(after, yt, ut, reg), st.stress_aurocs(after, yt, ut, reg, base)
        out.est[f"g_after_p{p}"] = _est(a_pt.g, a_b.g)
        out.est[f"reduction_p{p}"] = _est(b0[0].g - a_pt.g, b0[1].g - a_b.g)
        out.est[f"util_p{p}"] = _est(a_pt.ctl_independent - b0[0].ctl_independent,
                                     a_b.ctl_independent - b0[1].ctl_independent)
        out.est[f"nat_p{p}"] = _est(a_pt.exp_observed - b0[0].exp_observed, a_b.exp_observed - b0[1].exp_observed)
        out.info[f"removed_variance_p{p}"] = form(basis)
        ctl = iv.matched_random_subspaces(form, basis, cfg.random_controls, rng)
        rows = []
        for i, q in enumerate(ctl.bases):
            sc = removed(q)
            a_e, a_c = st.weighted_auroc(sc[0], yt, w_pt), st.weighted_auroc(sc[1], yt, w_pt)
            g_c = float((a_e[0] - a_e[1]) - (a_c[0] - a_c[1]))
            rows.append({"rank": p, "control": i, "g_after": g_c, "g_reduction": g0 - g_c,
                         "removed_variance": float(ctl.variance[i]), "variance_rel_error": float(ctl.errors[i]),
                         "cos_u": float(ctl.cosines[i]), "orthogonal": bool(ctl.orthogonal[i])})
        out.controls[p] = rows


def combine(folds: list[FoldStats]) -> FoldStats:
    """Fold means: of every point and every draw (draw b of each fold averaged), of every control (control i of
    each fold averaged: the fold-averaged control), of the curves and the descriptors."""
    out = FoldStats()
    for key in folds[0].est:
        if all(key in f.est for f in folds):
            out.est[key] = (float(np.mean([f.est[key][0] for f in folds])),
                            np.mean([f.est[key][1] for f in folds], axis=0))
    for pair in folds[0].odds:
        out.odds[pair] = [v for f in folds for v in f.odds.get(pair, [])]
    for key in folds[0].info:
        vals = [f.info[key] for f in folds if key in f.info]
        out.info[key] = float(np.sum(vals)) if key.startswith(("n_", "test_patients")) else float(np.mean(vals))
    curve_keys = [(r["stage"], r["rank"], r["level"]) for r in folds[0].curves]
    by_key = [{(r["stage"], r["rank"], r["level"]): r for r in f.curves} for f in folds]
    for key, row in zip(curve_keys, folds[0].curves, strict=True):
        rows = [b[key] for b in by_key if key in b]
        out.curves.append({**row, **{c: float(np.mean([r[c] for r in rows]))
                                     for c in ("odds_ratio", "auroc_exposed", "auroc_control")}})
    for p, rows in folds[0].controls.items():
        per = [f.controls.get(p) for f in folds]
        if any(r is None or len(r) != len(rows) for r in per):
            continue
        out.controls[p] = [{"rank": p, "control": i, "folds": len(folds),
                            "g_after": float(np.mean([r[i]["g_after"] for r in per])),
                            "g_reduction": float(np.mean([r[i]["g_reduction"] for r in per])),
                            "removed_variance": float(np.mean([r[i]["removed_variance"] for r in per])),
                            "variance_rel_error": float(max(r[i]["variance_rel_error"] for r in per)),
                            "cos_u": float(max(r[i]["cos_u"] for r in per)),
                            "orthogonal": bool(all(r[i]["orthogonal"] for r in per))} for i in range(len(rows))]
    return out
