#!/usr/bin/env python
"""Write the sparsity-sensitivity parity fixture by running the published protocol code itself.

    python tests/parity/make_fixtures_paper_analyses.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

Runs the upstream script scripts/analyze_multiscale_sae_sparsity_sensitivity.py (JayDuan123/
2027-kdd-ECG-InterpBench, imported from the checkout given, never copied) on a synthetic complete mid-depth
grid: 6 models x 5 E x 3 seeds per arm, four metrics (coverage quantized to k/49 and dead fraction to k/768, so
arm means can tie), 2,000 paired-seed draws with its default seed. It does not import raybench.

Fixtures (tests/parity/test_parity_paper_analyses.py reads them):
  paper_sensitivity.npz    the inputs: cell values [M, E, S] per arm and metric
  paper_sensitivity.json   the published outputs: rank agreement per E (Kendall tau, p, orders), per-cell and
                           per-AUC arm differences (difference, CI, two-sided p, BH q), upstream commit, command
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
COMMIT = "de4e19d9ee8786eadef9d6530a01d585f933e8fc"
MODELS = ("CARDIAC-FM", "CSFM", "ECG-FM", "ECG-JEPA", "HuBERT-ECG", "ST-MEM")  # the script's MODEL_ORDER
EXPANSIONS, SEEDS, DEPTH = (1, 4, 8, 16, 32), (4311, 4312, 4313), 0.5
COLUMNS = {"reconstruction": "test_recon_R2", "semantic_alignment": "test_semantic_alignment",
           "concept_coverage": "test_concept_coverage_020", "dead_fraction": "test_dead_fraction"}
ARMS = ("fixed_k_over_d", "fixed_k_over_n")
DRAWS = 2000


def inputs(seed: int = 11) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (len(MODELS), len(EXPANSIONS), len(SEEDS))
    out = {}
    for arm in ARMS:
        out[f"{arm}/reconstruction"] = rng.uniform(0.90, 0.99, shape)
        out[f"{arm}/semantic_alignment"] = rng.uniform(0.20, 0.40, shape)
        out[f"{arm}/concept_coverage"] = rng.integers(25, 40, shape) / 49
        out[f"{arm}/dead_fraction"] = rng.integers(0, 40, shape) / 768
    return out


def read_csv(path: Path, keep: tuple[str, ...]) -> list[dict[str, str]]:
    """The rows of a published output table, only the `keep` columns, values as written (exact reprs)."""
    with path.open(newline="") as fh:
        return [{k: row[k] for k in keep} for row in csv.DictReader(fh)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != COMMIT:
        sys.exit(f"upstream checkout is at {head.stdout.strip()}, not {COMMIT}")
    vals = inputs()
    with tempfile.TemporaryDirectory() as tmp:
        roots = {}
        for arm in ARMS:
            root = Path(tmp) / arm
            root.mkdir()
            rows = []
            for (i, m), (j, e), (k, s) in itertools.product(enumerate(MODELS), enumerate(EXPANSIONS), enumerate(SEEDS)):
                row = {"model": m, "relative_depth": DEPTH, "expansion_E": e, "seed": s, "sparsity_arm": arm}
                row.update({col: repr(float(vals[f"{arm}/{metric}"][i, j, k])) for metric, col in COLUMNS.items()})
                rows.append(row)
            with (root / "cell_metrics.csv").open("w", newline="") as fh:
                writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)
            (root / "audit.json").write_text(json.dumps({"audit_pass": True}))
            roots[arm] = root
        cmd = [sys.executable, str(args.upstream / "scripts/analyze_multiscale_sae_sparsity_sensitivity.py"),
               "--primary-root", str(roots[ARMS[0]]), "--sensitivity-root", str(roots[ARMS[1]]),
               "--bootstrap-samples", str(DRAWS)]
        subprocess.run(cmd, check=True, capture_output=True, cwd=args.upstream)
        out = roots[ARMS[1]]
        result = {
            "commit": COMMIT, "numpy": np.__version__, "bootstrap_samples": DRAWS, "bootstrap_seed": 20260714,
            "command": "scripts/analyze_multiscale_sae_sparsity_sensitivity.py --primary-root P --sensitivity-root S "
                       f"--bootstrap-samples {DRAWS} (defaults otherwise: split test, depth 0.5, seed 20260714)",
            "rank_agreement": read_csv(out / "test_sparsity_rank_agreement.csv", (
                "metric", "expansion_E", "kendall_tau", "p_value", "fixed_k_over_d_order", "fixed_k_over_N_order")),
            "cell_differences": read_csv(out / "test_sparsity_cell_differences.csv", (
                "metric", "model", "expansion_E", "fixed_k_over_N_minus_fixed_k_over_d", "ci_low", "ci_high",
                "p_two_sided", "q_bh")),
            "auc_differences": read_csv(out / "test_sparsity_auc_differences.csv", (
                "metric", "model", "fixed_k_over_N_minus_fixed_k_over_d_auc", "ci_low", "ci_high", "p_two_sided",
                "q_bh")),
        }
    args.out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out / "paper_sensitivity.npz", models=np.array(MODELS), expansions=np.array(EXPANSIONS),
                        seeds=np.array(SEEDS), **{k.replace("/", "__"): v for k, v in vals.items()})
    text = json.dumps(result, indent=0).replace("\n\"", " \"").replace("{ ", "{")  # one row per line
    (args.out / "paper_sensitivity.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
