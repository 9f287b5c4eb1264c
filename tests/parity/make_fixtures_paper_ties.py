#!/usr/bin/env python
"""Write the ties parity fixture (issue 30 items 1-4) by running the published protocol code itself.

    python tests/parity/make_fixtures_paper_ties.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

The upstream checkout (JayDuan123/2027-kdd-ECG-InterpBench) is imported or run, never copied. Three runs on
small synthetic inputs built so that models tie (identical cell values, hence identical means in any
arithmetic):

- scripts/analyze_multiscale_sae_inference.py (main, in a temporary folder) on a complete 6 models x 5 depths x
  5 E x 3 seeds grid: its scale rank stability (Kendall tau, p and both orders per E pair) and its crossed-
  bootstrap model pairs (model_left, model_right, difference, CI, p, BH q; 2,000 draws, its default seed).
  Ties: CSFM = CARDIAC-FM in every cell of dead fraction (so their AUCs tie too) and at some E of the other
  metrics, more pairs at other E (a three-way tie in coverage at E = 32).
- scripts/analyze_multiscale_sae_sparsity_sensitivity.py (main) on a mid-depth grid of both arms with CSFM
  and CARDIAC-FM tied in one arm at one E per metric: rank agreement per E and the AUC differences.
- scripts/summarize_multiscale_sae_patient_bootstrap.py (main) on per-cell patient-bootstrap distributions of
  the same grid shape (100 draws, 2 concepts): its model profiles, pairs and rank probabilities.
  Ties in every draw: CSFM = CARDIAC-FM in coverage (the top two), ECG-FM = ECG-JEPA in reconstruction.
- benchmark_v1/multiscale_sae.py::sparsity_for (the k rule of both arms) over widths d and expansions E whose
  d / 8 or N / 64 fall on halves, and the cases it refuses (k >= N).

The inference script calls `np.trapz`, removed in numpy 2.4: run this with numpy < 2.4. It does not import
raybench.

Fixtures (tests/parity/test_parity_paper_ties.py reads them):
  paper_ties.npz    the inputs: the inference grid [M, D, E, S] per metric column, the arms' grids [M, E, S],
                    the patient-bootstrap cells as integer numerators (patient_inputs, patient_values)
  paper_ties.json   the published outputs, the k table, upstream commit, versions, command
"""

from __future__ import annotations

import argparse
import csv
import importlib
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMMIT = "de4e19d9ee8786eadef9d6530a01d585f933e8fc"
MODELS = ("CARDIAC-FM", "CSFM", "ECG-FM", "ECG-JEPA", "HuBERT-ECG", "ST-MEM")  # the scripts' MODEL_ORDER
DEPTHS, EXPANSIONS, SEEDS = (0.0, 0.25, 0.5, 0.75, 1.0), (1, 4, 8, 16, 32), (4311, 4312, 4313)
COLUMNS = {"reconstruction": "test_recon_R2", "semantic_alignment": "test_semantic_alignment",
           "concept_coverage": "test_concept_coverage_020", "dead_fraction": "test_dead_fraction"}
ARMS = ("fixed_k_over_d", "fixed_k_over_n")
SEED, DRAWS = 20260714, 2000
PATIENT_DRAWS, N_CONCEPTS = 100, 2
PATIENT_METRICS = ("recon_R2", "semantic_alignment", "concept_coverage_020")
K_WIDTHS = (1, 2, 4, 5, 8, 12, 20, 24, 28, 36, 44, 52, 60, 100, 256, 768, 1024)
K_EXPANSIONS = (1, 2, 4, 8, 16, 32)
# (metric, E index, tied models: the first one's cells are copied to the others); indices into MODELS
GRID_TIES = (("reconstruction", 0, (0, 1)), ("reconstruction", 2, (0, 1)), ("semantic_alignment", 1, (2, 3)),
             ("semantic_alignment", 3, (4, 5)), ("concept_coverage", 0, (0, 1)), ("concept_coverage", 1, (0, 1)),
             ("concept_coverage", 4, (2, 3, 4)), ("dead_fraction", 0, (4, 5)))
ARM_TIES = (("fixed_k_over_d", "reconstruction", 2), ("fixed_k_over_n", "semantic_alignment", 0),
            ("fixed_k_over_d", "concept_coverage", 2), ("fixed_k_over_n", "dead_fraction", 1),
            ("fixed_k_over_d", "dead_fraction", 4))


def draw(rng: np.random.Generator, metric: str, shape: tuple[int, ...]) -> np.ndarray:
    """Synthetic values of one metric: coverage quantized to k/49 and dead fraction to k/768, as real ones are."""
    if metric == "reconstruction":
        return rng.uniform(0.90, 0.99, shape)
    if metric == "semantic_alignment":
        return rng.uniform(0.20, 0.40, shape)
    if metric == "concept_coverage":
        return rng.integers(25, 40, shape) / 49
    return rng.integers(0, 40, shape) / 768


def grid_inputs(seed: int = 30) -> dict[str, np.ndarray]:
    """The inference grid [M, D, E, S] per metric with GRID_TIES; dead fraction: CSFM = CARDIAC-FM everywhere."""
    rng = np.random.default_rng(seed)
    out = {}
    for metric in COLUMNS:
        v = draw(rng, metric, (len(MODELS), len(DEPTHS), len(EXPANSIONS), len(SEEDS)))
        for name, e, (base, *others) in GRID_TIES:
            if name == metric:
                for o in others:
                    v[o, :, e] = v[base, :, e]
        if metric == "dead_fraction":
            v[1] = v[0]
        out[metric] = v
    return out


def arm_inputs(seed: int = 31) -> dict[str, np.ndarray]:
    """Both arms' mid-depth grids [M, E, S] per metric; ARM_TIES: CSFM = CARDIAC-FM in one arm at one E."""
    rng = np.random.default_rng(seed)
    out = {}
    for arm in ARMS:
        for metric in COLUMNS:
            v = draw(rng, metric, (len(MODELS), len(EXPANSIONS), len(SEEDS)))
            for a, name, e in ARM_TIES:
                if (a, name) == (arm, metric):
                    v[1, e] = v[0, e]
            out[f"{arm}/{metric}"] = v
    return out


def patient_inputs(seed: int = 32) -> dict[str, np.ndarray]:
    """Per cell [M, D, E, S] (then draws, concepts): integer numerators of the observed values and the
    PATIENT_DRAWS draws, stored as such (values = patient_values(these)).

    Reconstruction k/10,000; |r| per concept k/1,000, accessibility their mean (the summary checks its concept
    profile against it); coverage k/49. CSFM copies CARDIAC-FM's coverage (the two lead it), ECG-JEPA copies
    ECG-FM's reconstruction, in every draw.
    """
    rng = np.random.default_rng(seed)
    shape = (len(MODELS), len(DEPTHS), len(EXPANSIONS), len(SEEDS))
    lift = np.array([200, 0, 300, 0, 100, 0])[:, None, None, None]
    recon = rng.integers(9000, 9700, shape) + lift
    recon_d = recon[..., None] + rng.integers(-100, 101, (*shape, PATIENT_DRAWS))
    r = rng.integers(100, 500, (*shape, N_CONCEPTS))
    r_d = r[..., None, :] + rng.integers(-30, 31, (*shape, PATIENT_DRAWS, N_CONCEPTS))
    cover = rng.integers(20, 30, shape) + 6 * (np.arange(len(MODELS)) < 2)[:, None, None, None]
    cover_d = np.clip(cover[..., None] + rng.integers(-3, 4, (*shape, PATIENT_DRAWS)), 0, 49)
    for v in (cover, cover_d):
        v[1] = v[0]
    for v in (recon, recon_d):
        v[3] = v[2]
    return {"recon_k": recon.astype(np.int16), "recon_draws_k": recon_d.astype(np.int16),
            "r_k": r.astype(np.int16), "r_draws_k": r_d.astype(np.int16),
            "cover_k": cover.astype(np.int8), "cover_draws_k": cover_d.astype(np.int8)}


def patient_values(ints: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float64 values the summary reads: observed_<metric> and <metric> [..., draws], r and r draws."""
    r, r_d = ints["r_k"] / 1000, ints["r_draws_k"] / 1000
    return {"observed_r": r, "draws_r": r_d,
            "observed__recon_R2": ints["recon_k"] / 10000, "draws__recon_R2": ints["recon_draws_k"] / 10000,
            "observed__semantic_alignment": np.abs(r).mean(axis=-1),
            "draws__semantic_alignment": np.abs(r_d).mean(axis=-1),
            "observed__concept_coverage_020": ints["cover_k"] / 49,
            "draws__concept_coverage_020": ints["cover_draws_k"] / 49}


def write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path, keep: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of a published output table, only the `keep` columns, values as written (exact reprs)."""
    with path.open(newline="") as fh:
        return [{k: row[k] for k in keep} for row in csv.DictReader(fh)]


def run_inference(upstream: Path, tmp: Path, grid: dict[str, np.ndarray]) -> dict:
    root = tmp / "multiscale"
    root.mkdir()
    (root / "audit.json").write_text(json.dumps({"audit_pass": True}))
    rows = []
    for (i, m), (j, q), (k, e), (u, s) in itertools.product(enumerate(MODELS), enumerate(DEPTHS),
                                                            enumerate(EXPANSIONS), enumerate(SEEDS)):
        rows.append({"model": m, "relative_depth": q, "expansion_E": e, "seed": s,
                     **{col: repr(float(grid[metric][i, j, k, u])) for metric, col in COLUMNS.items()}})
    write_csv(root / "cell_metrics.csv", rows)
    subprocess.run([sys.executable, str(upstream / "scripts/analyze_multiscale_sae_inference.py"), "--root",
                    str(root), "--bootstrap-samples", str(DRAWS)], check=True, capture_output=True, cwd=upstream)
    return {
        "command": f"scripts/analyze_multiscale_sae_inference.py --root R --bootstrap-samples {DRAWS} "
                   "(defaults otherwise: split test, seed 20260714)",
        "rank_stability": read_csv(root / "test_scale_rank_stability.csv", (
            "metric", "expansion_left", "expansion_right", "kendall_tau", "p_value", "rank_order_left",
            "rank_order_right")),
        "pairs": read_csv(root / "test_model_pair_inference.csv", (
            "metric", "model_left", "model_right", "observed_difference", "ci_low", "ci_high", "p_two_sided",
            "q_bh")),
    }


def run_sensitivity(upstream: Path, tmp: Path, arms: dict[str, np.ndarray]) -> dict:
    roots = {}
    for arm in ARMS:
        root = tmp / arm
        root.mkdir()
        rows = []
        for (i, m), (j, e), (k, s) in itertools.product(enumerate(MODELS), enumerate(EXPANSIONS), enumerate(SEEDS)):
            rows.append({"model": m, "relative_depth": 0.5, "expansion_E": e, "seed": s, "sparsity_arm": arm,
                         **{col: repr(float(arms[f"{arm}/{metric}"][i, j, k])) for metric, col in COLUMNS.items()}})
        write_csv(root / "cell_metrics.csv", rows)
        (root / "audit.json").write_text(json.dumps({"audit_pass": True}))
        roots[arm] = root
    subprocess.run([sys.executable, str(upstream / "scripts/analyze_multiscale_sae_sparsity_sensitivity.py"),
                    "--primary-root", str(roots[ARMS[0]]), "--sensitivity-root", str(roots[ARMS[1]]),
                    "--bootstrap-samples", str(DRAWS)], check=True, capture_output=True, cwd=upstream)
    out = roots[ARMS[1]]
    return {
        "command": "scripts/analyze_multiscale_sae_sparsity_sensitivity.py --primary-root P --sensitivity-root S "
                   f"--bootstrap-samples {DRAWS} (defaults otherwise: split test, depth 0.5, seed 20260714)",
        "rank_agreement": read_csv(out / "test_sparsity_rank_agreement.csv", (
            "metric", "expansion_E", "kendall_tau", "p_value", "fixed_k_over_d_order", "fixed_k_over_N_order")),
        "auc_differences": read_csv(out / "test_sparsity_auc_differences.csv", (
            "metric", "model", "fixed_k_over_N_minus_fixed_k_over_d_auc", "ci_low", "ci_high", "p_two_sided",
            "q_bh")),
    }


def run_patient_summary(upstream: Path, tmp: Path, cells: dict[str, np.ndarray]) -> dict:
    root = tmp / "patient"
    root.mkdir()
    (root / "audit.json").write_text(json.dumps({"audit_pass": True, "matched_scale_grid_pass": True}))
    manifest = []
    same = {"patient_id_hash": "p", "patient_cluster_hash": "c", "bootstrap_design_hash": "d",
            "patient_bootstrap_protocol": "synthetic", "n_patients": 100, "bootstrap_samples": PATIENT_DRAWS,
            "bootstrap_seed": SEED}
    for (i, m), (j, q), (k, e), (u, s) in itertools.product(enumerate(MODELS), enumerate(DEPTHS),
                                                            enumerate(EXPANSIONS), enumerate(SEEDS)):
        task = len(manifest)
        ident = {"task_index": task, "config_hash": f"h{task}", "model": m, "relative_depth": q, "expansion_E": e,
                 "seed": s}
        manifest.append(ident)
        folder = root / "patient_bootstrap" / f"task_{task:06d}"
        folder.mkdir(parents=True)
        (folder / "test_patient_bootstrap.json").write_text(json.dumps({"status": "complete", "split": "test",
                                                                        **ident, **same}))
        at = (i, j, k, u)
        # the draws as the published worker stores them (float32), the observed values in float64
        np.savez(folder / "test_patient_bootstrap.npz", concept_names=np.array([f"c{c}" for c in range(N_CONCEPTS)]),
                 concept_correlation=cells["draws_r"][at].astype(np.float32),
                 observed_concept_correlation=cells["observed_r"][at],
                 **{metric: cells[f"draws__{metric}"][at].astype(np.float32) for metric in PATIENT_METRICS},
                 **{f"observed_{metric}": np.asarray(cells[f"observed__{metric}"][at]) for metric in PATIENT_METRICS})
    write_csv(root / "training_manifest.csv", manifest)
    subprocess.run([sys.executable, str(upstream / "scripts/summarize_multiscale_sae_patient_bootstrap.py"),
                    "--root", str(root)], check=True, capture_output=True, cwd=upstream)
    return {
        "command": "scripts/summarize_multiscale_sae_patient_bootstrap.py --root R (defaults otherwise: split test)",
        "profiles": read_csv(root / "test_patient_bootstrap_model_profiles.csv", (
            "metric", "model", "observed_common_scale_auc", "ci_low", "ci_high")),
        "pairs": read_csv(root / "test_patient_bootstrap_model_pairs.csv", (
            "metric", "model_left", "model_right", "observed_difference", "ci_low", "ci_high", "p_two_sided",
            "q_bh")),
        "ranks": [r for r in read_csv(root / "test_patient_bootstrap_rank_probabilities.csv", (
            "metric", "scope", "model", "mean_rank", "probability_rank_1")) if r["scope"] == "common_scale_auc"],
        "matched_scales": read_csv(root / "test_patient_bootstrap_matched_scales.csv", (
            "metric", "model", "expansion_E", "observed", "ci_low", "ci_high")),
    }


def k_table(upstream: Path) -> list[dict]:
    """sparsity_for(arm, E, d) -> (N, k), or the refusal, for every arm, E and d."""
    if str(upstream) not in sys.path:
        sys.path.insert(0, str(upstream))
    mod = importlib.import_module("benchmark_v1.multiscale_sae")
    if not Path(mod.__file__).resolve().is_relative_to(upstream.resolve()):
        sys.exit(f"benchmark_v1 imported from {mod.__file__}, not from {upstream}")
    rows = []
    for arm, e, d in itertools.product(ARMS, K_EXPANSIONS, K_WIDTHS):
        try:
            n, k = mod.sparsity_for(arm, e, d)
            rows.append({"arm": arm, "expansion": e, "d": d, "N": n, "k": k})
        except ValueError as err:
            rows.append({"arm": arm, "expansion": e, "d": d, "error": str(err)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != COMMIT:
        sys.exit(f"upstream checkout is at {head.stdout.strip()}, not {COMMIT}")
    grid, arms, cells = grid_inputs(), arm_inputs(), patient_inputs()
    import pandas
    import scipy

    with tempfile.TemporaryDirectory() as tmp:
        result = {"commit": COMMIT, "numpy": np.__version__, "scipy": scipy.__version__,
                  "pandas": pandas.__version__, "bootstrap_samples": DRAWS, "bootstrap_seed": SEED,
                  "metric_columns": COLUMNS, "grid_ties": GRID_TIES, "arm_ties": ARM_TIES,
                  "inference": run_inference(args.upstream, Path(tmp), grid),
                  "sensitivity": run_sensitivity(args.upstream, Path(tmp), arms),
                  "patient_bootstrap": run_patient_summary(args.upstream, Path(tmp), patient_values(cells)),
                  "k_rule": {"function": "benchmark_v1/multiscale_sae.py::sparsity_for",
                             "rows": k_table(args.upstream)}}
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "paper_ties.npz", models=np.array(MODELS), depths=np.array(DEPTHS),
                        expansions=np.array(EXPANSIONS), seeds=np.array(SEEDS),
                        **{f"grid__{m}": v for m, v in grid.items()},
                        **{k.replace("/", "__"): v for k, v in arms.items()},
                        **{f"patient__{k}": v for k, v in cells.items()})
    text = json.dumps(result, indent=0).replace("\n\"", " \"").replace("{ ", "{")  # one row per line
    (args.out / "paper_ties.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
