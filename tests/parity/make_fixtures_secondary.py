#!/usr/bin/env python
"""Write the secondary-analysis parity fixtures by running the published protocol code itself.

    python tests/parity/make_fixtures_secondary.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

Imports the upstream scripts and modules (JayDuan123/2027-kdd-ECG-InterpBench, from the checkout given, never
copied) and runs them on small synthetic inputs written to a temporary folder. It does not import raybench.

  1. seeds (issue 30 item 5): the BOOTSTRAP_SEED constants of the four secondary bootstrap scripts, and the
     patient-count draws of scripts/evaluate_input_harmonization.py::bootstrap_weights on 23 patients;
  2. complete-case selection subset (item 6): scripts/run_accessibility_calibration_worker.py::main with
     --complete-case-concepts --semantic-train-limit 64 on a 300-record project with missing concept values;
     its `encode_sae` is wrapped to record the semantic-train rows of its first call and stop the run there
     (its `load_sae` returns a placeholder: nothing before that call uses the SAE);
  3. MIMIC rate concept (item 7): benchmark_v1/mimic_matched_effect.py::aligned_concepts on 40 records whose
     rr_mean_ms includes blanks, 0, a negative and a non-number;
  4. intervention BH family (item 9): scripts/bootstrap_final_layer_matched_effect.py::main for each of two
     models (three seed workers each, 2 arms x 2 k x 4 methods x 6 concepts x 30 patients, some design cells
     ineligible in some seeds), its weights recorded through a wrapper of `bootstrap_patient_metric_means`;
     then scripts/summarize_final_layer_matched_effect.py::main for the BH q-values (its figures and audit
     after the paired table are not needed; a failure there is reported and ignored).

Fixtures (tests/parity/test_parity_secondary.py reads them):
  secondary_fixtures.json   commit, versions, seeds, command lines, the calibration subset's ecg_ids, the paired
                            table with q-values
  secondary_inputs.npz      the synthetic inputs: records and concepts of 2 and 3, the worker arrays of 4, and
                            the recorded draws
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
SEED_SCRIPTS = {"harmonization": "scripts.evaluate_input_harmonization",
                "sparse_accessibility": "scripts.bootstrap_final_layer_sparse_accessibility",
                "matched_effect": "scripts.bootstrap_final_layer_matched_effect",
                "mimic_matched_effect": "scripts.bootstrap_mimic_final_layer_matched_effect"}
CONCEPTS = ("c_rate", "c_qrs", "c_st", "c_amp")
FAMILIES = ("rate_rhythm", "interval", "st_t", "amplitude")
MODELS = ("CSFM", "ECG-FM")  # sorted: the bootstrap script's model index order
SEEDS = (4311, 4312, 4313)
ARMS, KS = ("matched_768", "full_6144"), (1, 5)
METHODS = ("dense", "pca", "sae", "random_rotation")
SOURCE_METRICS = ("target_delta", "off_cross_rms", "off_all_rms", "off_max_abs", "activation_l2")
N_CONCEPTS, N_PATIENTS, DRAWS = 6, 30, 400


class Stop(Exception):
    """Raised by the encode_sae wrapper once the semantic-train rows are recorded."""


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


# ---------------------------------------------------------------- 1. seeds

def seeds_part() -> tuple[dict, dict]:
    seeds = {name: int(importlib.import_module(mod).BOOTSTRAP_SEED) for name, mod in SEED_SCRIPTS.items()}
    harm = importlib.import_module(SEED_SCRIPTS["harmonization"])
    rng = np.random.default_rng(5)
    patient_ids = np.array([f"p{int(v):03d}" for v in rng.integers(0, 23, 60)])
    patient_ids[:23] = [f"p{i:03d}" for i in range(23)]
    inverse, weights = harm.bootstrap_weights(patient_ids, 50)
    return seeds, {"harmonization_patient_ids": patient_ids, "harmonization_inverse": inverse,
                   "harmonization_weights": weights}


# ---------------------------------------------------------------- 2. complete-case selection subset

def calibration_part(tmp: Path) -> tuple[dict, dict]:
    rng = np.random.default_rng(7)
    n = 300
    ecg_ids = np.sort(rng.choice(np.arange(1, 5000), n, replace=False))
    split = rng.choice(["train", "val", "test"], n, p=[0.7, 0.15, 0.15])
    order = np.concatenate([np.flatnonzero(split == s) for s in ("test", "train", "val")])  # published layout
    ecg_ids, split = ecg_ids[order], split[order]
    values = rng.normal(size=(n, len(CONCEPTS)))
    missing = rng.random((n, len(CONCEPTS))) < 0.12
    project = tmp / "calibration"
    write_csv(project / "records.csv", [{"ecg_id": int(e), "split": s} for e, s in zip(ecg_ids, split, strict=True)])
    np.save(project / "acts.npy", rng.normal(size=(n, 8)).astype(np.float32))
    write_csv(project / "concepts.csv", [
        {"ecg_id": int(e), **{c: ("" if missing[i, j] else repr(float(values[i, j]))) for j, c in enumerate(CONCEPTS)}}
        for i, e in enumerate(ecg_ids)])
    write_csv(project / "registry.csv", [{"concept_id": c, "family": f, "main": "yes"}
                                         for c, f in zip(CONCEPTS, FAMILIES, strict=True)])
    write_csv(project / "manifest.csv", [{"task_index": 0, "expansion_E": 8, "model_safe": "m", "layer": 11,
                                          "seed": 4311, "activation_path": str(project / "acts.npy"),
                                          "records_path": str(project / "records.csv"),
                                          "checkpoint": str(project / "none.pt"),
                                          "concept_metrics": str(project / "none.csv")}])
    worker = importlib.import_module("scripts.run_accessibility_calibration_worker")
    seen: dict[str, np.ndarray] = {}

    def record(model, acts, indices, batch_size, device):
        seen["semantic_train_idx"] = np.asarray(indices)
        raise Stop

    worker.load_sae = lambda row, device: (object(), Path(row["checkpoint"]))
    worker.encode_sae = record
    argv = ["run_accessibility_calibration_worker.py", "--manifest", str(project / "manifest.csv"),
            "--calibration-index", "0", "--semantic-train-limit", "64", "--device", "cpu",
            "--concepts", str(project / "concepts.csv"), "--concept-registry", str(project / "registry.csv"),
            "--complete-case-concepts", "--output-root", str(project / "out")]
    sys.argv = argv
    with contextlib.suppress(Stop):  # the wrapper stops the run once the rows are recorded
        worker.main()
    idx = seen["semantic_train_idx"]
    meta = {"command": " ".join(argv[1:]).replace(str(project), "PROJECT"),
            "selection_ecg_ids": [int(v) for v in ecg_ids[idx]]}
    return meta, {"calib_ecg_ids": ecg_ids, "calib_split": split, "calib_values": values, "calib_missing": missing,
                  "calib_semantic_rows": idx}


# ---------------------------------------------------------------- 3. MIMIC rate concept

def mimic_rate_part() -> tuple[dict, dict]:
    mod = importlib.import_module("benchmark_v1.mimic_matched_effect")
    rng = np.random.default_rng(9)
    n = 40
    rr = [repr(float(v)) for v in rng.uniform(450, 1300, n)]
    rr[3], rr[11], rr[17], rr[25] = "", "0", "-5", "abc"
    names = [name for name, _ in mod.CONCEPT_SPECS]
    others = {name: rng.normal(100, 20, n) for name in names if name != "heart_rate_bpm"}
    rows = [{"record_id": f"mimic:{1000 + i}", "status": "ok", "rr_mean_ms": rr[i],
             **{k: repr(float(v[i])) for k, v in others.items()}} for i in range(n)]
    train = rng.random(n) < 0.7
    standardized, out_names, means, scales, finite = mod.aligned_concepts([r["record_id"] for r in rows], rows, train)
    rr_num = np.array([float(v) if v not in ("", "abc") else np.nan for v in rr])
    return {"mimic_concepts": list(out_names)}, {
        "mimic_rr": rr_num, "mimic_train": train, "mimic_others": np.stack([others[k] for k in out_names[1:]], 1),
        "mimic_standardized": standardized, "mimic_means": means, "mimic_scales": scales}


# ---------------------------------------------------------------- 4. intervention BH family

def worker_arrays(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Per seed patient means [A, K, M, C, P, 5] (NaN where a design cell is ineligible) and matched effects."""
    shape = (len(ARMS), len(KS), len(METHODS), N_CONCEPTS)
    base = rng.uniform(0.02, 0.3, (len(ARMS), len(KS), 1, N_CONCEPTS, 1, len(SOURCE_METRICS)))
    level = base * (1 + 0.04 * rng.normal(size=(*shape, 1, len(SOURCE_METRICS))))  # methods close: p spread out
    metrics, effects = [], []
    for _ in SEEDS:
        pm = level * rng.lognormal(0.0, 0.25, (*shape, N_PATIENTS, len(SOURCE_METRICS)))
        pm[:, :, 3, 0] = pm[:, :, 0, 0]  # concept 0: the rotation's metrics equal dense's (paired ties)
        off = rng.random(shape) < 0.05
        pm[off] = np.nan
        eff = np.where(off, np.nan, rng.uniform(0.05, 0.25, shape))
        metrics.append(pm.astype(np.float32))
        effects.append(eff.astype(np.float32))
    return {"patient_metrics": np.stack(metrics), "matched_effects": np.stack(effects)}


def intervention_part(tmp: Path) -> tuple[dict, dict]:
    rng = np.random.default_rng(13)
    root = tmp / "matched"
    patients = np.array([f"{10000 + i}" for i in range(N_PATIENTS)])
    counts = rng.integers(1, 4, N_PATIENTS).astype(np.float32)
    arrays: dict[str, np.ndarray] = {"bh_patient_ids": patients, "bh_patient_counts": counts}
    for model in MODELS:
        w = worker_arrays(rng)
        arrays[f"bh_{model}_metrics"], arrays[f"bh_{model}_effects"] = w["patient_metrics"], w["matched_effects"]
        for si, seed in enumerate(SEEDS):
            out = root / "workers" / f"{model}_{seed}"
            out.mkdir(parents=True)
            np.savez(out / "patient_metrics.npz", arm_names=np.array(ARMS), ks=np.array(KS, dtype=np.int32),
                     method_names=np.array(METHODS), concept_names=np.array([f"k{j}" for j in range(N_CONCEPTS)]),
                     concept_families=np.array(["a", "b"] * (N_CONCEPTS // 2)), metric_names=np.array(SOURCE_METRICS),
                     patient_ids=patients, patient_counts=counts, patient_metrics=w["patient_metrics"][si],
                     eligible_design_counts=np.isfinite(w["patient_metrics"][si][..., 0, 0]).astype(np.int16),
                     matched_validation_effects=w["matched_effects"][si])
            write_csv(out / "design_cells.csv", [{"model": model, "candidate_arm": a, "k": k, "method": m,
                                                  "status": "eligible"} for a in ARMS for k in KS for m in METHODS])
            (out / "summary.json").write_text(json.dumps({
                "status": "complete", "protocol": "final_layer_matched_effect_v1", "model": model,
                "source_seed": seed, "patient_metrics": str(out / "patient_metrics.npz"),
                "design_cells": str(out / "design_cells.csv")}))
        readout = root / "readouts" / model
        readout.mkdir(parents=True)
        (readout / "summary.json").write_text(json.dumps({"status": "complete",
                                                          "protocol": "final_layer_matched_effect_v1"}))
    boot = importlib.import_module("scripts.bootstrap_final_layer_matched_effect")
    inner = boot.bootstrap_patient_metric_means
    seen: list[np.ndarray] = []

    def record(values, patient_counts, weights):
        if not seen:
            seen.append(np.asarray(weights))
        return inner(values, patient_counts, weights)

    boot.bootstrap_patient_metric_means = record
    for i in range(len(MODELS)):
        sys.argv = ["bootstrap_final_layer_matched_effect.py", "--model-index", str(i), "--bootstrap-draws", str(DRAWS),
                    "--expected-models", str(len(MODELS)), "--workers-root", str(root / "workers"),
                    "--output-root", str(root / "bootstrap")]
        boot.main()
    arrays["bh_weights"] = seen[0]
    summary = importlib.import_module("scripts.summarize_final_layer_matched_effect")
    sys.argv = ["summarize_final_layer_matched_effect.py", "--expected-models", str(len(MODELS)),
                "--expected-workers", str(len(MODELS) * len(SEEDS)), "--expected-readouts", str(len(MODELS)),
                "--readouts-root", str(root / "readouts"), "--workers-root", str(root / "workers"),
                "--bootstrap-root", str(root / "bootstrap"), "--output-root", str(root / "summary")]
    try:
        summary.main()
    except Exception as err:  # what follows the paired table (figures, audit) needs more than this table has
        print(f"summarize after the paired table: {type(err).__name__}: {err}")
    keep = ("model", "candidate_arm", "k", "comparison", "metric", "concepts_paired", "observed_delta", "ci_low",
            "ci_high", "p_value_two_sided", "q_value_bh")
    with (root / "summary" / "paired_model_bootstrap_fdr.csv").open(newline="") as fh:
        paired = [{k: row[k] for k in keep} for row in csv.DictReader(fh)]
    return {"paired": paired, "draws": DRAWS, "commands": [
        "scripts/bootstrap_final_layer_matched_effect.py --model-index I --bootstrap-draws 400 --expected-models 2",
        "scripts/summarize_final_layer_matched_effect.py --expected-models 2 --expected-workers 6 "
        "--expected-readouts 2"]}, arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != COMMIT:
        sys.exit(f"upstream checkout is at {head.stdout.strip()}, not {COMMIT}")
    sys.path.insert(0, str(args.upstream.resolve()))
    seeds, arrays = seeds_part()
    with tempfile.TemporaryDirectory() as tmp:
        calib, a2 = calibration_part(Path(tmp))
        mimic, a3 = mimic_rate_part()
        bh, a4 = intervention_part(Path(tmp))
    import pandas
    import scipy

    result = {"commit": COMMIT, "numpy": np.__version__, "scipy": scipy.__version__, "pandas": pandas.__version__,
              "seeds": seeds, "calibration": calib, "mimic": mimic, "intervention": bh}
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "secondary_inputs.npz", **arrays, **a2, **a3, **a4)
    text = json.dumps(result, indent=0).replace("\n\"", " \"").replace("{ ", "{")  # one row per line
    (args.out / "secondary_fixtures.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
