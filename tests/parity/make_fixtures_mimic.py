#!/usr/bin/env python
"""Write the MIMIC-order, MIMIC-intervention and rotation-seed parity fixtures (issue 42 items 1-3) by running
the published protocol code itself.

    python tests/parity/make_fixtures_mimic.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

Imports the upstream scripts and modules (JayDuan123/2027-kdd-ECG-InterpBench, from the checkout given, never
copied) and runs them on a simulated MIMIC-IV-ECG layout written to a temporary folder. It does not import
raybench.

  1. record order and selection draws: a layout of 3,000 fake studies of 1,300 subjects (record_list.csv and
     machine_measurements.csv as MIMIC-IV-ECG ships them) and the two tables the published plan reads in its
     place (the per-study waveform concepts, 20 % of studies with some concept missing and 3 % failed, and the
     ICD label matrix of the 85 % linked studies; the published extractor and ICD join need waveforms and
     MIMIC-IV hosp, which a simulation does not have, so these are written from the simulated values).
     scripts/build_mimic_external_main_plan.py::main (N = 2,000) writes the pool,
     scripts/materialize_mimic_source_atlas.py::main writes records.csv (its activation reader is replaced by
     one returning zeros for the listed records: nothing it writes to records.csv depends on them);
     scripts/run_multiscale_sae_task.py::main (one step, d = 4, --preserve-missing-concepts
     --complete-case-evaluation, limit 256) draws the atlas selection subset, recorded by wrapping `evaluate`;
     scripts/run_accessibility_calibration_worker.py::main (--complete-case-concepts, limit 256) draws the
     complete-case subset, recorded by wrapping `encode_sae`, which then stops the run;
  2. MIMIC intervention pieces: benchmark_v1/sparse_accessibility.py::deterministic_feature_subset and
     deterministic_subset_from_candidates at the MIMIC worker's seed base (976000 + r) and a train-live
     candidate pool; benchmark_v1/mimic_matched_effect.py::masked_feature_concept_correlations with
     sparse_accessibility.candidate_ranking; benchmark_v1/matched_effect.py::centroid_unit_intervention
     (NaN labels), common_validation_effect over dense and SAE, calibrated_record_metrics (off_max_abs);
     scripts/run_mimic_final_layer_matched_effect_worker.py::matched_live_capacity_quality;
  3. rotation seeds: benchmark_v1/multiscale_sae.py::build_manifest_rows_from_specs on the published six
     models x five depths, then scripts/run_final_layer_sparse_accessibility_worker.py::final_groups(., 8):
     the final layer's index among the E = 8 groups, to which run_final_layer_matched_effect_worker.py adds
     its --random-seed default (read from its parser).

Fixtures (tests/parity/test_parity_mimic.py reads them): mimic_fixtures.json (commit, versions, commands,
seeds, the published order and draws as study ids) and mimic_inputs.npz (the simulated studies and the
intervention inputs and outputs).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMMIT = "de4e19d9ee8786eadef9d6530a01d585f933e8fc"
N_STUDIES, N_SUBJECTS, POOL, LIMIT = 3000, 1300, 2000, 256
CONCEPTS = ("rr_mean_ms", "qrs_duration_ms", "pr_interval_ms", "qt_like_ms", "r_amp_global_mv",
            "st_amp_global_mv", "t_amp_global_mv")


class Stop(Exception):
    """Raised by the encode_sae wrapper once the semantic-train rows are recorded."""


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def simulated_layout(tmp: Path) -> dict[str, np.ndarray]:
    """record_list.csv + machine_measurements.csv of fake studies, and the two published plan inputs."""
    rng = np.random.default_rng(42)
    subjects = np.sort(rng.choice(np.arange(10_000_000, 19_999_999), N_SUBJECTS, replace=False))
    subject = subjects[rng.integers(0, N_SUBJECTS, N_STUDIES)]
    study = np.sort(rng.choice(np.arange(40_000_000, 49_999_999), N_STUDIES, replace=False))
    values = np.column_stack([rng.normal(850, 150, N_STUDIES), rng.normal(95, 12, N_STUDIES),
                              rng.normal(160, 25, N_STUDIES), rng.normal(400, 35, N_STUDIES),
                              rng.normal(1.1, 0.4, N_STUDIES), rng.normal(0.02, 0.08, N_STUDIES),
                              rng.normal(0.3, 0.15, N_STUDIES)])
    missing = (rng.random((N_STUDIES, len(CONCEPTS))) < 0.04) & (rng.random(N_STUDIES) < 0.8)[:, None]
    status_ok = rng.random(N_STUDIES) >= 0.03
    linked = rng.random(N_STUDIES) < 0.85
    layout = tmp / "mimic-iv-ecg"
    write_csv(layout / "record_list.csv", [
        {"subject_id": int(s), "study_id": int(t), "file_name": int(t), "ecg_time": "2180-01-01 00:00:00",
         "path": f"files/p{str(s)[:4]}/p{s}/s{t}/{t}"} for s, t in zip(subject, study, strict=True)])
    write_csv(layout / "machine_measurements.csv", [
        {"subject_id": int(s), "study_id": int(t), "cart_id": 6800 + i % 7, "rr_interval": int(v[0]),
         "qrs_onset": 40, "qrs_end": 40 + int(v[1]), "p_onset": 40 - int(v[2]), "t_end": 40 + int(v[3])}
        for i, (s, t, v) in enumerate(zip(subject, study, values, strict=True))])
    write_csv(tmp / "waveform_concepts_by_record.csv", [
        {"cohort": "mimic", "status": "ok" if ok else "failed", "study_id_or_record_key": str(int(t)),
         "record_id": f"mimic:{int(t)}", "subject_id": str(int(s)),
         **{c: ("" if missing[i, j] or not ok else repr(float(values[i, j]))) for j, c in enumerate(CONCEPTS)}}
        for i, (s, t, ok) in enumerate(zip(subject, study, status_ok, strict=True))])
    write_csv(tmp / "mimic_icd_label_matrix.csv", [
        {"study_id": int(t), "af_rhythm_icd": 0, "bbb_conduction_icd": 0, "qt_interval_icd": 0,
         "mi_ischemia_icd": int(i % 5 == 0), "hypertrophy_icd": 0}
        for i, t in enumerate(study) if linked[i]])
    return {"study_id": study, "subject_id": subject, "values": values, "missing": missing,
            "status_ok": status_ok, "icd_linked": linked}


def order_part(tmp: Path) -> tuple[dict, dict]:
    """Pool, records.csv and both selection draws, from the published scripts."""
    arrays = simulated_layout(tmp)
    plan = importlib.import_module("scripts.build_mimic_external_main_plan")
    plan.SOURCE, plan.LABELS = tmp / "waveform_concepts_by_record.csv", tmp / "mimic_icd_label_matrix.csv"
    plan.OUT = tmp / "activations"
    plan.PLAN, plan.N, plan.LAYER_N = plan.OUT / "plan_mimic_100k", POOL, 256
    with contextlib.redirect_stdout(sys.stderr):
        plan.main()
    manifest = plan.PLAN / "mimic_main_manifest.csv"
    mat = importlib.import_module("scripts.materialize_mimic_source_atlas")
    pool_ids = [mat.normalize_record_id(r["record_id"]) for r in read_csv(manifest)]

    def zeros_layer(root, index_root, layer):  # stands in for the activation shards (module doc)
        return [{"ecg_id": i} for i in pool_ids], np.zeros((len(pool_ids), 768), np.float32)

    mat.load_indexed_layer = zeros_layer
    out = tmp / "source_atlas"
    argv = ["materialize_mimic_source_atlas.py", "--manifest", str(manifest), "--icd-matrix",
            str(tmp / "mimic_icd_label_matrix.csv"), "--activation-root", str(tmp / "act"), "--out", str(out),
            "--max-records", str(POOL)]
    sys.argv = argv
    with contextlib.redirect_stdout(sys.stderr):
        mat.main()
    derived = out / "derived"
    records = read_csv(derived / "records.csv")
    rec_ids = np.array([int(r["ecg_id"]) for r in records], dtype=np.int64)
    split = [r["split"] for r in records]
    atlas = atlas_draw(tmp, derived, len(records))
    calib = calibration_draw(tmp, derived, len(records))
    meta = {"pool_records": len(records), "limit": LIMIT,
            "commands": ["scripts/build_mimic_external_main_plan.py (N=2000, LAYER_N=256; SOURCE, LABELS, OUT "
                         "set to the simulated tables)", " ".join(argv[1:]).replace(str(tmp), "TMP"),
                         "scripts/run_multiscale_sae_task.py --task-index 0 --device cpu --semantic-train-limit "
                         "256 --preserve-missing-concepts --complete-case-evaluation",
                         "scripts/run_accessibility_calibration_worker.py --calibration-index 0 "
                         "--semantic-train-limit 256 --complete-case-concepts"]}
    return meta, {**arrays, "records_ecg_id": rec_ids,
                  "records_split": np.array([{"train": 0, "val": 1, "test": 2}[s] for s in split], np.int8),
                  "atlas_selection_ecg_id": np.sort(rec_ids[atlas]),
                  "complete_case_selection_ecg_id": np.sort(rec_ids[calib])}


def atlas_draw(tmp: Path, derived: Path, n: int) -> np.ndarray:
    mod = importlib.import_module("scripts.run_multiscale_sae_task")
    from benchmark_v1.multiscale_sae import canonical_config_hash

    root = tmp / "atlas"
    root.mkdir()
    np.save(root / "acts.npy", np.random.default_rng(3).normal(size=(n, 4)).astype(np.float32))
    row = {"task_index": 0, "model": "ECG-FM", "model_safe": "ecg_fm", "feature_suffix": "parity", "layer": 0,
           "relative_depth": 0.0, "actual_relative_depth": 0.0, "n_layers": 1, "d_hidden": 4,
           "sparsity_arm": "fixed_k_over_d", "expansion_E": 2, "N": 8, "k": 1, "k_over_d": 0.25,
           "k_over_N": 0.125, "seed": 4311, "steps": 1, "batch_size": 256, "learning_rate": 3e-4,
           "activation_path": str(root / "acts.npy"), "records_path": str(derived / "records.csv"),
           "checkpoint": str(root / "cell" / "ckpt.pt"), "metrics": str(root / "cell" / "metrics.json"),
           "concept_metrics": str(root / "cell" / "concept_metrics.csv"),
           "firing_rate": str(root / "cell" / "firing_rate.npy")}
    row["config_hash"] = canonical_config_hash(mod.typed_config({k: str(v) for k, v in row.items()}))
    write_csv(root / "manifest.csv", [row])
    seen: list[np.ndarray] = []
    evaluate = mod.evaluate

    def evaluate_rec(model, acts, indices, *args, **kwargs):
        seen.append(np.asarray(indices).copy())
        return evaluate(model, acts, indices, *args, **kwargs)

    mod.evaluate = evaluate_rec
    sys.argv = ["run_multiscale_sae_task.py", "--manifest", str(root / "manifest.csv"), "--task-index", "0",
                "--device", "cpu", "--concepts", str(derived / "concepts_matrix.csv"),
                "--concept-registry", str(derived / "concept_registry.csv"), "--semantic-train-limit", str(LIMIT),
                "--preserve-missing-concepts", "--complete-case-evaluation"]
    with contextlib.redirect_stdout(sys.stderr):
        mod.main()
    return seen[0]


def calibration_draw(tmp: Path, derived: Path, n: int) -> np.ndarray:
    root = tmp / "calibration"
    root.mkdir()
    np.save(root / "acts.npy", np.random.default_rng(4).normal(size=(n, 8)).astype(np.float32))
    write_csv(root / "manifest.csv", [{"task_index": 0, "expansion_E": 8, "model_safe": "m", "layer": 11,
                                       "seed": 4311, "activation_path": str(root / "acts.npy"),
                                       "records_path": str(derived / "records.csv"),
                                       "checkpoint": str(root / "none.pt"),
                                       "concept_metrics": str(root / "none.csv")}])
    worker = importlib.import_module("scripts.run_accessibility_calibration_worker")
    seen: dict[str, np.ndarray] = {}

    def record(model, acts, indices, batch_size, device):
        seen["rows"] = np.asarray(indices)
        raise Stop

    worker.load_sae = lambda row, device: (object(), Path(row["checkpoint"]))
    worker.encode_sae = record
    sys.argv = ["run_accessibility_calibration_worker.py", "--manifest", str(root / "manifest.csv"),
                "--calibration-index", "0", "--semantic-train-limit", str(LIMIT), "--device", "cpu",
                "--concepts", str(derived / "concepts_matrix.csv"), "--concept-registry",
                str(derived / "concept_registry.csv"), "--complete-case-concepts", "--output-root", str(root / "out")]
    with contextlib.suppress(Stop), contextlib.redirect_stdout(sys.stderr):
        worker.main()
    return seen["rows"]


def intervention_part() -> tuple[dict, dict]:
    """The MIMIC worker's pieces on a small synthetic design (module doc, 2)."""
    sa = importlib.import_module("benchmark_v1.sparse_accessibility")
    mme = importlib.import_module("benchmark_v1.mimic_matched_effect")
    me = importlib.import_module("benchmark_v1.matched_effect")
    worker = importlib.import_module("scripts.run_mimic_final_layer_matched_effect_worker")
    sys.argv = ["run_mimic_final_layer_matched_effect_worker.py", "--task-index", "0"]
    defaults = worker.parse_args()
    rng = np.random.default_rng(11)
    n_lat, budget, reps, n_tr, n_va, n_te, d = 96, 24, 4, 240, 60, 80, 12
    c_n = len(mme.CONCEPT_SPECS)
    fams = np.array([f for _, f in mme.CONCEPT_SPECS])
    live = np.sort(rng.choice(n_lat, 60, replace=False))
    z = {s: np.where(rng.random((n, n_lat)) < 0.2, rng.gamma(2.0, 1.0, (n, n_lat)), 0.0).astype(np.float32)
         for s, n in (("train", n_tr), ("val", n_va), ("test", n_te))}
    dead = np.setdiff1d(np.arange(n_lat), live)
    for v in z.values():
        v[:, dead] = 0.0
    x = {s: rng.normal(size=(len(v), d)).astype(np.float32) for s, v in z.items()}
    y = rng.normal(size=(n_tr, c_n)).astype(np.float32) + 0.3 * z["train"][:, live[:c_n]]
    y[rng.random((n_tr, c_n)) < 0.15] = np.nan
    basis = rng.normal(size=(n_lat, d)).astype(np.float32) / 3
    coef = rng.normal(size=(d, c_n)).astype(np.float32) / 2
    pool = np.flatnonzero(worker.feature_firing_counts(z["train"]) > 0)
    subsets_all = [sa.deterministic_feature_subset(n_lat, budget, defaults.budget_seed_base + r) for r in range(reps)]
    subsets_live = [sa.deterministic_subset_from_candidates(pool, budget, defaults.budget_seed_base + r)
                    for r in range(reps)]
    dense_corr = mme.masked_feature_concept_correlations(x["train"], y)
    sae_corr = mme.masked_feature_concept_correlations(z["train"], y)
    dense_rank = sa.candidate_ranking(dense_corr)
    out: dict[str, np.ndarray] = {}
    metrics, statuses = [], []
    for r, cand in enumerate(subsets_all):
        sae_rank = sa.candidate_ranking(sae_corr, cand)
        out[f"sae_ranking_{r}"] = sae_rank
        for t in range(c_n):
            units = {"dense": me.centroid_unit_intervention(x["train"], x["val"], x["test"], y, dense_rank,
                                                            np.eye(d, dtype=np.float32), coef, target_index=t,
                                                            k=defaults.k, high_quantile=defaults.high_quantile),
                     "sae": me.centroid_unit_intervention(z["train"], z["val"], z["test"], y, sae_rank, basis, coef,
                                                          target_index=t, k=defaults.k,
                                                          high_quantile=defaults.high_quantile)}
            common, effects, status = me.common_validation_effect(units, t, cap=defaults.effect_cap,
                                                                  floor=defaults.effect_floor)
            for m in ("dense", "sae"):
                row = np.full((n_te, 5), np.nan)
                if status == "eligible":
                    got, _, status_m = me.calibrated_record_metrics(
                        units[m], target_index=t, target_family=str(fams[t]), concept_families=fams,
                        target_effect=common, unit_validation_effect=effects[m])
                    if status_m == "eligible":
                        row = got
                metrics.append(row)
                statuses.append(f"{r}:{t}:{m}:{status}:{common!r}:{effects[m]!r}")
    quality = worker.matched_live_capacity_quality(
        {"N": 6144, "validation": {"dead_fraction": 0.85, "reconstruction_r2": 0.93}}, 0.9, 768)
    meta = {"seed_base": defaults.budget_seed_base, "k": defaults.k, "budget_replicates": defaults.budget_replicates,
            "matched_budget": defaults.matched_budget, "candidate_pools": ["all", "train_live"],
            "quality_gate_modes": ["training_metrics", "matched_live_capacity"], "min_validation_r2":
            defaults.min_validation_r2, "min_validation_live_features": defaults.min_validation_live_features,
            "quality_example": quality, "design_status": statuses, "methods": list(worker.METHODS),
            "metrics": list(worker.METRICS)}
    arrays = {"iv_x_" + s: v for s, v in x.items()} | {"iv_z_" + s: v for s, v in z.items()}
    arrays |= {"iv_y_train": y, "iv_basis": basis, "iv_coef": coef, "iv_pool": pool,
               "iv_subsets_all": np.stack(subsets_all), "iv_subsets_live": np.stack(subsets_live),
               "iv_dense_corr": dense_corr, "iv_sae_corr": sae_corr, "iv_dense_ranking": dense_rank,
               "iv_record_metrics": np.stack(metrics).astype(np.float32)}
    arrays |= {"iv_" + k: v for k, v in out.items()}
    return meta, arrays


def rotation_part(tmp: Path) -> dict:
    """The final layers' group index among the E = 8 groups and the worker's seed base (module doc, 3)."""
    ms = importlib.import_module("benchmark_v1.multiscale_sae")
    fl = importlib.import_module("scripts.run_final_layer_sparse_accessibility_worker")
    worker = importlib.import_module("scripts.run_final_layer_matched_effect_worker")
    sys.argv = ["run_final_layer_matched_effect_worker.py", "--source-index", "0"]
    base = worker.parse_args().random_seed
    n_layers = {"CARDIAC-FM": 12, "CSFM": 6, "ECG-FM": 12, "ECG-JEPA": 12, "HuBERT-ECG": 12, "ST-MEM": 12}
    specs = []
    for model, suffix in ms.MODEL_SUFFIXES.items():
        n = n_layers[model]
        for depth, layer in zip(ms.DEFAULT_DEPTHS, ms.relative_layer_indices(n, ms.DEFAULT_DEPTHS), strict=True):
            specs.append(ms.LayerSpec(model=model, suffix=suffix, layer=layer, target_relative_depth=depth,
                                      actual_relative_depth=layer / (n - 1), n_layers=n, d_hidden=768,
                                      activation_path=tmp / "a.npy", records_path=tmp / "r.csv"))
    rows = ms.build_manifest_rows_from_specs(specs, tmp / "grid")
    write_csv(tmp / "training_manifest.csv", rows)
    groups = fl.final_groups(tmp / "training_manifest.csv", 8)
    return {"random_seed_base": int(base), "final_layer_groups": {g[0]["model"]: int(i) for i, g in groups},
            "rotation_seeds": {g[0]["model"]: int(base + i) for i, g in groups}, "groups_at_e8": len(rows) // 15}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != COMMIT:
        sys.exit(f"upstream checkout is at {head.stdout.strip()}, not {COMMIT}")
    sys.path.insert(0, str(args.upstream.resolve()))
    import torch

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        order, a1 = order_part(Path(tmp))
        rotation = rotation_part(Path(tmp))
    intervention, a2 = intervention_part()
    import pandas
    import scipy

    result = {"commit": COMMIT, "numpy": np.__version__, "scipy": scipy.__version__, "pandas": pandas.__version__,
              "torch": torch.__version__, "command": "python tests/parity/make_fixtures_mimic.py <upstream>",
              "order": order, "rotation": rotation, "intervention": intervention}
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "mimic_inputs.npz", **a1, **a2)
    (args.out / "mimic_fixtures.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
