"""Extraction throughput: the Ray Data path (`extract_activations`) vs the single-process plain loop.

Generates a synthetic PTB-XL-shaped cohort (500 Hz x 10 s WFDB records), builds its manifest, then for
each model times, end to end (encoder build included on both sides, all layers stored):
  * plain loop   - `plain_loop_activations` in this process (torch uses every core), and
  * Ray path     - `extract_activations` on a local Ray instance with --cpus CPUs and --actors encoder actors.
Prints records/s, the Ray/plain ratio (target >= 0.85 on 2 cores), and store bytes per record per
layer vs raw float32 (d * 4). Random init (no checkpoints). With two or more cohort sizes it also prints
the marginal rate between the smallest and largest (extra records / extra seconds): the throughput once
both paths are running, without the Ray path's fixed start-up (actor processes, imports, encoder fetch).

    python bench/encode.py --records 200 --models ecg_fm,hubert_ecg --size full
    python bench/encode.py --records 120 500 --actors 2
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
    ap.add_argument("--records", type=int, nargs="+", default=[200], help="cohort size(s)")
    ap.add_argument("--models", default="ecg_fm,hubert_ecg")
    ap.add_argument("--size", choices=["demo", "full"], default="full")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--cpus", type=int, default=2,
                    help="CPUs of the local Ray instance (with RAY_ADDRESS set: that cluster's instead)")
    ap.add_argument("--actors", type=int, default=1, help="encoder actors (each gets cores // actors torch threads)")
    ap.add_argument("--workdir", default=None, help="keep the cohort and stores here (default: a temp dir)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="timings per path; the order alternates (plain first, then Ray first) to even out drift")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args()

    import torch

    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import ensure_synth_cohort
    from raybench.core.config import EncoderConfig, ResourceConfig
    from raybench.encoders.base import EncoderSpec
    from raybench.infra.ray_session import init_ray

    work = Path(args.workdir or tempfile.mkdtemp(prefix="raybench-bench-encode-"))
    work.mkdir(parents=True, exist_ok=True)
    manifests = {}
    for n_rec in sorted(set(args.records)):
        cohort = work / f"cohort-{n_rec}"
        ensure_synth_cohort(cohort, n_records=n_rec, n_patients=max(1, n_rec // 2), seed=3)
        manifests[n_rec] = build_synth_manifest(cohort, work / f"manifest-{n_rec}", sampling_rate=500,
                                                concepts="tables")  # -> the manifest.parquet path
    print(f"cohorts: {sorted(manifests)} records under {work}; torch threads {torch.get_num_threads()}, "
          f"cores {os.cpu_count()}", flush=True)

    # raybench's own start (a quiet local instance, or the cluster RAY_ADDRESS names)
    init_ray(ResourceConfig(num_cpus=args.cpus, num_gpus=0))
    cfg = EncoderConfig(size=args.size, batch_size=args.batch_size, min_actors=args.actors, max_actors=args.actors)
    results = []
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        spec = EncoderSpec(model, size=args.size)
        rows = {n_rec: bench_one(manifest, work / f"run-{model}-{n_rec}", spec, cfg, args)
                for n_rec, manifest in manifests.items()}
        results.extend(rows.values())
        if len(rows) > 1:
            lo, hi = rows[min(rows)], rows[max(rows)]
            extra = hi["records"] - lo["records"]
            plain_rate, ray_rate = extra / (hi["plain_s"] - lo["plain_s"]), extra / (hi["ray_s"] - lo["ray_s"])
            fixed_ray = lo["ray_s"] - lo["records"] / ray_rate
            fixed_plain = lo["plain_s"] - lo["records"] / plain_rate
            print(f"{model:12s} marginal {lo['records']}->{hi['records']} records: plain {plain_rate:6.2f} rec/s | "
                  f"ray {ray_rate:6.2f} rec/s | ray/plain {ray_rate / plain_rate:.2f} | fixed start-up: ray "
                  f"{fixed_ray:.1f} s, plain {fixed_plain:.1f} s", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)


def bench_one(manifest: Path, run: Path, spec, cfg, args) -> dict:
    """Best-of-repeats timings of both paths over one manifest; prints and returns one result row."""
    from raybench.encoders.store import ActivationStore, store_bytes

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
    per_rec = sum(store_bytes(store.layer_dir(spec.name, la)) for la in layers) / (len(layers) * n)
    row = {"model": spec.name, "size": args.size, "records": n, "plain_s": plain_s, "ray_s": ray_s,
           "plain_times": plain_times, "ray_times": ray_times,
           "plain_rec_s": n / plain_s, "ray_rec_s": n / ray_s, "ray_over_plain": plain_s / ray_s,
           "bytes_per_record_per_layer": per_rec, "raw_float32": d * 4, "bytes_ratio": per_rec / (d * 4),
           "ray_pipeline_rec_s": summary["records_per_s"]}
    print(f"{spec.name:12s} {n:5d} records, best of {args.repeats}: plain {row['plain_rec_s']:6.2f} rec/s "
          f"({plain_s:6.1f} s) | ray {row['ray_rec_s']:6.2f} rec/s ({ray_s:6.1f} s; "
          f"{summary['records_per_s']:.2f} rec/s after the driver's build) | ray/plain {row['ray_over_plain']:.2f} | "
          f"store {per_rec:.0f} B/record/layer = {row['bytes_ratio']:.3f} x raw float32", flush=True)
    return row


def time_plain(manifest: Path, spec, batch_size: int) -> float:
    from raybench.encoders.reference import plain_loop_activations

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
