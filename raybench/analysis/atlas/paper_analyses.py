"""Analyses the paper reports beyond the base tables, as pure functions of arrays and small frames.

Each follows the protocol's published analysis scripts (JayDuan123/2027-kdd-ECG-InterpBench):
- fidelity gate on seed means per model x depth x E (scripts/audit_multiscale_sae.py: validation R^2 mean
  >= .90 and validation dead-fraction mean < .20), with raybench's per-cell count kept beside it;
- crossed-bootstrap pairwise model contrasts with BH within each metric
  (scripts/analyze_multiscale_sae_inference.py);
- sparsity arms at the sensitivity depth: Kendall tau between the arms' model orders per E, and the
  paired-seed bootstrap of arm differences per cell and per common-scale AUC, BH within each metric
  (scripts/analyze_multiscale_sae_sparsity_sensitivity.py);
- common-scale AUC of seed reproducibility (matched cosine above floor, subspace overlap;
  scripts/analyze_multiscale_sae_stability.py) with a crossed bootstrap over depth units x seed pairs;
- dead-fraction profile across E, its common-scale AUC and the Kendall tau of model orders between E pairs.
Kendall tau follows the published code (stats.rank_tau): the models, listed in the published MODEL_ORDER
(raybench.core.protocol.analysis_order), are sorted by the seed/depth mean into ranks and scipy.stats.kendalltau
compares the two rank vectors - sorted as each script sorts: Python's sorted() for the arms (ties keep MODEL_ORDER),
pandas' sort_values for the scale rank stability (ties as numpy's default sort leaves them). Pairwise contrasts
are (left, right) in MODEL_ORDER (docs/protocol.md §8.8).
`paper_run.py` wires these into `analyze_run`; the Ray bootstraps there call raybench.analysis.inference.bootstrap.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Sequence

import numpy as np
import pandas as pd

from raybench.analysis.completeness import DENOM_COLUMNS, counts, finish
from raybench.analysis.inference import stats as st
from raybench.analysis.inference.metrics import trapezoid_auc
from raybench.analysis.published import model_values

D = DENOM_COLUMNS
PAPER_COLUMNS: dict[str, list[str]] = {
    "fidelity_gate": ["arm", "model", "q", "expansion", "val_r2_mean", "val_dead_fraction_mean", "gate_pass",
                      "n_cells_pass", *D],
    "fidelity_gate_models": ["arm", "model", "n_configs", "n_configs_pass", "pass_fraction", "n_cells_pass",
                             "cell_pass_fraction", *D],
    "crossed_contrasts": ["metric", "model_a", "model_b", "diff", "ci_low", "ci_high", "p", "p_bh", *D],
    "arm_rank_agreement": ["metric", "expansion", "kendall_tau", "p_value", "primary_order", "sensitivity_order",
                           "n_models", *D],
    "arm_differences": ["metric", "model", "expansion", "diff", "ci_low", "ci_high", "p", "p_bh", "n_pairs", *D],
    "arm_auc_differences": ["metric", "model", "primary_auc", "sensitivity_auc", "diff", "ci_low", "ci_high", "p",
                            "p_bh", "n_pairs", *D],
    "reproducibility_pairs": ["model", "q", "expansion", "seed_a", "seed_b", "matched_cosine", "random_floor",
                              "excess", "subspace_overlap", *D],
    "reproducibility_auc": ["model", "measure", "auc", "ci_low", "ci_high", "rank1_prob", "published", *D],
    "dead_fraction": ["model", "expansion", "split", "value", *D],
    "dead_fraction_auc": ["model", "split", "auc", "ci_low", "ci_high", *D],
    "dead_fraction_rank_stability": ["split", "expansion_a", "expansion_b", "kendall_tau", "p_value", "order_a",
                                     "order_b", "n_models", *D],
}
# PTB-XL matched cosine above floor and subspace overlap AUCs (the protocol's generated paper facts), read from
# the package's paper_values.csv (raybench.analysis.published), their one owner
PUBLISHED_REPRODUCIBILITY: dict[str, dict[str, float]] = model_values("paper_facts", "auc")
REPRO_MEASURES = ("excess", "subspace_overlap")


# ---------------------------------------------------------------- helpers


def _nanmean(x: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=axis)


def auc_units(frame: pd.DataFrame, models: Sequence[str], depths: Sequence[float], units: Sequence,
              expansions: Sequence[int], unit_col: str = "seed") -> np.ndarray:
    """Common-scale AUC of `value` per (model, depth, unit) -> [M, D, U]; NaN where any E is missing.

    frame: columns model, q, expansion, `unit_col`, value (one row per cell or seed pair).
    """
    es = sorted(int(e) for e in expansions)
    mi, di, ui = ({v: i for i, v in enumerate(x)} for x in (models, depths, units))
    out = np.full((len(models), len(depths), len(units)), np.nan)
    for (m, q, u), sub in frame.groupby(["model", "q", unit_col], sort=True):
        sub = sub.sort_values("expansion")
        if m in mi and q in di and u in ui and [int(e) for e in sub.expansion] == es:
            out[mi[m], di[q], ui[u]] = float(trapezoid_auc(sub.value.to_numpy(np.float64), es))
    return out


def pairwise_contrasts(metric: str, models: Sequence[str], point: np.ndarray, draws: np.ndarray, lo: float,
                       hi: float) -> pd.DataFrame:
    """All model pairs (stats.contrast_pairs: the published orientation) with percentile CI, bootstrap p and BH within
    the metric."""
    rows = []
    for a, b in st.contrast_pairs(models):
        diff = draws[:, a] - draws[:, b]
        dlo, dhi = st.percentile_ci(diff, lo, hi)
        rows.append((metric, models[a], models[b], float(point[a] - point[b]), float(dlo), float(dhi),
                     st.paired_p(diff)))
    df = pd.DataFrame(rows, columns=["metric", "model_a", "model_b", "diff", "ci_low", "ci_high", "p"])
    df["p_bh"] = st.benjamini_hochberg(df.p.to_numpy()) if len(df) else []
    return df


def scale_rank_stability(curve: pd.DataFrame, models: Sequence[str], higher_better: bool) -> pd.DataFrame:
    """Kendall tau of the model orders between every pair of E (curve: model, expansion, value), ranked as the
    published inference script ranks its scale rank stability (stats.rank_tau, sort="pandas")."""
    by_e = {int(e): dict(zip(g.model, g.value, strict=True)) for e, g in curve.groupby("expansion", sort=True)}
    rows = []
    for ea, eb in itertools.combinations(sorted(by_e), 2):
        tau, p, oa, ob, n = st.rank_tau(by_e[ea], by_e[eb], models, higher_better, sort="pandas")
        rows.append({"expansion_a": ea, "expansion_b": eb, "kendall_tau": tau, "p_value": p, "order_a": oa,
                     "order_b": ob, "n_models": n})
    return pd.DataFrame(rows, columns=["expansion_a", "expansion_b", "kendall_tau", "p_value", "order_a", "order_b",
                                       "n_models"])


# ---------------------------------------------------------------- fidelity gate


def fidelity_gate(ok: pd.DataFrame, grid: pd.DataFrame, gate_r2: float,
                  gate_dead: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The published gate on seed means per (arm, model, depth, E), and per-model pass fractions.

    ok: ok cells with arm, model, q, expansion, seed, val_r2, val_dead_fraction; grid: completeness.grid_frame.
    A configuration with no ok seed does not pass; fractions use the protocol's fixed denominators
    (every configuration / every expected cell). `n_cells_pass` is the per-cell count (raybench's former gate).
    """
    keys = ["arm", "model", "q", "expansion"]
    v = ok[[*keys, "val_r2", "val_dead_fraction"]].astype({"val_r2": float, "val_dead_fraction": float})
    v = v.assign(cell_pass=(v.val_r2 >= gate_r2) & (v.val_dead_fraction < gate_dead))
    agg = v.groupby(keys, sort=True).agg(val_r2_mean=("val_r2", "mean"),
                                         val_dead_fraction_mean=("val_dead_fraction", "mean"),
                                         n_cells_pass=("cell_pass", "sum")).reset_index()
    gate = counts(grid, keys).merge(agg, on=keys, how="left")
    gate["n_cells_pass"] = gate["n_cells_pass"].fillna(0).astype(int)
    gate["gate_pass"] = ((gate.val_r2_mean >= gate_r2) & (gate.val_dead_fraction_mean < gate_dead)).astype(bool)
    arm_rank = {"primary": 0, "sensitivity": 1}
    gate = gate.sort_values(keys, key=lambda c: c.map(arm_rank) if c.name == "arm" else c, kind="stable")
    gate = finish(gate)
    models = gate.groupby(["arm", "model"], sort=False).agg(
        n_configs=("gate_pass", "size"), n_configs_pass=("gate_pass", "sum"), n_cells_pass=("n_cells_pass", "sum"),
        n_expected=("n_expected", "sum"), n_present=("n_present", "sum")).reset_index()
    models["pass_fraction"] = models.n_configs_pass / models.n_configs
    models["cell_pass_fraction"] = models.n_cells_pass / models.n_expected
    return gate.reset_index(drop=True), finish(models)


# ---------------------------------------------------------------- sparsity arms


def paired_seed_draws(seed: int, n_draws: int, n_seeds: int) -> np.ndarray:
    """Seed indices [draws, S] of the paired-seed arm bootstrap (the published generator call)."""
    return np.random.default_rng(seed).integers(0, n_seeds, size=(n_draws, n_seeds))


def _paired(diff: np.ndarray, draws: np.ndarray, lo: float, hi: float) -> tuple[float, float, float, float, int]:
    """Observed mean paired difference, percentile CI, bootstrap p and the number of pairs (NaN = unpaired seed)."""
    boot = _nanmean(diff[draws], axis=1)
    obs = float(_nanmean(diff, axis=0)) if np.isfinite(diff).any() else float("nan")
    clo, chi = st.percentile_ci(boot, lo, hi) if np.isfinite(boot).any() else (np.nan, np.nan)
    return obs, float(clo), float(chi), st.paired_p(boot), int(np.isfinite(diff).sum())


def arm_tables(frame: pd.DataFrame, metrics: dict[str, bool], models: Sequence[str], expansions: Sequence[int],
               seeds: Sequence[int], draws: np.ndarray, lo: float, hi: float) -> dict[str, pd.DataFrame]:
    """Fixed k/d (primary) vs fixed k/N (sensitivity) at one depth.

    frame: columns arm, model, expansion, seed and one column per metric (ok cells of both arms at that depth);
    metrics: name -> higher is better. draws: paired_seed_draws (indices into `seeds`).
    """
    es = sorted(int(e) for e in expansions)
    cube = {}  # (arm, metric) -> [M, E, S]
    mi, ei, si = ({v: i for i, v in enumerate(x)} for x in (models, es, seeds))
    for arm in ("primary", "sensitivity"):
        sub = frame[frame.arm == arm]
        for metric in metrics:
            c = np.full((len(models), len(es), len(seeds)), np.nan)
            for m, e, s, v in zip(sub.model, sub.expansion, sub.seed, sub[metric], strict=True):
                if m in mi and int(e) in ei and int(s) in si:
                    c[mi[m], ei[int(e)], si[int(s)]] = float(v)
            cube[arm, metric] = c
    ranks, cells, aucs = [], [], []
    for metric, higher in metrics.items():
        p, s = cube["primary", metric], cube["sensitivity", metric]
        pm, sm = _nanmean(p, axis=2), _nanmean(s, axis=2)  # seed means [M, E]
        part = []
        for j, e in enumerate(es):
            tau, pv, oa, ob, n = st.rank_tau(dict(zip(models, pm[:, j], strict=True)),
                                             dict(zip(models, sm[:, j], strict=True)), models, higher, sort="stable")
            ranks.append((metric, e, tau, pv, oa, ob, n))
            part += [(metric, m, e, *_paired(s[i, j] - p[i, j], draws, lo, hi)) for i, m in enumerate(models)]
        cells += _bh(part, 6)
        pa, sa = trapezoid_auc(p, es, axis=1), trapezoid_auc(s, es, axis=1)  # [M, S]; NaN where a seed misses an E
        part = []
        for i, m in enumerate(models):
            obs, clo, chi, pv, n = _paired(sa[i] - pa[i], draws, lo, hi)
            part.append((metric, m, float(_nanmean(pa[i], 0)), float(_nanmean(sa[i], 0)), obs, clo, chi, pv, n))
        aucs += _bh(part, 7)
    c = PAPER_COLUMNS
    return {"arm_rank_agreement": pd.DataFrame(ranks, columns=c["arm_rank_agreement"][:7]),
            "arm_differences": pd.DataFrame(cells, columns=c["arm_differences"][:9]),
            "arm_auc_differences": pd.DataFrame(aucs, columns=c["arm_auc_differences"][:10])}


def _bh(rows: list[tuple], p_at: int) -> list[tuple]:
    """Insert the BH-adjusted p right after the p-value at index p_at (one family: these rows)."""
    adj = st.benjamini_hochberg([r[p_at] for r in rows]) if rows else []
    return [(*r[:p_at + 1], float(q), *r[p_at + 1:]) for r, q in zip(rows, adj, strict=True)]


# ---------------------------------------------------------------- crossed summaries


def crossed_auc_rows(models: Sequence[str], point: np.ndarray, draws: np.ndarray, lo: float,
                     hi: float) -> list[tuple[str, float, float, float, float]]:
    """(model, auc, ci_low, ci_high, rank1_prob) per model from crossed draws [n, M]; none without models."""
    if not len(models):
        return []
    clo, chi = st.percentile_ci(draws, lo, hi)
    r1 = st.rank1_prob(draws) if len(models) > 1 else np.ones(len(models))
    return [(m, float(point[i]), float(clo[i]), float(chi[i]), float(r1[i])) for i, m in enumerate(models)]


def dead_fraction_curve(frame: pd.DataFrame, split: str) -> pd.DataFrame:
    """model, expansion, split, value: mean over depths of the seed mean (frame: primary ok cells, `value`)."""
    seedavg = frame.groupby(["model", "q", "expansion"], sort=True)["value"].mean().reset_index()
    curve = seedavg.groupby(["model", "expansion"], sort=True)["value"].mean().reset_index()
    return curve.assign(split=split)[["model", "expansion", "split", "value"]]


def seed_pairs(seeds: Sequence[int]) -> list[tuple[int, int]]:
    return list(itertools.combinations(sorted(int(s) for s in seeds), 2))
