"""Intervention selectivity at the final layer: moving SAE coordinates vs dense coordinates to the same
validation-matched change of a concept readout, which one disturbs the other concepts less?

Per model (E = calibration expansion cells, every seed): linear readouts of all concepts are ridge fits on
the normalized dense train state (alpha per concept chosen on validation). Per concept, the top-k
train-ranked coordinates (dense; SAE among a fixed random candidate subset of d latents, one of R subsets)
are clamped to their centroid over the train records in the concept's top quartile; the change is mapped
to the dense state (identity / SAE decoder columns) and through the readouts. The dose of each arm is set
so the mean validation target change equals min(cap, each arm's full-clamp effect) (dose <= 1); a concept
whose full-clamp effect is not positive for both arms, or whose common effect is below the floor, fails the
gate in that design. On test: target change, cross-family off-target RMS, all off-target RMS, state L2 and
the wrong-behavior index WBI = off-target RMS / |target change|, averaged over eligible subsets and seeds.
Paired patient bootstrap of SAE - dense over the concepts eligible in every seed, BH across models per
metric. Ineligible concepts stay in the denominator of the selective-concept fraction.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.plotting import RC, model_label, save_figure
from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.estimators import (
    Matrix,
    bootstrap_counts,
    feature_concept_corr,
    gather_columns,
    rank_features,
    sae_codes,
)
from raybench.analysis.secondary.matched_effect import (
    RECORD_METRICS,
    UnitIntervention,
    centroid_intervention,
    common_effect,
    record_metrics,
    wrong_behavior_index,
)
from raybench.analysis.secondary.ridge import ridge_readout
from raybench.cohorts.panel import concept_families
from raybench.config import EvalProtocol, Protocol
from raybench.sufficient_stats import per_patient_sums

log = logging.getLogger(__name__)

METHODS = ("dense", "sae")
INFERENCE_METRICS = ("off_cross_rms", "wbi_cross", "off_all_rms", "activation_l2")


def candidate_subsets(n_latents: int, budget: int, count: int, seed: int) -> list[np.ndarray]:
    """Fixed, target-independent candidate subsets of the SAE latents (budget = d matches the dense basis)."""
    if budget >= n_latents:
        return [np.arange(n_latents)] * count
    return [np.sort(np.random.default_rng(seed + r).choice(n_latents, size=budget, replace=False))
            for r in range(count)]


def _unit(train: Matrix, val: Matrix, test: Matrix, y_col: np.ndarray, basis: np.ndarray, coef: np.ndarray,
          cols: np.ndarray, q: float) -> UnitIntervention:
    return centroid_intervention(gather_columns(train, cols), y_col, gather_columns(val, cols),
                                 gather_columns(test, cols), basis[cols], coef, cols, q)


def intervene_model(root: str | Path, eval_cfg: EvalProtocol, scfg: SecondaryConfig, model: str, layer: int,
                    cells: list[tuple[int, str]], counts: np.ndarray, ci: tuple[float, float]
                    ) -> dict[str, pd.DataFrame]:
    """All designs of one model (seeds x candidate subsets x concepts) and its paired bootstrap."""
    import torch

    from raybench.analysis.stats import paired_p
    from raybench.sae.cell_files import load_cell_sae
    from raybench.sae.data import load_secondary_data

    torch.set_num_threads(1)
    data = load_secondary_data(root, model, layer, eval_cfg, scfg.complete_case_train)
    names = data.concept_names
    fams = concept_families(names)
    c_n = len(names)
    if len(set(fams)) < 2:
        raise ValueError(f"{model}: intervention selectivity needs concepts of at least two families, got {set(fams)}")
    _, norm = load_cell_sae(cells[0][1])
    x = {s: norm.apply(data.acts[s]).astype(np.float64) for s in ("train", "val", "test")}
    y = {s: data.concepts[s].astype(np.float64) for s in ("train", "val", "test")}
    sel = data.selection_idx
    readout = ridge_readout(x["train"], y["train"], x["val"], y["val"], scfg.readout_alphas)
    k, d = scfg.intervention_k, x["train"].shape[1]
    p_n = len(data.test_patients)
    codes = data.test_patient_codes
    n_per_patient = np.bincount(codes, minlength=p_n).astype(np.float64)

    dense_rank = rank_features(feature_concept_corr(x["train"][sel], y["train"][sel]))[:k]
    eye = np.eye(d)
    dense_units = [_unit(x["train"], x["val"], x["test"], y["train"][:, c], eye, readout.coef, dense_rank[:, c],
                         scfg.high_quantile) for c in range(c_n)]
    dense_base = [per_patient_sums(codes, p_n, record_metrics(u, c, fams, 1.0)) for c, u in enumerate(dense_units)]
    seeds = [s for s, _ in cells]
    sums = np.zeros((len(seeds), 2, c_n, p_n, len(RECORD_METRICS)))
    n_ok = np.zeros((len(seeds), c_n), dtype=np.int64)
    effect = np.zeros((len(seeds), c_n))
    design_rows = []
    for si, (seed, cell_dir) in enumerate(cells):
        sae, nrm = load_cell_sae(cell_dir)
        # column access (the clamped coordinates) is what the designs below do most: CSC
        z = {s: sae_codes(sae, nrm, data.acts[s], eval_cfg.eval_batch).tocsc() for s in ("train", "val", "test")}
        z_sel = sae_codes(sae, nrm, data.acts["train"][sel], eval_cfg.eval_batch)
        corr = feature_concept_corr(z_sel, y["train"][sel])
        basis = sae.W_dec_t[0].detach().cpu().numpy().astype(np.float64)  # [N, d]: decoder column j as row j
        for r, cand in enumerate(candidate_subsets(sae.n_latents, d, scfg.candidate_subsets, scfg.subset_seed)):
            ranking = rank_features(corr, cand)[:k]
            for c in range(c_n):
                unit = _unit(z["train"], z["val"], z["test"], y["train"][:, c], basis, readout.coef, ranking[:, c],
                             scfg.high_quantile)
                eff = {"dense": dense_units[c].val_effect(c), "sae": unit.val_effect(c)}
                common, status = common_effect(eff, scfg.effect_cap, scfg.effect_floor, scfg.max_dose)
                row = {"model": model, "seed": seed, "subset": r, "concept": names[c], "family": fams[c],
                       "status": status, "common_effect": common, "dense_unit_effect": eff["dense"],
                       "sae_unit_effect": eff["sae"], "dense_dose": np.nan, "sae_dose": np.nan}
                if status == "eligible":
                    dose = {m: common / eff[m] for m in METHODS}
                    row.update(dense_dose=dose["dense"], sae_dose=dose["sae"])
                    sums[si, 0, c] += dose["dense"] * dense_base[c]
                    sums[si, 1, c] += per_patient_sums(codes, p_n, record_metrics(unit, c, fams, dose["sae"]))
                    n_ok[si, c] += 1
                    effect[si, c] += common
                design_rows.append(row)
    seed_ok = n_ok > 0  # [S, C]
    per_seed = np.where(seed_ok[:, None, :, None, None], sums / np.maximum(n_ok, 1)[:, None, :, None, None], 0.0)
    n_seeds_ok = seed_ok.sum(axis=0)  # [C]
    avg = per_seed.sum(axis=0) / np.maximum(n_seeds_ok, 1)[None, :, None, None]  # [2, C, P, 4]
    matched = np.where(n_seeds_ok > 0, (effect / np.maximum(n_ok, 1)).sum(axis=0) / np.maximum(n_seeds_ok, 1),
                       np.nan)
    primary = n_seeds_ok == len(seeds)

    def means(w: np.ndarray) -> np.ndarray:
        """Record-weighted means [D, 2, C, 4] under patient weights w [D, P]."""
        num = np.einsum("dp,mcpk->dmck", w, avg)
        return num / (w @ n_per_patient)[:, None, None, None]

    point = means(np.ones((1, p_n)))[0]  # [2, C, 4]
    draws = means(np.asarray(counts, dtype=np.float64))
    concept_rows = []
    for mi, method in enumerate(METHODS):
        for c in range(c_n):
            t, cross, allr, l2 = point[mi, c]
            concept_rows.append({"model": model, "concept": names[c], "family": fams[c], "method": method,
                                 "seeds_eligible": int(n_seeds_ok[c]), "primary_eligible": bool(primary[c]),
                                 "matched_effect": matched[c], "target_delta": t if n_seeds_ok[c] else np.nan,
                                 "off_cross_rms": cross if n_seeds_ok[c] else np.nan,
                                 "off_all_rms": allr if n_seeds_ok[c] else np.nan,
                                 "activation_l2": l2 if n_seeds_ok[c] else np.nan,
                                 "wbi_cross": float(wrong_behavior_index(t, cross)) if n_seeds_ok[c] else np.nan})
    concepts = pd.DataFrame(concept_rows)
    wbi_point = wrong_behavior_index(point[:, :, 0], point[:, :, 1])  # [2, C]
    selective = primary & (wbi_point[1] < wbi_point[0])
    summary_rows = []
    for mi, method in enumerate(METHODS):
        pm = point[mi, primary]
        summary_rows.append({
            "model": model, "method": method, "concepts_total": c_n, "concepts_eligible": int(primary.sum()),
            "concepts_any_seed": int((n_seeds_ok > 0).sum()),
            "design_rows": len(design_rows), "eligible_designs": int(n_ok.sum()),
            "target_delta": float(pm[:, 0].mean()) if len(pm) else np.nan,
            "target_retention": float((pm[:, 0] / matched[primary]).mean()) if len(pm) else np.nan,
            "off_cross_rms": float(pm[:, 1].mean()) if len(pm) else np.nan,
            "off_all_rms": float(pm[:, 2].mean()) if len(pm) else np.nan,
            "activation_l2": float(pm[:, 3].mean()) if len(pm) else np.nan,
            "wbi_cross": float(wbi_point[mi, primary].mean()) if len(pm) else np.nan,
            "sae_selective_concepts": int(selective.sum()),
            "sae_selective_fraction": float(selective.sum() / c_n),
        })
    contrast_rows = []
    metric_index = {m: i for i, m in enumerate(RECORD_METRICS)}
    for metric in INFERENCE_METRICS:
        if not primary.any():
            obs, diff = np.nan, np.full(draws.shape[0], np.nan)
        elif metric == "wbi_cross":
            obs = float((wbi_point[1, primary] - wbi_point[0, primary]).mean())
            wd = wrong_behavior_index(draws[:, :, :, 0], draws[:, :, :, 1])  # [D, 2, C]
            diff = (wd[:, 1, primary] - wd[:, 0, primary]).mean(axis=1)
        else:
            j = metric_index[metric]
            obs = float((point[1, primary, j] - point[0, primary, j]).mean())
            diff = (draws[:, 1, primary, j] - draws[:, 0, primary, j]).mean(axis=1)
        finite = diff[np.isfinite(diff)]
        contrast_rows.append({"model": model, "comparison": "sae_minus_dense", "metric": metric,
                              "concepts_paired": int(primary.sum()), "delta": obs,
                              "ci_low": float(np.percentile(finite, ci[0])) if finite.size else np.nan,
                              "ci_high": float(np.percentile(finite, ci[1])) if finite.size else np.nan,
                              "p_value": paired_p(finite) if finite.size else np.nan,
                              "n_draws": int(finite.size)})
    return {"intervention": pd.DataFrame(summary_rows), "intervention_contrasts": pd.DataFrame(contrast_rows),
            "intervention_concepts": concepts, "intervention_designs": pd.DataFrame(design_rows)}


def run_intervention(root: str | Path, protocol: Protocol, scfg: SecondaryConfig, cohort: str
                     ) -> dict[str, pd.DataFrame]:
    """One Ray task per model at its final layer; BH across models per metric; tables + figure.
    cohort: cfg.cohort.kind (the published MIMIC run's bootstrap had its own seed)."""
    import ray

    from raybench.analysis.secondary import calibration_cells
    from raybench.analysis.stats import benjamini_hochberg
    from raybench.atomic import write_table
    from raybench.paths import RunLayout
    from raybench.sae.data import evaluation_test_patients

    layout = RunLayout.at(root)
    cells = calibration_cells(root, protocol)
    cells = cells[cells["layer"] == cells["n_layers"] - 1]
    if cells.empty:
        log.warning("intervention skipped: no ok primary final-layer cells at E=%d",
                    protocol.eval.calibration_expansion)
        return {}
    from raybench.cohorts.manifest import load_manifest

    manifest, info = load_manifest(layout.manifest)  # test patients as load_cell_data has them (missing concepts)
    counts = ray.put(bootstrap_counts(len(evaluation_test_patients(manifest, info, protocol.eval)),
                                      scfg.draws(protocol), scfg.intervention_bootstrap_seed(protocol, cohort),
                                      protocol.inference.chunk_draws, protocol.inference.stream))
    task = ray.remote(num_cpus=1)(intervene_model)
    ci = (protocol.inference.ci_low, protocol.inference.ci_high)
    refs = []
    for (model, layer), sub in cells.groupby(["model", "layer"], sort=True):
        units = [(int(s), d) for s, d in zip(sub["seed"], sub["cell_dir"], strict=True)]
        refs.append(task.remote(str(layout.root), protocol.eval, scfg, model, int(layer), units, counts, ci))
    parts = ray.get(refs)
    tables = {name: pd.concat([p[name] for p in parts], ignore_index=True) for name in parts[0]}
    con = tables["intervention_contrasts"]
    con["q_value_bh"] = np.nan
    for _, idx in con.groupby("metric").groups.items():
        con.loc[idx, "q_value_bh"] = benjamini_hochberg(con.loc[idx, "p_value"].to_numpy())
    for name, df in tables.items():
        write_table(layout.tables_dir / f"{name}.parquet", df)
    _figure(tables, layout.figures_dir)
    return tables


def _figure(tables: dict[str, pd.DataFrame], out: Path) -> None:
    import matplotlib
    from matplotlib.figure import Figure

    con = tables["intervention_contrasts"]
    summary = tables["intervention"]
    models = sorted(summary["model"].unique())
    y = np.arange(len(models))
    with matplotlib.rc_context(RC):
        fig = Figure(figsize=(9.0, 0.45 * len(models) + 2.2), layout="constrained")
        axes = fig.subplots(1, 3)
        for ax, metric, title in ((axes[0], "off_cross_rms", "Δ off-target RMS"), (axes[1], "wbi_cross", "Δ WBI")):
            rows = con[con["metric"] == metric].set_index("model").reindex(models)
            v = rows["delta"].to_numpy(dtype=float)
            lo, hi = rows["ci_low"].to_numpy(dtype=float), rows["ci_high"].to_numpy(dtype=float)
            ax.errorbar(v, y, xerr=[np.abs(v - lo), np.abs(hi - v)], fmt="o", color="#E45756", capsize=3)
            ax.axvline(0, color="0.3", lw=0.8, ls="--")
            ax.set_title(title)
            ax.set_xlabel("SAE − dense")
            ax.set_yticks(y, [model_label(m) for m in models])
            ax.invert_yaxis()
        wide = summary.pivot_table(index="model", columns="method", values="concepts_eligible").reindex(models)
        sel = summary[summary["method"] == "sae"].set_index("model").reindex(models)
        total = sel["concepts_total"].to_numpy(dtype=float)
        axes[2].barh(y, wide["sae"].to_numpy(dtype=float) / total, color="#9ecae1", label="eligible")
        axes[2].barh(y, sel["sae_selective_fraction"].to_numpy(dtype=float), color="#3182bd",
                     label="SAE more selective")
        axes[2].set_xlim(0, 1)
        axes[2].set_yticks(y, [model_label(m) for m in models])
        axes[2].invert_yaxis()
        axes[2].set_xlabel("Fraction of all concepts")
        axes[2].set_title("Gate and selectivity")
        axes[2].legend(fontsize=7, frameon=False)
        save_figure(fig, out, "intervention_selectivity")
