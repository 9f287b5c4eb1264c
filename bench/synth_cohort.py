"""Time the synthetic cohort generator and the manifest builder (prints figures; no asserts).

    python bench/synth_cohort.py [--records 2000] [--patients 600] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from raybench.cohorts.manifest import load_manifest
from raybench.cohorts.ptbxl import build_synth_manifest
from raybench.cohorts.synth import generate_synth_cohort


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=2000)
    ap.add_argument("--patients", type=int, default=600)
    ap.add_argument("--bad-fraction", type=float, default=0.01)
    ap.add_argument("--out", type=Path, default=None, help="work folder (default: a temp folder, removed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.out or Path(tmp)
        load = os.getloadavg()[0]
        t0, c0 = time.perf_counter(), time.process_time()
        cohort = generate_synth_cohort(work / "cohort", args.records, args.patients, seed=7,
                                       bad_fraction=args.bad_fraction)
        gen, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
        size = sum(f.stat().st_size for f in cohort.rglob("*") if f.is_file())
        t0 = time.perf_counter()
        path = build_synth_manifest(cohort, work / "manifest", sampling_rate=500, concepts="tables")
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        df, info = load_manifest(path)
        load_s = time.perf_counter() - t0
        summary = json.loads((path.parent / "summary.json").read_text())
        print(f"cpus={os.cpu_count()} load_avg_1min={load:.1f}")
        print(f"synth: {args.records} records ({args.patients} patients) in {gen:.1f} s = "
              f"{args.records / gen:.0f} records/s (CPU {gen_cpu:.1f} s = {args.records / gen_cpu:.0f} records/CPU-s); "
              f"{size / 1e6:.0f} MB on disk")
        print(f"manifest (500 Hz, 49 table concepts): {build:.2f} s = {args.records / build:.0f} records/s; "
              f"{summary['records']} kept, {summary['quarantined']} quarantined {summary['quarantine_reasons']}")
        print(f"load_manifest (with hash check): {load_s:.3f} s; hash {info.manifest_hash}")


if __name__ == "__main__":
    main()
