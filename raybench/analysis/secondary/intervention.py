"""Intervention selectivity at the final layer: moving SAE coordinates vs dense (and PCA, random-rotation)
coordinates to the same validation-matched change of a concept readout, which one disturbs the other
concepts less? (docs/protocol.md §9.4, the published scripts/run_final_layer_matched_effect_worker.py design)

Per model (E = calibration expansion cells, every seed): linear readouts of all concepts are ridge fits on
the normalized dense train state (alpha per concept chosen on validation). Per concept and k, the top-k
train-ranked coordinates of each method (dense; PCA of the train state; a random rotation; SAE among a
candidate arm: `matched`, one of R random subsets of d latents, or `full`, every latent) are clamped to
their centroid over the train records in the concept's top quartile; the change is mapped to the dense
state (identity / components / rotation / SAE decoder columns) and through the readouts. The common effect
is min(cap, each of dense, PCA and SAE's full-clamp effect); each method's dose matches it (the random
rotation is left out of a design where it would need a dose above max_dose); a design whose dense, PCA or
SAE effect is not positive, or whose common effect is below the floor, fails the gate. On test: target
change, cross-family and all off-target RMS, state L2 and the wrong-behavior index WBI = off-target RMS /
|target change|, averaged over eligible subsets and then seeds. Paired patient bootstrap of SAE minus each
other method over the concepts eligible in every seed, BH per metric over every model x arm x k x
comparison (intervention_stats.py). Ineligible concepts stay in the denominator of the selective fraction.
On MIMIC-IV-ECG the published MIMIC workers' design runs instead (docs/protocol.md §9.4.1; intervention_design.py):
dense vs SAE at k = 5 over every record with NaN-masked labels, subsets from 976000, an SAE quality gate per seed.
Rotation seeds: rotation_seeds (the final layer's group index among the E = 8 groups, as published).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.analysis.secondary import SecondaryConfig
from raybench.analysis.secondary.estimators import (
    Matrix,
    bootstrap_counts,
    feature_concept_corr,
    gather_columns,
    rank_features,
    sae_codes,
)
from raybench.analysis.secondary.intervention_design import (
    candidate_pool,
    masked_corr,
    masked_ridge_readout,
    pool_subsets,
    quality_pass,
)
from raybench.analysis.secondary.intervention_stats import (
    OUTPUT_METRICS,
    bh_family,
    observed_and_draws,
    paired_contrasts,
    seed_average,
)
from raybench.analysis.secondary.matched_effect import (
    RECORD_METRICS,
    UnitIntervention,
    centroid_intervention,
    common_effect,
    record_metrics,
)
from raybench.analysis.secondary.ridge import ridge_readout
from raybench.cohorts.panel import concept_families
from raybench.core.config import EvalProtocol, Protocol
from raybench.core.protocol import analysis_order, layer_for_depth
from raybench.core.sufficient_stats import per_patient_sums
from raybench.sae.data import CellData

log = logging.getLogger(__name__)

METHODS = ("dense", "pca", "sae", "random_rotation")  # the published order of the method axis
COMMON_METHODS = ("dense", "pca", "sae")  # the methods whose effects set the common effect (published)
ARMS = ("matched", "full")  # SAE candidates: a random subset of d latents (one of R), or every latent
COMPARISONS = (("sae", "dense"), ("sae", "pca"), ("sae", "random_rotation"))


def candidate_subsets(n_latents: int, budget: int, count: int, seed: int) -> list[np.ndarray]:
    """Fixed, target-independent candidate subsets of the SAE latents (budget = d matches the dense basis)."""
    if budget >= n_latents:
        return [np.arange(n_latents)] * count
    return [np.sort(np.random.default_rng(seed + r).choice(n_latents, size=budget, replace=False))
            for r in range(count)]


def pca_basis(x_train: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean [d], components [p, d]) of the normalized train state: coordinates (x - mean) @ components.T."""
    mean = x_train.mean(axis=0)
    _, _, vt = np.linalg.svd(x_train - mean, full_matrices=False)
    return mean, vt


def rotation_seeds(base: int, n_layers: Mapping[str, int], depths: Sequence[float]) -> dict[str, int]:
    """{model: seed of its random rotation}: base + the index of the model's final-layer group among every
    E = 8 (model, layer) group of the grid, models in analysis_order, each model's distinct layers at the
    grid depths in depth order (the published manifest's task order: scripts/run_final_layer_matched_effect_worker.py
    seeds with --random-seed + the group's index, so the six final layers get 20260724, 20260729, ..., 20260749;
    docs/protocol.md §9.4). A model whose final layer is not audited gets the index after its last group."""
    out, index = {}, 0
    for model in analysis_order(n_layers):
        layers = list(dict.fromkeys(layer_for_depth(q, n_layers[model]) for q in depths))
        final = n_layers[model] - 1
        out[model] = base + index + (layers.index(final) if final in layers else len(layers))
        index += len(layers)
    return out


def random_rotation(d: int, seed: int) -> np.ndarray:
    """A random orthogonal [d, d] (QR of a Gaussian matrix, the published construction): coordinates x @ Q."""
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q


def baseline_representations(x: dict[str, np.ndarray], methods: tuple[str, ...], rotation_seed: int
                             ) -> dict[str, tuple[dict[str, np.ndarray], np.ndarray]]:
    """{method: ({split: coordinates}, basis rows [p, d] mapping a coordinate change to the dense state)}."""
    out = {"dense": (x, np.eye(x["train"].shape[1]))}
    if "pca" in methods:
        mean, comp = pca_basis(x["train"])
        out["pca"] = ({s: (v - mean) @ comp.T for s, v in x.items()}, comp)
    if "random_rotation" in methods:
        q = random_rotation(x["train"].shape[1], rotation_seed)
        out["random_rotation"] = ({s: v @ q for s, v in x.items()}, q.T)
    return {m: out[m] for m in methods if m != "sae"}


def _unit(train: Matrix, val: Matrix, test: Matrix, y_col: np.ndarray, basis: np.ndarray, coef: np.ndarray,
          cols: np.ndarray, q: float) -> UnitIntervention:
    return centroid_intervention(gather_columns(train, cols), y_col, gather_columns(val, cols),
                                 gather_columns(test, cols), basis[cols], coef, cols, q)


def _dose(method: str, common: float, effect: float, max_dose: float) -> float | None:
    """The method's dose at the common effect, None where it cannot reach it (only outside COMMON_METHODS)."""
    if not np.isfinite(effect) or effect <= 0:
        return None
    dose = common / effect
    return None if method not in COMMON_METHODS and dose > max_dose + 1e-10 else dose


def masked_data(root: str | Path, model: str, layer: int, eval_cfg: EvalProtocol) -> CellData:
    """The MIMIC design's inputs (§9.4.1): every record of each split, missing concept values as NaN."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.core.paths import RunLayout
    from raybench.sae.data import concept_present, load_cell_data

    data = load_cell_data(root, model, layer, replace(eval_cfg, missing_concepts="fill_zero"))
    manifest, _ = load_manifest(RunLayout.at(root).manifest)
    present = pd.DataFrame(concept_present(manifest, data.concept_names), index=manifest["ecg_id"].to_numpy())
    concepts = {s: np.where(present.loc[data.ecg_ids[s]].to_numpy(bool), v.astype(np.float64), np.nan)
                for s, v in data.concepts.items()}
    return replace(data, concepts=concepts)


def intervene_model(root: str | Path, eval_cfg: EvalProtocol, scfg: SecondaryConfig, model: str, layer: int,
                    cells: list[tuple[int, str]], counts: np.ndarray, ci: tuple[float, float],
                    rotation_seed: int, mimic: bool = False) -> dict[str, pd.DataFrame]:
    """All designs of one model (seeds x candidate arms x k x concepts x methods) and its paired bootstrap.
    mimic: the MIMIC workers' design (§9.4.1; scfg is already SecondaryConfig.intervention_design's)."""
    import torch

    from raybench.sae.cell_files import load_cell_metrics, load_cell_sae
    from raybench.sae.data import load_secondary_data

    torch.set_num_threads(1)
    data = (masked_data(root, model, layer, eval_cfg) if mimic
            else load_secondary_data(root, model, layer, eval_cfg, scfg.complete_case_train))
    names = data.concept_names
    fams = concept_families(names)
    c_n = len(names)
    if len(set(fams)) < 2:
        raise ValueError(f"{model}: intervention selectivity needs concepts of at least two families, got {set(fams)}")
    _, norm = load_cell_sae(cells[0][1])
    x = {s: norm.apply(data.acts[s]).astype(np.float64) for s in ("train", "val", "test")}
    y = {s: data.concepts[s].astype(np.float64) for s in ("train", "val", "test")}
    sel = np.arange(len(y["train"])) if mimic else data.selection_idx  # MIMIC: ranked on every train record
    corr_of = masked_corr if mimic else feature_concept_corr
    readout = (masked_ridge_readout if mimic else ridge_readout)(x["train"], y["train"], x["val"], y["val"],
                                                                  scfg.readout_alphas)
    methods = scfg.intervention_methods
    arms, ks, d = scfg.intervention_arms, scfg.intervention_ks, x["train"].shape[1]
    p_n = len(data.test_patients)
    codes = data.test_patient_codes
    n_per_patient = np.bincount(codes, minlength=p_n).astype(np.float64)

    def patient_means(unit: UnitIntervention, c: int, dose: float) -> np.ndarray:
        return per_patient_sums(codes, p_n, record_metrics(unit, c, fams, dose)) / n_per_patient[:, None]

    base_units: dict[tuple[str, int, int], UnitIntervention] = {}
    for method, (rep, basis) in baseline_representations(x, methods, rotation_seed).items():
        ranking = rank_features(corr_of(rep["train"][sel], y["train"][sel]))
        for k in ks:
            for c in range(c_n):
                base_units[(method, k, c)] = _unit(rep["train"], rep["val"], rep["test"], y["train"][:, c], basis,
                                                   readout.coef, ranking[:k, c], scfg.high_quantile)
    seeds = [s for s, _ in cells]
    shape = (len(seeds), len(arms), len(ks), len(methods), c_n)
    sums = np.zeros((*shape, p_n, len(RECORD_METRICS)))
    n_ok = np.zeros(shape, dtype=np.int64)
    effect = np.zeros(shape)
    design_rows = []
    quality = []  # per seed: the SAE quality gate (MIMIC design; always passes otherwise)
    for si, (seed, cell_dir) in enumerate(cells):
        sae, nrm = load_cell_sae(cell_dir)
        # column access (the clamped coordinates) is what the designs below do most: CSC
        z = {s: sae_codes(sae, nrm, data.acts[s], eval_cfg.eval_batch).tocsc() for s in ("train", "val", "test")}
        if mimic:
            corr = masked_corr(z["train"], y["train"])
            subsets = pool_subsets(candidate_pool(z["train"], scfg.candidate_pool), sae.n_latents, d,
                                   scfg.candidate_subsets, scfg.subset_seed)
            quality.append(quality_pass(load_cell_metrics(cell_dir), sae.n_latents, scfg.quality_gate,
                                        scfg.min_validation_r2, scfg.min_live_latents or d))
        else:
            corr = feature_concept_corr(sae_codes(sae, nrm, data.acts["train"][sel], eval_cfg.eval_batch),
                                        y["train"][sel])
            subsets = candidate_subsets(sae.n_latents, d, scfg.candidate_subsets, scfg.subset_seed)
            quality.append(True)
        basis = sae.W_dec_t[0].detach().cpu().numpy().astype(np.float64)  # [N, d]: decoder column j as row j
        designs = [(a, r, cand) for a, arm in enumerate(arms)
                   for r, cand in (enumerate(subsets) if arm == "matched" else [(-1, np.arange(sae.n_latents))])]
        for a, r, cand in designs:
            ranking = rank_features(corr, cand)
            for ki, k in enumerate(ks):
                for c in range(c_n):
                    units = {m: base_units[(m, k, c)] for m in methods if m != "sae"}
                    units["sae"] = _unit(z["train"], z["val"], z["test"], y["train"][:, c], basis, readout.coef,
                                         ranking[:k, c], scfg.high_quantile)
                    eff = {m: units[m].val_effect(c) for m in methods}
                    common, status = common_effect({m: eff[m] for m in methods if m in COMMON_METHODS},
                                                   scfg.effect_cap, scfg.effect_floor, scfg.max_dose)
                    row = {"model": model, "seed": seed, "sae_quality_pass": quality[-1], "arm": arms[a],
                           "subset": r, "k": int(k),
                           "concept": names[c], "family": fams[c], "status": status, "common_effect": common}
                    for mi, m in enumerate(methods):
                        dose = _dose(m, common, eff[m], scfg.max_dose) if status == "eligible" else None
                        row[f"{m}_unit_effect"], row[f"{m}_dose"] = eff[m], np.nan if dose is None else dose
                        if dose is not None:
                            sums[si, a, ki, mi, c] += patient_means(units[m], c, dose)
                            n_ok[si, a, ki, mi, c] += 1
                            effect[si, a, ki, mi, c] += common
                    design_rows.append(row)
    sums /= np.maximum(n_ok, 1)[..., None, None]  # in place: [S, A, K, M, C, P, 5] is the largest array here
    sums[n_ok == 0] = np.nan
    with np.errstate(invalid="ignore", divide="ignore"):
        seed_effect = np.where(n_ok > 0, effect / n_ok, np.nan)
    avg, seeds_ok, matched = seed_average(sums, seed_effect)
    if not all(quality):  # the published MIMIC primary: every seed passes the quality gate, then the effect gate
        seeds_ok = np.zeros_like(seeds_ok)
    observed, draws = observed_and_draws(avg, matched, n_per_patient, counts)
    contrasts = paired_contrasts(observed, draws, seeds_ok, len(seeds), arms, ks, methods,
                                 [c for c in COMPARISONS if set(c) <= set(methods)], ci)
    contrasts.insert(0, "model", model)
    col = {m: i for i, m in enumerate(OUTPUT_METRICS)}
    concept_rows, summary_rows = [], []
    for a, arm in enumerate(arms):
        for ki, k in enumerate(ks):
            # per method: eligible in every seed (the published all-seeds profile)
            primary = (seeds_ok[a, ki] == len(seeds)) & np.isfinite(observed[a, ki, :, :, 0])  # [M, C]
            sae, dense = methods.index("sae"), methods.index("dense")
            wbi = observed[a, ki, :, :, col["wbi_cross"]]  # [M, C]
            selective = primary[sae] & primary[dense] & (wbi[sae] < wbi[dense])  # SAE more selective than dense
            for mi, method in enumerate(methods):
                obs = observed[a, ki, mi]
                concept_rows += [{"model": model, "arm": arm, "k": int(k), "concept": names[c], "family": fams[c],
                                  "method": method, "seeds_eligible": int(seeds_ok[a, ki, mi, c]),
                                  "primary_eligible": bool(primary[mi, c]), "matched_effect": matched[a, ki, mi, c],
                                  **{m: obs[c, col[m]] for m in OUTPUT_METRICS}} for c in range(c_n)]
                pm = obs[primary[mi]]
                summary_rows.append({
                    "model": model, "arm": arm, "k": int(k), "method": method, "concepts_total": c_n,
                    "concepts_eligible": int(primary[mi].sum()),
                    "concepts_any_seed": int(np.isfinite(obs[:, 0]).sum()),
                    "design_rows": len(design_rows), "eligible_designs": int(n_ok[:, a, ki, mi].sum()),
                    **{m: float(pm[:, col[m]].mean()) if len(pm) else np.nan for m in OUTPUT_METRICS},
                    "sae_selective_concepts": int(selective.sum()), "sae_quality_pass": all(quality),
                    "sae_selective_fraction": float(selective.sum() / c_n),
                })
    return {"intervention": pd.DataFrame(summary_rows), "intervention_contrasts": contrasts,
            "intervention_concepts": pd.DataFrame(concept_rows), "intervention_designs": pd.DataFrame(design_rows)}


def run_intervention(root: str | Path, protocol: Protocol, scfg: SecondaryConfig, cohort: str
                     ) -> dict[str, pd.DataFrame]:
    """One Ray task per model at its final layer; BH per metric over every contrast row (bh_family); tables +
    figure. cohort: cfg.cohort.kind (the published MIMIC run had its own design, §9.4.1, and bootstrap seed)."""
    import ray

    from raybench.analysis.secondary import calibration_cells
    from raybench.core.atomic import write_table
    from raybench.core.paths import RunLayout
    from raybench.sae.data import evaluation_test_patients

    layout = RunLayout.at(root)
    cells = calibration_cells(root, protocol)
    cells = cells[cells["layer"] == cells["n_layers"] - 1]
    if cells.empty:
        log.warning("intervention skipped: no ok primary final-layer cells at E=%d",
                    protocol.eval.calibration_expansion)
        return {}
    from raybench.cohorts.manifest import load_manifest

    mimic = scfg.uses_mimic_design(cohort)
    scfg = scfg.intervention_design(cohort)
    eval_cfg = replace(protocol.eval, missing_concepts="fill_zero") if mimic else protocol.eval  # MIMIC: every record
    manifest, info = load_manifest(layout.manifest)  # test patients as load_cell_data has them (missing concepts)
    counts = ray.put(bootstrap_counts(len(evaluation_test_patients(manifest, info, eval_cfg)),
                                      scfg.draws(protocol), scfg.intervention_bootstrap_seed(protocol, cohort),
                                      protocol.inference.chunk_draws, protocol.inference.stream))
    task = ray.remote(num_cpus=1)(intervene_model)
    ci = (protocol.inference.ci_low, protocol.inference.ci_high)
    grid_cells = pd.read_parquet(layout.cells_table, columns=["model", "n_layers"])
    grid_cells = grid_cells[grid_cells["model"].isin(protocol.grid.models)]
    seeds = rotation_seeds(scfg.rotation_seed, grid_cells.groupby("model")["n_layers"].first().astype(int).to_dict(),
                           protocol.grid.depths)
    refs = []
    for (model, layer), sub in cells.groupby(["model", "layer"], sort=True):
        units = [(int(s), d) for s, d in zip(sub["seed"], sub["cell_dir"], strict=True)]
        refs.append(task.remote(str(layout.root), protocol.eval, scfg, model, int(layer), units, counts, ci,
                                seeds[model], mimic))
    parts = ray.get(refs)
    tables = {name: pd.concat([p[name] for p in parts], ignore_index=True) for name in parts[0]}
    tables["intervention_contrasts"]["q_value_bh"] = bh_family(tables["intervention_contrasts"])
    for name, df in tables.items():
        write_table(layout.tables_dir / f"{name}.parquet", df)
    return tables
