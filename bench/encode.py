"""Extraction throughput: the Ray Data path (`extract_activations`) vs the single-process plain loop.

Generates a synthetic PTB-XL-shaped cohort (500 Hz x 10 s WFDB records), builds its manifest, then for
each model times, end to end (encoder build included on both sides, all layers stored):
  * plain loop   - `plain_loop_activations` in this process (torch uses every core), and
  * Ray path     - `extract_activations` on a local Ray instance with --cpus CPUs and --actors encoder actors.
Prints records/s, the Ray/plain ratio (target >= 0.85 on 2 cores), and store bytes per record per
layer vs raw float32 (d * 4). Random init (no checkpoints).

    python bench/encode.py --records 200 --models ecg_fm,hubert_ecg --size full
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=200)
    ap.add_argument("--models", default="ecg_fm,hubert_ecg")
    ap.add_argument("--size", choices=["demo", "full"], default="full")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--cpus", type=int, default=2, help="CPUs of the local Ray instance")
    ap.add_argument("--actors", type=int, default=1, help="encoder actors (each gets cores // actors torch threads)")
    ap.add_argument("--workdir", default=None, help="keep the cohort and stores here (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timings per path; the order alternates (plain first, then Ray first) to even out drift")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()

    import ray
    import torch

    try:
        from raybench.cohorts.ptbxl import build_synth_manifest
    except ImportError:
        from raybench.cohorts.manifest import build_synth_manifest
    from raybench.cohorts.synth import ensure_synth_cohort
    from raybench.config import EncoderConfig
    from raybench.encoders.base import EncoderSpec
    from raybench.encoders.store import ActivationStore, store_bytes

    work = Path(args.workdir or tempfile.mkdtemp(prefix="raybench-bench-encode-"))
    work.mkdir(parents=True, exist_ok=True)
    cohort = work / "cohort"
    ensure_synth_cohort(cohort, n_records=args.records, n_patients=max(1, args.records // 2), seed=3)
    manifest = build_synth_manifest(cohort, work / "manifest", sampling_rate=500, concepts="tables")
    manifest = manifest if Path(manifest).suffix == ".parquet" else Path(manifest) / "manifest.parquet"
    print(f"cohort: {args.records} records at {cohort}; torch threads {torch.get_num_threads()}, "
          f"cores {os.cpu_count()}", flush=True)

    ray.init(num_cpus=args.cpus, num_gpus=0, include_dashboard=False, log_to_driver=False)
    cfg = EncoderConfig(size=args.size, batch_size=args.batch_size, min_actors=args.actors, max_actors=args.actors)
    results = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        spec = EncoderSpec(model, size=args.size)
        run = work / f"run-{model}"

        plain_times, ray_times = [], []
        for rep in range(args.repeats):
            if rep % 2 == 0:
                plain_times.append(time_plain(manifest, spec, args.batch_size))
            ray_s, summary = time_ray(manifest, run, spec, cfg)
            ray_times.append(ray_s)
            if rep % 2 == 1:
                plain_times.append(time_plain(manifest, spec, args.batch_size))
        plain_s, ray_s = min(plain_times), min(ray_times)
        n = summary["records"]
        store = ActivationStore.for_run(run)
        d, layers = summary["d"], summary["layers"]
        per_rec = sum(store_bytes(store.layer_dir(model, la)) for la in layers) / (len(layers) * summary["records"])
        row = {"model": model, "size": args.size, "records": n, "plain_s": plain_s, "ray_s": ray_s,
               "plain_times": plain_times, "ray_times": ray_times,
               "plain_rec_s": n / plain_s, "ray_rec_s": n / ray_s, "ray_over_plain": plain_s / ray_s,
               "bytes_per_record_per_layer": per_rec, "raw_float32": d * 4, "bytes_ratio": per_rec / (d * 4),
               "ray_pipeline_rec_s": summary["records_per_s"]}
        results.append(row)
        print(f"{model:12s} best of {args.repeats}: plain {row['plain_rec_s']:6.2f} rec/s ({plain_s:6.1f} s) | "
              f"ray {row['ray_rec_s']:6.2f} "
              f"rec/s ({ray_s:6.1f} s; {summary['records_per_s']:.2f} rec/s after the driver's build) | "
              f"ray/plain {row['ray_over_plain']:.2f} | store {per_rec:.0f} B/record/layer "
              f"= {row['bytes_ratio']:.3f} x raw float32", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def time_plain(manifest: Path, spec, batch_size: int) -> float:
    from raybench.encoders.extract import plain_loop_activations

    t = time.perf_counter()
    plain_loop_activations(manifest, spec, batch_size=batch_size)
    return time.perf_counter() - t


def time_ray(manifest: Path, run: Path, spec, cfg) -> tuple[float, dict]:
    from raybench.encoders.extract import extract_activations

    shutil.rmtree(run, ignore_errors=True)
    t = time.perf_counter()
    summary = extract_activations(manifest, run, spec, cfg, progress=False)
    return time.perf_counter() - t, summary


if __name__ == "__main__":
    main()
