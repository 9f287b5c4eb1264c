#!/usr/bin/env python
"""Write the paper-numbers parity fixture by running the published protocol code itself (issue 30 items 8, 11).

    python tests/parity/make_fixtures_paper_numbers.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

Needs numpy < 2.4 (scripts/audit_multiscale_sae.py calls np.trapz) and matplotlib. Imports the upstream
checkout given (JayDuan123/2027-kdd-ECG-InterpBench, never copied); does not import raybench. Two runs:

1. scripts/audit_multiscale_sae.py (its `main`, run as a script) on a tiny complete results root laid out as
   the published code lays it out: protocol.json, training_manifest.csv with the published config hashes
   (benchmark_v1.multiscale_sae.canonical_config_hash), per cell a metrics JSON, checkpoint, concept metrics and
   firing rates, and one shared record manifest. Cell values: 3 models x 3 depths x 5 E x 2 seeds, dead
   fractions quantized to k/768 (so cells tie), R^2 uniform. Its outputs layer_scale_surface.csv (seed means per
   model x E x depth) and model_profiles.csv (validation_mean_dead_fraction / test_mean_dead_fraction: the plain
   mean over a model's depth x E configurations - the rule of Table 2's and Appendix D's dead-fraction summary).
2. scripts/analyze_multiscale_sae_sparsity_sensitivity.py on a mid-depth grid of both arms (6 models x 5 E x 3
   seeds, 200 paired-seed draws) -> test_sparsity_auc_profiles.csv and the audit's e8_anchor_max_abs_difference;
   then scripts/make_multiscale_sae_figures.py::robustness_five_panel_figure (Figure 5) on those profiles, its
   save_figure replaced by a recorder: per panel (c)-(e) the scatter points in MODEL_ORDER, axis limits and the
   diagonal.

Fixtures (tests/parity/test_parity_paper_numbers.py reads them):
  paper_numbers.npz   the inputs: audit cells [M, D, E, S] per metric; sensitivity cells [M, E, S] per arm, metric
  paper_numbers.json  the published outputs: model_profiles rows, surface rows, sensitivity AUC profiles, the
                      E = 8 anchor, the figure's panels (c)-(e); upstream commit, numpy, commands
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
EXPANSIONS = (1, 4, 8, 16, 32)
# part 1: the audit's model profiles
A_MODELS = ("CARDIAC-FM", "ECG-FM", "HuBERT-ECG")
A_DEPTHS, A_SEEDS, D_HIDDEN, N_LAYERS = (0.0, 0.5, 1.0), (4311, 4312), 16, 12
# part 2: the sparsity-sensitivity profiles and Figure 5c-e
S_MODELS = ("CARDIAC-FM", "CSFM", "ECG-FM", "ECG-JEPA", "HuBERT-ECG", "ST-MEM")  # the scripts' MODEL_ORDER
S_SEEDS, S_DRAWS = (4311, 4312, 4313), 200
S_COLUMNS = {"reconstruction": "test_recon_R2", "semantic_alignment": "test_semantic_alignment",
             "concept_coverage": "test_concept_coverage_020", "dead_fraction": "test_dead_fraction"}
ARMS = ("fixed_k_over_d", "fixed_k_over_n")


def audit_inputs(seed: int = 31) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (len(A_MODELS), len(A_DEPTHS), len(EXPANSIONS), len(A_SEEDS))
    grow = np.array([0, 40, 120, 300, 500])[None, None, :, None]  # dead fraction grows with E, as in the paper
    return {"validation_dead_fraction": np.clip(grow + rng.integers(0, 60, shape), 0, 768) / 768,
            "test_dead_fraction": np.clip(grow + rng.integers(0, 60, shape), 0, 768) / 768,
            "validation_recon_R2": rng.uniform(0.90, 0.99, shape), "test_recon_R2": rng.uniform(0.90, 0.99, shape)}


def sensitivity_inputs(seed: int = 37) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (len(S_MODELS), len(EXPANSIONS), len(S_SEEDS))
    out = {}
    for arm in ARMS:
        out[f"{arm}/reconstruction"] = rng.uniform(0.90, 0.99, shape)
        out[f"{arm}/semantic_alignment"] = rng.uniform(0.20, 0.40, shape)
        out[f"{arm}/concept_coverage"] = rng.integers(25, 40, shape) / 49
        out[f"{arm}/dead_fraction"] = rng.integers(0, 400, shape) / 768
    return out


def write_rows(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path, keep: tuple[str, ...]) -> list[dict[str, str]]:
    """A published output table's rows, only the `keep` columns, values as written (exact reprs)."""
    with path.open(newline="") as fh:
        return [{k: row[k] for k in keep} for row in csv.DictReader(fh)]


def run_audit(upstream: Path, tmp: Path, vals: dict[str, np.ndarray]) -> dict:
    sys.path.insert(0, str(upstream))
    from benchmark_v1.multiscale_sae import canonical_config_hash  # the published hash, so every cell is complete

    root = tmp / "audit"
    cells = root / "cells"
    cells.mkdir(parents=True)
    (root / "protocol.json").write_text(json.dumps({"models": list(A_MODELS), "relative_depths": list(A_DEPTHS),
                                                    "expansion_E": list(EXPANSIONS), "seeds": list(A_SEEDS)}))
    records = root / "records.csv"
    write_rows(records, [{"ecg_id": i, "split": s} for i, s in enumerate(("train", "validation", "test"))])
    rows = []
    for t, ((i, m), (j, q), (k, e), (s_i, s)) in enumerate(itertools.product(
            enumerate(A_MODELS), enumerate(A_DEPTHS), enumerate(EXPANSIONS), enumerate(A_SEEDS))):
        n_feat, kk = D_HIDDEN * e, D_HIDDEN // 8
        layer = int(np.floor(q * (N_LAYERS - 1) + 0.5))
        row = {"task_index": t, "model": m, "feature_suffix": "x", "layer": layer, "relative_depth": q,
               "actual_relative_depth": layer / (N_LAYERS - 1), "n_layers": N_LAYERS, "d_hidden": D_HIDDEN,
               "sparsity_arm": "fixed_k_over_d", "expansion_E": e, "N": n_feat, "k": kk, "seed": s, "steps": 10,
               "batch_size": 4, "learning_rate": 0.001}
        row["config_hash"] = canonical_config_hash(row)
        base = cells / f"cell{t:04d}"
        split = {name: {} for name in ("validation", "test")}
        for name in ("validation", "test"):
            split[name] = {"recon_R2": float(vals[f"{name}_recon_R2"][i, j, k, s_i]),
                           "dead_fraction": float(vals[f"{name}_dead_fraction"][i, j, k, s_i]),
                           "mean_l0": 2.0, "mean_train_selected_abs_correlation": 0.3,
                           "coverage_abs_r_ge_0_20": 0.5}
        Path(f"{base}.json").write_text(json.dumps({"status": "complete", "config_hash": row["config_hash"], **split}))
        Path(f"{base}.pt").write_bytes(b"checkpoint")
        write_rows(Path(f"{base}_concepts.csv"), [{"concept": "c", "split": sp} for sp in ("validation", "test")])
        np.save(f"{base}_firing.npy", np.zeros(n_feat))
        row.update(checkpoint=f"{base}.pt", metrics=f"{base}.json", concept_metrics=f"{base}_concepts.csv",
                   firing_rate=f"{base}_firing.npy", records_path=str(records))
        rows.append(row)
    write_rows(root / "training_manifest.csv", rows)
    cmd = [sys.executable, str(upstream / "scripts/audit_multiscale_sae.py"), "--root", str(root),
           "--expected-concepts", "1"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=upstream)
    audit = json.loads((root / "audit.json").read_text())
    if not audit["audit_pass"]:
        sys.exit(f"the published audit did not pass on the fixture root: {audit}")
    return {
        "audit_command": "scripts/audit_multiscale_sae.py --root R --expected-concepts 1",
        "model_profiles": read_rows(root / "model_profiles.csv", (
            "model", "n_layer_scale_cells", "validation_mean_dead_fraction", "test_mean_dead_fraction")),
        "surface": read_rows(root / "layer_scale_surface.csv", (
            "model", "expansion_E", "relative_depth", "validation_recon_R2_mean", "validation_dead_fraction_mean",
            "test_dead_fraction_mean")),
    }


class Recorder:
    """Stands in for the figure script's save_figure: keeps what panels (c)-(e) draw."""

    def __init__(self) -> None:
        self.panels: list[dict] = []

    def __call__(self, fig, path) -> None:
        for ax in fig.axes[2:5]:
            points = [[float(v) for v in c.get_offsets()[0]] for c in ax.collections]
            (diag,) = ax.lines
            self.panels.append({"title": ax.get_title(), "points": points,
                                "xlim": [float(v) for v in ax.get_xlim()], "ylim": [float(v) for v in ax.get_ylim()],
                                "diagonal_x": [float(v) for v in diag.get_xdata()],
                                "diagonal_y": [float(v) for v in diag.get_ydata()]})


def run_sensitivity(upstream: Path, tmp: Path, vals: dict[str, np.ndarray]) -> dict:
    roots = {}
    for arm in ARMS:
        root = tmp / arm
        root.mkdir()
        rows = []
        for (i, m), (j, e), (k, s) in itertools.product(enumerate(S_MODELS), enumerate(EXPANSIONS), enumerate(S_SEEDS)):
            row = {"model": m, "relative_depth": 0.5, "expansion_E": e, "seed": s, "sparsity_arm": arm}
            row.update({col: repr(float(vals[f"{arm}/{metric}"][i, j, k])) for metric, col in S_COLUMNS.items()})
            rows.append(row)
        write_rows(root / "cell_metrics.csv", rows)
        (root / "audit.json").write_text(json.dumps({"audit_pass": True}))
        roots[arm] = root
    cmd = [sys.executable, str(upstream / "scripts/analyze_multiscale_sae_sparsity_sensitivity.py"),
           "--primary-root", str(roots[ARMS[0]]), "--sensitivity-root", str(roots[ARMS[1]]),
           "--bootstrap-samples", str(S_DRAWS)]
    subprocess.run(cmd, check=True, capture_output=True, cwd=upstream)
    out = roots[ARMS[1]]
    audit = json.loads((out / "test_sparsity_sensitivity_audit.json").read_text())

    import matplotlib
    import pandas as pd

    matplotlib.use("Agg")
    sys.path.insert(0, str(upstream / "scripts"))
    figures = importlib.import_module("make_multiscale_sae_figures")
    recorder = Recorder()
    figures.save_figure = recorder
    stability = pd.DataFrame([{"model": m, "expansion_E": e, "stability_above_random_mean": 0.3,
                               "subspace_overlap_mean": 0.7} for m in S_MODELS for e in EXPANSIONS])
    figures.robustness_five_panel_figure(stability, pd.read_csv(out / "test_sparsity_auc_profiles.csv"),
                                         tmp / "figure")
    return {
        "sensitivity_command": "scripts/analyze_multiscale_sae_sparsity_sensitivity.py --primary-root P "
                               f"--sensitivity-root S --bootstrap-samples {S_DRAWS}",
        "figure_call": "scripts/make_multiscale_sae_figures.py::robustness_five_panel_figure(stability, "
                       "test_sparsity_auc_profiles.csv, out), save_figure recorded",
        "bootstrap_samples": S_DRAWS,
        "auc_profiles": read_rows(out / "test_sparsity_auc_profiles.csv", (
            "metric", "sparsity_arm", "model", "observed_common_scale_auc")),
        "e8_anchor_max_abs_difference": audit["e8_anchor_max_abs_difference"],
        "figure_panels": recorder.panels,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != COMMIT:
        sys.exit(f"upstream checkout is at {head.stdout.strip()}, not {COMMIT}")
    a_vals, s_vals = audit_inputs(), sensitivity_inputs()
    with tempfile.TemporaryDirectory() as tmp:
        result = {"commit": COMMIT, "numpy": np.__version__, **run_audit(args.upstream.resolve(), Path(tmp), a_vals),
                  **run_sensitivity(args.upstream.resolve(), Path(tmp), s_vals)}
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "paper_numbers.npz", audit_models=np.array(A_MODELS),
                        audit_depths=np.array(A_DEPTHS), audit_seeds=np.array(A_SEEDS), expansions=np.array(EXPANSIONS),
                        sens_models=np.array(S_MODELS), sens_seeds=np.array(S_SEEDS),
                        **{f"audit__{k}": v for k, v in a_vals.items()},
                        **{f"sens__{k.replace('/', '__')}": v for k, v in s_vals.items()})
    text = json.dumps(result, indent=0).replace("\n\"", " \"").replace("{ ", "{")  # one row per line
    (args.out / "paper_numbers.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
