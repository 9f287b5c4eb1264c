#!/usr/bin/env python
"""Write the patient-bootstrap rank and surface parity fixture (issue 42 item 4) by running the published summary.

    python tests/parity/make_fixtures_patient_ranks.py /path/to/2027-kdd-ECG-InterpBench [--out tests/parity]

Runs scripts/summarize_multiscale_sae_patient_bootstrap.py (JayDuan123/2027-kdd-ECG-InterpBench, the checkout
given; nothing copied) on the patient-bootstrap cells of paper_ties.npz (make_fixtures_paper_ties.patient_inputs,
whose run_patient_summary lays them out as the published worker stores them), and keeps what that fixture
left out: every row of its rank-probability table (the common-scale AUC and each E1 ... E32: mean rank, median
rank, rank-1 and top-2 probability) and its model x depth x E surface (seed-mean observed value and 95 %
patient-bootstrap interval). It does not import raybench. Needs numpy < 2.4 (the script's np.trapz fallback
is evaluated eagerly).

Fixture: patient_ranks.json (commit, versions, command, the two tables as written: exact reprs).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_fixtures_paper_ties as ties  # noqa: E402  (the same inputs, laid out the same way)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("upstream", type=Path, help="checkout of JayDuan123/2027-kdd-ECG-InterpBench")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    head = subprocess.run(["git", "-C", str(args.upstream), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0 and head.stdout.strip() != ties.COMMIT:
        sys.exit(f"upstream checkout is at {head.stdout.strip()}, not {ties.COMMIT}")
    cells = ties.patient_inputs()
    with np.load(HERE / "paper_ties.npz") as z:  # the very cells test_parity_paper_ties.py reads
        for k, v in cells.items():
            if not np.array_equal(z[f"patient__{k}"], v):
                sys.exit(f"patient_inputs() no longer gives paper_ties.npz's patient__{k}")
    with tempfile.TemporaryDirectory() as tmp:
        ties.run_patient_summary(args.upstream, Path(tmp), ties.patient_values(cells))
        root = Path(tmp) / "patient"
        with (root / "test_patient_bootstrap_rank_probabilities.csv").open(newline="") as fh:
            ranks = list(csv.DictReader(fh))
        with (root / "test_patient_bootstrap_surface.csv").open(newline="") as fh:
            surface = list(csv.DictReader(fh))
    out = {"commit": ties.COMMIT, "numpy": np.__version__,
           "command": "scripts/summarize_multiscale_sae_patient_bootstrap.py --root R (defaults otherwise: split "
                      "test) on paper_ties.npz's patient__* cells",
           "ranks": ranks, "surface": surface}
    args.out.mkdir(parents=True, exist_ok=True)
    text = json.dumps(out, indent=0).replace("\n\"", " \"").replace("{ ", "{")
    (args.out / "patient_ranks.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
