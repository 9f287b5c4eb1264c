"""One-GPU readiness check: encode, train and bootstrap on one CUDA device, each part with a time limit.

Parts (each prints its figures; a failed part prints FAIL with its cause and the others still run):
  env        torch build, CUDA device and memory
  encode     a synthetic cohort through the six encoders (full size) with raybench's encode path: Ray Data,
             encoder actors with `auto` fractional GPUs (raybench.infra.resources); records/s per model
  train      paper-scale SAE stacks (d per model, k by the protocol's rule, B 256, 3 seeds) at E in {1, 8, 32},
             both arms, as Ray Tune trials with `auto` fractional GPUs packed on the device; marginal step times,
             peak memory against raybench's estimate, and the projected wall time of the published grid
             (450 + 90 cells x 8,000 steps) on one GPU
  bootstrap  the paired patient bootstrap as torch GEMMs on the device over raybench's packed statistics,
             checked against raybench's CPU (Ray) bootstrap on a small case, then timed at published scale

    bench/gpu_check.sh                     # installs the CUDA torch build if needed, then runs this
    python bench/gpu_check.py              # on a machine with one CUDA GPU
    python bench/gpu_check.py --smoke      # tiny sizes on CPU (one logical Ray GPU): the same code path

Exit status: 0 when every part passed, 1 when a part failed, 3 when a part ran past its limit.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
GIB = 1 << 30
DONE: list[str] = []


def say(msg: str) -> None:
    print(f"[gpu_check] {msg}", flush=True)


class Watchdog:
    """Ends the whole check (exit 3) when a part runs past its limit: a hung GPU call cannot be interrupted."""

    def __init__(self) -> None:
        self._timer: threading.Timer | None = None

    def start(self, part: str, limit: float) -> None:
        def expire() -> None:
            say(f"FAIL {part}: still running after its {limit:.0f} s limit; stopping (done: {', '.join(DONE) or '-'})")
            import ray

            stop = threading.Thread(target=ray.shutdown, daemon=True)  # the Ray processes this check started
            stop.start()
            stop.join(20)
            os._exit(3)

        self._timer = threading.Timer(limit, expire)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


# ---------------------------------------------------------------- env

def part_env(args: argparse.Namespace) -> dict:
    import torch

    say(f"torch {torch.__version__} (CUDA build {torch.version.cuda}), cuda available: {torch.cuda.is_available()}")
    if args.smoke:
        say("smoke mode: tiny sizes on CPU with one logical Ray GPU")
        return {"device": "cpu"}
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device visible to torch: install the CUDA build of torch (bench/gpu_check.sh) "
                           "and check nvidia-smi; use --smoke to run the CPU path")
    props = torch.cuda.get_device_properties(0)
    say(f"device 0: {props.name}, {props.total_memory / GIB:.1f} GiB, {torch.cuda.device_count()} visible")
    return {"device": "cuda", "memory_gib": props.total_memory / GIB}


# ---------------------------------------------------------------- encode

def part_encode(args: argparse.Namespace, work: Path, dims: dict) -> None:
    """Fills `dims` (model -> ModelDims) with the models it encoded."""
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.core.config import MODELS, EncoderConfig, ModelDims, ResourceConfig, paper_protocol
    from raybench.core.paths import RunLayout
    from raybench.encoders.base import EncoderSpec
    from raybench.encoders.extract import extract_activations

    layout = RunLayout.at(work / "run")
    t0 = time.perf_counter()
    generate_synth_cohort(layout.cohort_dir, args.records, max(1, args.records // 2), 7)
    build_synth_manifest(layout.cohort_dir, layout.manifest_dir)
    say(f"encode: synthetic cohort of {args.records} records + manifest in {time.perf_counter() - t0:.1f} s")
    enc_cfg = EncoderConfig(size=args.size, batch_size=args.encode_batch, num_gpus="auto",
                            min_actors=args.actors, max_actors=args.actors)
    res = ResourceConfig(max_per_gpu=max(2, args.actors))  # the actors share the device
    rates, failed = [], []
    for model in args.models or MODELS:
        if time.perf_counter() - t0 > 0.7 * args.limits[0]:
            say(f"encode {model}: SKIPPED, 70% of the encode part's {args.limits[0]:.0f} s limit is used up")
            continue
        spec = EncoderSpec(name=model, size=args.size)
        t = time.perf_counter()
        try:
            s = extract_activations(layout.manifest, layout.root, spec, enc_cfg, progress=False, resources=res,
                                    depths=paper_protocol().grid.depths)
        except Exception as err:  # the next model still runs
            failed.append(model)
            say(f"encode {model}: FAIL after {time.perf_counter() - t:.1f} s: {type(err).__name__}: {err}")
            continue
        wall = time.perf_counter() - t
        dims[model] = ModelDims(n_layers=int(s["n_layers"]), d=int(s["d"]))
        share = _resolved(layout, "encode", model)
        rates.append(s["records"] / s["seconds"])
        say(f"encode {model}: {s['records']} records x {len(s['layers'])} layers in {s['seconds']:.1f} s "
            f"({s['records'] / s['seconds']:.1f} rec/s; {wall:.1f} s with the build), d {s['d']}, "
            f"{share:g} GPU per actor x {args.actors} actors on {', '.join(s['devices'])}")
        if not args.smoke and not any(dev.startswith("cuda") for dev in s["devices"]):
            failed.append(model)
            say(f"encode {model}: FAIL: the encoder actors ran on {s['devices']}, not on the GPU")
    if rates:
        say(f"encode: {len(rates)} models, {min(rates):.1f}-{max(rates):.1f} rec/s per model (incl. pipeline "
            "start-up)")
    if failed:
        raise RuntimeError(f"encode failed for {failed}")


def _resolved(layout, stage: str, key: str) -> float:
    import json

    return float(json.loads(layout.resources_resolved.read_text())[stage][key]["gpus"])


# ---------------------------------------------------------------- train

def sae_trial(config: dict) -> None:
    """Tune trial: one stack of 3 SAEs (d, E, arm) on random inputs, stepped as raybench's train_stack steps it
    (per-step sampler, Stepper "auto", losses back on the host every step); reports the step time."""
    import ray
    import torch
    from ray import tune

    from raybench.core.config import paper_protocol
    from raybench.sae.model import Normalizer, SAECellConfig, StackedBatchTopKSAE
    from raybench.sae.sampler import SAMPLER_CLASSES
    from raybench.sae.step import Stepper

    torch.set_num_threads(1)
    gpu = bool(ray.get_gpu_ids()) and torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")  # the CPU fallback of raybench's trials
    if gpu:  # a reused trial process: this trial's peak only
        torch.cuda.reset_peak_memory_stats()
    d, n, k = config["d"], config["n_latents"], config["k"]
    cfgs = [SAECellConfig.from_protocol(paper_protocol().sae, d, n, k, seed) for seed in config["seeds"]]
    x_raw = np.random.default_rng(0).standard_normal((config["n_train"], d), dtype=np.float32)
    x = torch.from_numpy(Normalizer.fit(x_raw, cfgs[0].std_floor).apply(x_raw)).to(device)
    sae = StackedBatchTopKSAE.from_seeds([c.seed for c in cfgs], d, n, k).to(device)
    stepper = Stepper(sae, cfgs, "auto")
    batchers = [SAMPLER_CLASSES[c.sampler](x.shape[0], c.batch_size, c.seed) for c in cfgs]

    def step(i: int) -> None:
        idx = torch.from_numpy(np.stack([bt.next() for bt in batchers])).to(device)
        mse, aux = stepper.step(x[idx], renormalize=i == 0)
        mse.cpu().numpy(), aux.cpu().numpy()

    start = time.time()
    for i in range(config["warm"]):
        step(i)
    t0 = time.perf_counter()
    for i in range(config["warm"], config["warm"] + config["timed"]):
        step(i)
    step_s = (time.perf_counter() - t0) / config["timed"]
    peak = torch.cuda.max_memory_allocated() / GIB if gpu else 0.0
    tune.report({"step_s": step_s, "device": device.type, "peak_gib": peak,
                 "gpu_ids": ",".join(str(g) for g in ray.get_gpu_ids()), "start": start, "end": time.time()})


def part_train(args: argparse.Namespace, work: Path, dims: dict) -> dict:
    import ray
    from ray import tune

    from raybench.core.config import ResourceConfig, k_for, paper_protocol
    from raybench.infra.resources import (
        connected_inventory,
        resolve,
        resolve_reuse_trial_processes,
        sae_trial_bytes,
    )

    proto = paper_protocol()
    seeds = list(proto.grid.seeds)
    trials = [{"d": d, "arm": arm, "E": e, "n_latents": e * d, "k": k_for(d, e * d, arm, proto.sae, proto.grid),
               "seeds": seeds, "n_train": args.n_train, "warm": args.warm_steps, "timed": args.timed_steps}
              for d in sorted({m.d for m in dims.values()}) for arm in ("primary", "sensitivity")
              for e in args.expansions]
    res = ResourceConfig(max_per_gpu=args.trials_per_gpu)
    need = max(sae_trial_bytes(t["d"], t["n_latents"], len(seeds), proto.sae.batch_size, args.n_train)
               for t in trials)
    choice = resolve("auto", connected_inventory(res), need, res.max_per_gpu)
    say(f"train: {len(trials)} trials (d {sorted({t['d'] for t in trials})}, E {list(args.expansions)}, both arms, "
        f"{len(seeds)} seeds each), auto share {choice.gpus:g} GPU per trial (largest need {choice.need_gib:.2f} "
        f"GiB of {choice.gpu_memory_gib:g} GiB from {choice.memory_source})")
    cpus = ray.cluster_resources().get("CPU", 1.0)
    tuner = tune.Tuner(
        tune.with_resources(sae_trial, {"cpu": 1, "gpu": choice.gpus}),
        param_space=tune.grid_search(trials),
        # as raybench's grid: a finished trial's process runs the next one on a local instance (no process start
        # and torch import per trial); each trial resets the peak-memory counter it reports
        tune_config=tune.TuneConfig(reuse_actors=resolve_reuse_trial_processes("auto")),
        run_config=tune.RunConfig(name="gpu_check", storage_path=str(work / "tune"), verbose=0),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - t0
    errors = [r.error for r in grid if r.error is not None]
    if errors:
        raise RuntimeError(f"{len(errors)} trial(s) failed; first: {errors[0]}")
    step_s: dict[tuple[int, str, int], float] = {}
    spans = []
    for r in grid:
        t, m = r.config, r.metrics
        step_s[(t["d"], t["arm"], t["E"])] = m["step_s"]
        spans.append((m["start"], m["end"]))
        est = sae_trial_bytes(t["d"], t["n_latents"], len(seeds), proto.sae.batch_size, args.n_train) / GIB
        say(f"train d {t['d']} E {t['E']:>2} {t['arm']:<11} k {t['k']:>4}: {m['step_s'] * 1e3:8.1f} ms per step of "
            f"{len(seeds)} SAEs ({len(seeds) / m['step_s']:7.1f} SAE-steps/s) on {m['device']} "
            f"(gpu ids [{m['gpu_ids']}]), peak {m['peak_gib']:.2f} GiB vs estimate {est:.2f} GiB")
        if not args.smoke and m["device"] != "cuda":
            raise RuntimeError(f"trial {t['arm']} E {t['E']} ran on {m['device']}, not on the GPU")
    packed = max(_max_overlap(spans), 1)
    say(f"train: Tune wall {wall:.1f} s; up to {packed} trials ran at once on the device")
    per_gpu = max(1, min(round(1 / choice.gpus) if choice.gpus > 0 else 1, int(cpus)))
    total_s, wall_s, n_cells = projected_grid(proto, dims, step_s, per_gpu)
    say(f"projection: the published grid over {len(dims)} models ({n_cells} cells x {proto.sae.steps} steps) = "
        f"{total_s / 3600:.2f} trial-hours of training; {per_gpu} packed trials per GPU -> {wall_s / 3600:.2f} h wall "
        "on one GPU (training steps only, at the packed step times above; evaluation and encode not included)")
    return {"projected_wall_h": wall_s / 3600}


def _max_overlap(spans: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = best = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def projected_grid(proto, dims: dict, step_s: dict[tuple[int, str, int], float],
                   per_gpu: int) -> tuple[float, float, int]:
    """(trial-seconds, wall seconds on one GPU, cells) of the protocol's grid over the models of `dims`: every stack
    trains proto.sae.steps steps at the step time measured for its (d, arm), interpolated linearly in E between
    the measured E (and scaled by (d / d_measured)^2 for a d that was not measured)."""
    from dataclasses import replace

    from raybench.sae.cells import build_cells

    cells = build_cells(replace(proto, grid=replace(proto.grid, models=tuple(dims))), dims)
    stacks = {c.stack_id: c for c in cells}
    total = 0.0
    for c in stacks.values():
        d_ref = min({d for d, _, _ in step_s}, key=lambda d: abs(d - c.d))
        es = sorted(e for d, arm, e in step_s if d == d_ref and arm == c.arm)
        t = float(np.interp(c.expansion, es, [step_s[(d_ref, c.arm, e)] for e in es]))
        total += proto.sae.steps * t * (c.d / d_ref) ** 2
    return total, total / per_gpu, len(cells)


# ---------------------------------------------------------------- bootstrap

def torch_patient_bootstrap(stats, n_draws: int, seed: int, chunk_draws: int, device: str) -> np.ndarray:
    """raybench's paired patient bootstrap (same draws: analysis.streams.patient_counts) with the two GEMMs per
    chunk and cell block in torch on `device`; the metrics from the weighted sums as in raybench."""
    import torch

    from raybench.analysis.inference.packed_stats import CONSTANT_RTOL_F32, metrics_from_weighted
    from raybench.analysis.inference.streams import n_chunks, patient_counts
    from raybench.core.sufficient_stats import CONSTANT_RTOL

    y = torch.from_numpy(np.ascontiguousarray(stats.y_matrix)).to(device)
    blocks = [torch.from_numpy(np.ascontiguousarray(b)).to(device) for b in stats.cell_blocks]
    out = np.empty((n_draws, len(stats.cell_ids), 3))
    for c in range(n_chunks(n_draws, chunk_draws)):
        counts = torch.from_numpy(patient_counts(seed, n_draws, chunk_draws, stats.n_patients, c)).to(device)
        yw = (counts @ y).cpu().numpy()
        rows = slice(c * chunk_draws, c * chunk_draws + counts.shape[0])
        for s, b in zip(stats.block_slices, blocks, strict=True):
            rtol = CONSTANT_RTOL if b.dtype == torch.float64 else CONSTANT_RTOL_F32
            cw = (counts.to(b.dtype) @ b).cpu().numpy()
            out[rows, s] = metrics_from_weighted(yw, cw, stats.cell_group[s], stats.n_concepts, stats.threshold,
                                                 rtol)
    return out


def _packed(n_cells: int, n_patients: int, n_records: int, n_concepts: int, block: int):
    sys.path.insert(0, str(BENCH))
    from bootstrap import Synthetic  # bench/bootstrap.py: record-level synthetic data per cell

    from raybench.analysis.inference.packed_stats import pack_patient_stats

    data = Synthetic(n_patients, n_records, n_concepts)
    items = ((f"synthetic cell {c}", data.stats(c)) for c in range(n_cells))
    return pack_patient_stats(items, [f"cell{c:03d}" for c in range(n_cells)], n_concepts, 0.2, block)


def part_bootstrap(args: argparse.Namespace, device: str) -> dict:
    import torch

    from raybench.analysis.inference.bootstrap import patient_bootstrap

    small = _packed(12, 150, 180, 49, 5)
    cpu = patient_bootstrap(small, 300, 1234, 100)
    dev = torch_patient_bootstrap(small, 300, 1234, 100, device)
    err = float(np.abs(cpu - dev).max())
    say(f"bootstrap check (12 cells x 150 patients x 300 draws): max |{device} - CPU Ray| = {err:.1e}")
    if not err <= 1e-9:
        raise RuntimeError(f"the {device} bootstrap differs from raybench's CPU bootstrap by {err:.1e} (> 1e-9)")
    cells, patients, records, draws = args.boot_scale
    t0 = time.perf_counter()
    stats = _packed(cells, patients, records, 49, 64)
    t_pack = time.perf_counter() - t0
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch_patient_bootstrap(stats, draws, 1234, 250, device)
    t_dev = time.perf_counter() - t0
    line = (f"bootstrap {cells} cells x 49 concepts x {patients} patients x {draws} draws: packing {t_pack:.1f} s, "
            f"{device} {t_dev:.1f} s ({t_dev / draws * 1e3:.2f} ms per draw)")
    if args.cpu_compare:
        t0 = time.perf_counter()
        patient_bootstrap(stats, draws, 1234, 250)
        t_cpu = time.perf_counter() - t0
        line += f"; CPU Ray tasks {t_cpu:.1f} s ({t_cpu / t_dev:.1f}x the {device} time)"
    say(line)
    return {"bootstrap_s": t_dev}


# ---------------------------------------------------------------- main

def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU with one logical Ray GPU")
    ap.add_argument("--parts", nargs="+", default=["encode", "train", "bootstrap"],
                    choices=["encode", "train", "bootstrap"])
    ap.add_argument("--records", type=int, default=None, help="synthetic records to encode (256; smoke 12)")
    ap.add_argument("--models", nargs="+", default=None, help="encoders (default: the six; smoke csfm)")
    ap.add_argument("--actors", type=int, default=None, help="encoder actors sharing the GPU (4; smoke 1)")
    ap.add_argument("--encode-batch", type=int, default=32)
    ap.add_argument("--expansions", type=int, nargs="+", default=None, help="(1 8 32; smoke 1 32)")
    ap.add_argument("--trials-per-gpu", type=int, default=4, help="resources.max_per_gpu of the SAE trials")
    ap.add_argument("--n-train", type=int, default=None, help="training rows per trial (16000; smoke 512)")
    ap.add_argument("--warm-steps", type=int, default=None, help="(10; smoke 1)")
    ap.add_argument("--timed-steps", type=int, default=None, help="(40; smoke 2)")
    ap.add_argument("--boot-scale", type=int, nargs=4, default=None, metavar=("CELLS", "PATIENTS", "RECORDS", "DRAWS"),
                    help="published: 450 2862 3325 2000 (smoke 8 100 120 100)")
    ap.add_argument("--no-cpu-compare", dest="cpu_compare", action="store_false",
                    help="skip timing raybench's CPU bootstrap at the same scale")
    ap.add_argument("--limits", type=float, nargs=3, default=None, metavar=("ENCODE", "TRAIN", "BOOTSTRAP"),
                    help="seconds per part (150 100 60; smoke 600 600 300: a busy CPU machine)")
    ap.add_argument("--workdir", default=None, help="scratch folder (default: a temp folder)")
    args = ap.parse_args(argv)
    smoke = args.smoke
    defaults = {"records": (256, 12), "actors": (4, 1), "n_train": (16000, 512), "warm_steps": (10, 1),
                "timed_steps": (40, 2), "boot_scale": ([450, 2862, 3325, 2000], [8, 100, 120, 100]),
                "models": (None, ["csfm"]), "expansions": ([1, 8, 32], [1, 32]),
                "limits": ([150.0, 100.0, 60.0], [600.0, 600.0, 300.0])}
    for name, (full, tiny) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, tiny if smoke else full)
    args.size = "demo" if smoke else "full"
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import ray

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # `timeout`: unwind, so Ray's exit hook stops its processes
    t_all = time.perf_counter()
    try:
        env = part_env(args)
    except Exception as err:
        say(f"FAIL env: {err}")
        return 1
    DONE.append("env")
    from raybench.core.config import ResourceConfig
    from raybench.infra.ray_session import init_ray

    # raybench's own start: a local instance (loopback, no dashboard, quiet) unless RAY_ADDRESS names a cluster;
    # smoke: one logical GPU, so fractional requests schedule and the workers fall back to CPU
    init_ray(ResourceConfig(num_cpus=2, num_gpus=1) if args.smoke else ResourceConfig())
    say(f"ray cluster: {ray.cluster_resources()}")
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gpu_check"))
    failed: list[str] = []
    dims: dict = {}
    watchdog = Watchdog()
    limits = dict(zip(("encode", "train", "bootstrap"), args.limits, strict=True))
    for part in ("encode", "train", "bootstrap"):
        if part not in args.parts:
            continue
        watchdog.start(part, limits[part])
        t0 = time.perf_counter()
        try:
            if part == "encode":
                part_encode(args, work, dims)
            elif part == "train":
                part_train(args, work, _dims(args, dims))
            else:
                part_bootstrap(args, env["device"])
            DONE.append(part)
            say(f"ok {part} ({time.perf_counter() - t0:.1f} s)")
        except Exception as err:
            failed.append(part)
            say(f"FAIL {part} after {time.perf_counter() - t0:.1f} s: {type(err).__name__}: {err}")
            traceback.print_exc()
        finally:
            watchdog.stop()
    ray.shutdown()
    say(f"done in {time.perf_counter() - t_all:.1f} s: passed {', '.join(DONE)}; failed {', '.join(failed) or '-'}")
    return 1 if failed else 0


def _dims(args: argparse.Namespace, known: dict) -> dict:
    """Model dimensions: those the encode part saw, the others from the encoder built on the meta device."""
    import torch

    from raybench.core.config import MODELS, ModelDims
    from raybench.encoders.base import EncoderSpec, build_encoder

    out = {}
    for model in args.models or MODELS:
        if model in known:
            out[model] = known[model]
            continue
        with torch.device("meta"):
            enc = build_encoder(EncoderSpec(name=model, size=args.size))
        out[model] = ModelDims(n_layers=int(enc.n_layers), d=int(enc.d))
    return out


if __name__ == "__main__":
    sys.exit(main())
