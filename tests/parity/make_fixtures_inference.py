#!/usr/bin/env python
"""Write the inference parity fixtures by running the published protocol code itself.

    python tests/parity/make_fixtures_inference.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

The upstream checkout (JayDuan123/2027-kdd-ECG-InterpBench) is imported, never copied: every expected value
below comes out of one of its functions, or of its scripts' `main()` run on small synthetic inputs in a
temporary folder.  The published scripts use `np.trapz`, so run this with numpy < 2.4 (plus scipy, pandas and
torch, which the published code imports).  It does not import raybench.

Fixtures (inputs and expected outputs; tests/parity/test_parity_inference.py reads them):
  inference_patient_bootstrap.npz   patient bootstrap of one cell (scripts/run_multiscale_sae_patient_bootstrap:
                                    patient_groups, aggregate_by_patient, bootstrap with the published seed and
                                    chunking); the weights of the first draws are captured from inside bootstrap()
  inference_crossed_bootstrap.npz   crossed bootstrap (scripts/analyze_multiscale_sae_inference: main() on a
  inference_crossed_bootstrap.json  complete synthetic 6 x 5 x 5 x 3 grid; bootstrap_indices' first draws)
  inference_reproducibility.npz     Hungarian stability, subspace overlap and permutation floor
  inference_reproducibility.json    (scripts/analyze_multiscale_sae_stability: main() on small decoders; stable_seed)
  inference_auc_weights.json        normalized_log_auc of both scripts on unit vectors at E = 1, 4, 8, 16, 32
  inference_random_dictionaries.npz random dictionaries (scripts/run_accessibility_calibration_worker:
                                    encode_random_dictionary with a published BatchTopKSAE, seeds 920000 + i)
  inference_fixtures.json           upstream commit, numpy version, command
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
PATIENT_SEED = 20260714  # run_multiscale_sae_patient_bootstrap.py --bootstrap-seed default
PATIENT_CHUNK = 100  # its --bootstrap-chunk default
CROSSED_SEED = 20260714  # analyze_multiscale_sae_inference.py --seed default
RANDOM_SEED_BASE = 920000  # run_accessibility_baselines_v2_worker.py --random-seed-base default
RANDOM_REPLICATES = 20


def load(upstream: Path, rel: str, name: str):
    """Import an upstream script as a module (its own imports resolve against the checkout)."""
    if str(upstream) not in sys.path:
        sys.path.insert(0, str(upstream))
    spec = importlib.util.spec_from_file_location(name, upstream / rel)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def run_main(module, argv: list[str]) -> None:
    saved = sys.argv
    sys.argv = [module.__file__, *argv]
    try:
        module.main()
    finally:
        sys.argv = saved


# ---------------------------------------------------------------- patient bootstrap


def patient_bootstrap(upstream: Path, out: Path, tmp: Path) -> None:
    pb = load(upstream, "scripts/run_multiscale_sae_patient_bootstrap.py", "up_patient_bootstrap")
    rng = np.random.default_rng(101)
    n_pat, n_conc = 40, 4
    # PTB-XL-like patient ids written as floats ("15709.0"), of different lengths so that string order differs
    # from numeric order
    pids = [f"{v}.0" for v in rng.choice(np.arange(5, 30000), size=n_pat, replace=False)]
    per = rng.integers(1, 4, size=n_pat)
    rec_pid = np.repeat(np.asarray(pids), per)
    order = rng.permutation(len(rec_pid))  # records are not grouped by patient
    rec_pid = rec_pid[order]
    n_rec = len(rec_pid)
    records = [{"ecg_id": str(1000 + i)} for i in range(n_rec)]
    manifest = tmp / "patient_manifest.csv"
    write_csv(manifest, [{"ecg_id": r["ecg_id"], "patient_id": p} for r, p in zip(records, rec_pid, strict=True)])
    y = rng.normal(size=(n_rec, n_conc)) * [1.0, 2.0, 0.5, 3.0] + [0.0, 5.0, -1.0, 10.0]
    z = np.abs(0.4 * y + rng.normal(size=(n_rec, n_conc)))
    z[rng.random(size=z.shape) < 0.3] = 0.0  # sparse codes
    sse = rng.gamma(2.0, 0.1, size=n_rec)
    sst = rng.gamma(2.0, 1.0, size=n_rec) + sse

    captured: list[np.ndarray] = []
    original = pb.summarize_weighted

    def recording(stats_t, weights):  # capture the published draws, then run the published summary
        captured.append(weights.detach().cpu().numpy().copy())
        return original(stats_t, weights)

    pb.summarize_weighted = recording
    arrays: dict[str, np.ndarray] = {}
    draws = {"all": 1000, "cc": 300}
    complete = rng.random(n_rec) > 0.25  # complete-case subset (MIMIC path): some patients lose every record
    for case, eval_idx in (("all", np.arange(n_rec)), ("cc", np.flatnonzero(complete))):
        captured.clear()
        unique, inverse, _, cluster_hash = pb.patient_groups(records, eval_idx, manifest)
        stats = pb.aggregate_by_patient(inverse, sse[eval_idx], sst[eval_idx], z[eval_idx], y[eval_idx])
        observed, dist = pb.bootstrap(stats, draws[case], PATIENT_SEED, PATIENT_CHUNK, "cpu")
        weights = np.concatenate(captured[1:])  # captured[0] is the observed (all-ones) summary
        assert weights.shape == (draws[case], len(unique))
        arrays[f"{case}_eval_idx"] = eval_idx.astype(np.int32)
        arrays[f"{case}_patients"] = np.asarray(unique, dtype=str)
        arrays[f"{case}_first_weights"] = weights[:20].astype(np.int16)
        arrays[f"{case}_weights_sum_per_patient"] = weights.sum(axis=0).astype(np.int32)
        for key in ("recon_R2", "semantic_alignment", "concept_coverage_020", "concept_correlation"):
            arrays[f"{case}_{key}"] = dist[key]  # float32, as the published run stores them
            arrays[f"{case}_observed_{key}"] = np.asarray(observed[key], dtype=np.float64)
        arrays[f"{case}_draws"] = np.asarray(draws[case])
        arrays[f"{case}_cluster_hash"] = np.asarray(cluster_hash)
    pb.summarize_weighted = original
    np.savez_compressed(out / "inference_patient_bootstrap.npz", record_patient=rec_pid.astype(str), y=y, z=z,
                        sse=sse, sst=sst, seed=np.asarray(PATIENT_SEED), chunk=np.asarray(PATIENT_CHUNK), **arrays)


# ---------------------------------------------------------------- crossed bootstrap


def crossed_bootstrap(upstream: Path, out: Path, tmp: Path) -> None:
    inf = load(upstream, "scripts/analyze_multiscale_sae_inference.py", "up_inference")
    rng = np.random.default_rng(202)
    models, depths, exps, seeds = inf.MODEL_ORDER, inf.EXPECTED_DEPTHS, inf.EXPECTED_EXPANSIONS, inf.EXPECTED_SEEDS
    shape = (len(models), len(depths), len(exps), len(seeds))
    skill = np.linspace(0.0, 0.03, len(models))[:, None, None, None]
    scale = np.log(np.asarray(exps, float))[None, None, :, None]
    metrics = {
        "test_recon_R2": 0.85 + 0.02 * scale + skill + 0.02 * rng.normal(size=shape),
        "test_semantic_alignment": 0.30 + skill + 0.03 * rng.normal(size=shape),
        "test_concept_coverage_020": np.round(np.clip(0.7 + skill + 0.08 * rng.normal(size=shape), 0, 1) * 49) / 49,
        "test_dead_fraction": np.clip(0.05 * scale + 0.03 * rng.normal(size=shape), 0, 1),
    }
    rows = []
    for mi, m in enumerate(models):
        for di, q in enumerate(depths):
            for ei, e in enumerate(exps):
                for si, s in enumerate(seeds):
                    rows.append({"model": m, "relative_depth": q, "expansion_E": e, "seed": s,
                                 **{k: repr(float(v[mi, di, ei, si])) for k, v in metrics.items()}})
    root = tmp / "multiscale"
    root.mkdir()
    (root / "audit.json").write_text(json.dumps({"audit_pass": True}))
    write_csv(root / "cell_metrics.csv", rows)
    n_boot = 2000
    run_main(inf, ["--root", str(root), "--split", "test", "--bootstrap-samples", str(n_boot),
                   "--seed", str(CROSSED_SEED)])
    # the first draws, from the published generator function with the published seed
    draws = list(inf.bootstrap_indices(np.sort(np.asarray(depths, float)), np.sort(np.asarray(seeds)),
                                       np.random.default_rng(CROSSED_SEED), 50))
    np.savez_compressed(out / "inference_crossed_bootstrap.npz", models=np.asarray(models), depths=np.asarray(depths),
                        expansions=np.asarray(exps), seeds=np.asarray(seeds),
                        **{k: np.asarray(v, dtype=np.float64) for k, v in metrics.items()},
                        first_depth_draws=np.stack([d for d, _ in draws]),
                        first_seed_draws=np.stack([s for _, s in draws]))
    profile = read_csv(root / "test_model_profile_inference.csv")
    pairs = read_csv(root / "test_model_pair_inference.csv")
    (out / "inference_crossed_bootstrap.json").write_text(json.dumps({
        "seed": CROSSED_SEED, "bootstrap_samples": n_boot,
        "metric_columns": {"reconstruction": "test_recon_R2", "semantic_alignment": "test_semantic_alignment",
                           "concept_coverage": "test_concept_coverage_020", "dead_fraction": "test_dead_fraction"},
        "profile": [{k: r[k] for k in ("metric", "model", "observed_multiscale_auc", "ci_low", "ci_high")}
                    for r in profile],
        "pairs": [{k: r[k] for k in ("metric", "model_left", "model_right", "observed_difference", "ci_low",
                                     "ci_high", "p_two_sided", "q_bh")} for r in pairs],
    }, indent=1) + "\n")


# ---------------------------------------------------------------- reproducibility


def reproducibility(upstream: Path, out: Path, tmp: Path) -> None:
    import torch

    stab = load(upstream, "scripts/analyze_multiscale_sae_stability.py", "up_stability")
    rng = np.random.default_rng(303)
    d, top = 8, 16
    root = tmp / "stability"
    (root / "cells").mkdir(parents=True)
    (root / "audit.json").write_text(json.dumps({"audit_pass": True}))
    blocks = [("ECG-FM", 3, 0.25, 1), ("ECG-FM", 3, 0.25, 4), ("HuBERT-ECG", 6, 0.5, 4)]
    manifest, arrays = [], {}
    for b, (model, layer, depth, e) in enumerate(blocks):
        n = d * e
        shared = rng.normal(size=(d, n))  # seeds share part of a dictionary, so matching beats the floor
        for seed in stab.SEEDS:
            w_dec = (shared + 0.8 * rng.normal(size=(d, n))).astype(np.float32)
            firing = rng.permutation(np.arange(1, n + 1)).astype(np.float32) / (n + 1)  # distinct rates
            firing[rng.random(n) < 0.15] = 0.0  # dead latents
            ck = root / "cells" / f"b{b}_s{seed}.pt"
            torch.save({"model": {"W_dec": torch.from_numpy(w_dec)}}, ck)
            np.save(root / "cells" / f"b{b}_s{seed}_firing.npy", firing)
            manifest.append({"model": model, "layer": layer, "relative_depth": depth, "expansion_E": e,
                             "sparsity_arm": "fixed_k_over_d", "seed": seed, "checkpoint": str(ck),
                             "firing_rate": str(root / "cells" / f"b{b}_s{seed}_firing.npy")})
            arrays[f"b{b}_s{seed}_w_dec"] = w_dec
            arrays[f"b{b}_s{seed}_firing"] = firing
    write_csv(root / "training_manifest.csv", manifest)
    run_main(stab, ["--root", str(root), "--top-features", str(top), "--random-permutations", "100"])
    pairs = read_csv(root / "stability_seed_pairs.csv")
    for r in pairs:  # the floor seed main() used, from the published function with main()'s types
        r["floor_seed"] = stab.stable_seed(r["model"], int(r["layer"]), float(r["relative_depth"]),
                                           float(r["expansion_E"]), r["sparsity_arm"], int(r["seed_i"]),
                                           int(r["seed_j"]))
    # the pure functions on float64 inputs: Hungarian matching and subspace overlap at identical arithmetic
    a, b = rng.normal(size=(d, 12)), rng.normal(size=(d, 12))
    a64, b64 = a / np.linalg.norm(a, axis=0), b / np.linalg.norm(b, axis=0)
    matched, _ = stab.matched_cosines(a64, b64)
    arrays.update(f64_a=a, f64_b=b, f64_matched=matched, f64_overlap=np.asarray(stab.subspace_overlap(a64, b64)))
    np.savez_compressed(out / "inference_reproducibility.npz", **arrays)
    (out / "inference_reproducibility.json").write_text(json.dumps({
        "top_features": top, "random_permutations": 100, "seeds": list(stab.SEEDS),
        "blocks": [{"model": m, "layer": la, "relative_depth": q, "expansion_E": e} for m, la, q, e in blocks],
        "pairs": pairs, "layer_scale": read_csv(root / "stability_layer_scale.csv"),
    }, indent=1) + "\n")


# ---------------------------------------------------------------- AUC weights


def auc_weights(upstream: Path, out: Path) -> None:
    inf = load(upstream, "scripts/analyze_multiscale_sae_inference.py", "up_inference_auc")
    stab = load(upstream, "scripts/analyze_multiscale_sae_stability.py", "up_stability_auc")
    exps = np.asarray([1, 4, 8, 16, 32])
    eye = np.eye(len(exps))
    w_inf = [inf.normalized_log_auc(exps, eye[i]) for i in range(len(exps))]
    w_stab = [stab.normalized_log_auc(list(zip(exps.astype(float), eye[i], strict=True))) for i in range(len(exps))]
    (out / "inference_auc_weights.json").write_text(json.dumps({
        "expansions": exps.tolist(), "weights_inference": w_inf, "weights_stability": w_stab}, indent=1) + "\n")


# ---------------------------------------------------------------- random dictionaries


def random_dictionaries(upstream: Path, out: Path) -> None:
    import torch

    cal = load(upstream, "scripts/run_accessibility_calibration_worker.py", "up_calibration")
    from benchmark_v1.sae_reconciliation.batchtopk_sae import BatchTopKSAE

    torch.manual_seed(0)
    d, n_lat = 5, 12
    # directions: published encode_random_dictionary on the rows [I; -I] through a published BatchTopKSAE whose
    # normalization is the identity (mu 0, sigma 1) and whose BatchTopK keeps every positive entry
    # (k = N - 1, one batch): row i of the codes is relu(D[:, i]), row d + i is relu(-D[:, i])
    probe = BatchTopKSAE(d=d, n_features=n_lat, k=n_lat - 1)
    eye = np.concatenate([np.eye(d), -np.eye(d)]).astype(np.float32)
    dirs = []
    for i in range(RANDOM_REPLICATES):
        z = cal.encode_random_dictionary(probe, eye, np.arange(2 * d), 2 * d, "cpu", RANDOM_SEED_BASE + i).toarray()
        dirs.append((z[:d] - z[d:]).T)  # [N, d]
    # codes: the published random-dictionary encoding (BatchTopK over frozen-order batches) with k = 2, batch 8
    acts = np.random.default_rng(404).normal(size=(30, d)).astype(np.float32)
    sae = BatchTopKSAE(d=d, n_features=n_lat, k=2)
    codes = np.stack([cal.encode_random_dictionary(sae, acts, np.arange(30), 8, "cpu", RANDOM_SEED_BASE + i).toarray()
                      for i in range(3)])
    np.savez_compressed(out / "inference_random_dictionaries.npz",
                        seeds=RANDOM_SEED_BASE + np.arange(RANDOM_REPLICATES),
                        directions=np.stack(dirs).astype(np.float32), acts=acts, codes=codes.astype(np.float32),
                        k=np.asarray(2), batch=np.asarray(8))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    upstream = args.upstream.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "-C", str(upstream), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        patient_bootstrap(upstream, args.out, tmp)
        crossed_bootstrap(upstream, args.out, tmp)
        reproducibility(upstream, args.out, tmp)
    auc_weights(upstream, args.out)
    random_dictionaries(upstream, args.out)
    (args.out / "inference_fixtures.json").write_text(json.dumps({
        "upstream": "https://github.com/JayDuan123/2027-kdd-ECG-InterpBench", "commit": commit,
        "numpy": np.__version__, "command": "python tests/parity/make_fixtures_inference.py <upstream checkout>",
    }, indent=1) + "\n")


if __name__ == "__main__":
    main()
