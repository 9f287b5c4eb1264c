"""Paired patient bootstrap at full published scale, on synthetic sufficient statistics.

Default scale: 450 cells x 49 concepts x 2,862 test patients (3,325 records) x 2,000 draws.
Prints: wall time of packing and of the bootstrap in turn, then of the two pipelined as `raybench analyze`
runs them (packed_patient_bootstrap: a block's tasks start while the next block is packed; the target figure),
peak memory (PSS summed over this process and every Ray process it started, so shared object-store pages
count once; from a separate sampled pass), and the per-draw speedup
over a naive per-draw recomputation from record-level data (a few naive draws, extrapolated).  The
naive draws use the bootstrap's own counts, so their numbers double as a full-scale correctness check.

    python bench/bootstrap.py                # targets: packing + bootstrap <= 12 s, <= 4 GiB (and >= 50x)
    python bench/bootstrap.py --cells 60 --draws 500   # quick look
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path

import numpy as np
import ray

from raybench.analysis.inference import bootstrap as bs
from raybench.analysis.inference.packed_stats import pack_patient_stats
from raybench.analysis.inference.streams import patient_counts
from raybench.core.sufficient_stats import patient_stats

# ---------------------------------------------------------------- memory (PSS of our process tree)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    return kids


def _tree(root: int) -> list[int]:
    kids, todo, out = _children(), [root], []
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += kids.get(pid, [])
    return out


def tree_cpu_seconds(root: int) -> float:
    """user + system CPU seconds of the live processes of this tree (Ray workers stay alive between tasks)."""
    tick, total = os.sysconf("SC_CLK_TCK"), 0
    for pid in _tree(root):
        try:
            f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])
        except (OSError, IndexError, ValueError):
            continue
    return total / tick


def tree_pss_bytes(root: int) -> int:
    kids, todo, total = _children(), [root], 0
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


class PeakMemory:
    """Samples the PSS of this process tree in a thread; .peak is the largest total seen."""

    def __init__(self, period: float = 0.2) -> None:
        self.period, self.peak, self._stop = period, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_pss_bytes(os.getpid()))
            self._stop.wait(self.period)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_pss_bytes(os.getpid()))


# ---------------------------------------------------------------- synthetic data


class Synthetic:
    """Record-level test data regenerated per cell from a seed (so no full copy ever needs to be held)."""

    def __init__(self, n_patients: int, n_records: int, n_concepts: int, seed: int = 0) -> None:
        rng = np.random.default_rng([seed, 0])
        extra = rng.integers(0, n_patients, size=n_records - n_patients)
        self.patient = np.sort(np.concatenate([np.arange(n_patients), extra]))
        self.y = rng.normal(size=(n_records, n_concepts)) * rng.uniform(0.5, 3, n_concepts) + rng.normal(0, 5,
                                                                                                       n_concepts)
        self.n_patients, self.n_concepts, self.seed = n_patients, n_concepts, seed
        self.ranges = np.concatenate([[0], np.cumsum(np.bincount(self.patient, minlength=n_patients))])

    def cell(self, c: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Selected code coordinates a [R, C] (ReLU-sparse), per-record SSE and SST of cell c."""
        rng = np.random.default_rng([self.seed, 1, c])
        beta = rng.uniform(0.0, 0.8, self.n_concepts)
        z = (self.y - self.y.mean(0)) / self.y.std(0)
        a = np.maximum(beta * z + rng.normal(size=self.y.shape) - 0.3, 0.0) * rng.uniform(0.5, 20.0)
        err = rng.gamma(2.0, 0.02 + 0.02 * rng.uniform(), size=len(self.patient))
        dev = rng.gamma(2.0, 0.5, size=len(self.patient)) + err
        return a.astype(np.float32), err, dev

    def stats(self, c: int) -> dict[str, np.ndarray]:
        a, err, dev = self.cell(c)
        return patient_stats(self.patient, self.n_patients, a, self.y, err, dev)


def naive_draw(data: Synthetic, cells: list[tuple[np.ndarray, np.ndarray, np.ndarray]], counts: np.ndarray,
               threshold: float) -> np.ndarray:
    """Record-level recomputation of one draw: gather the drawn patients' records, recompute every cell."""
    reps = counts.astype(np.int64)
    starts, lens = data.ranges[:-1], np.diff(data.ranges)
    idx = np.concatenate([np.arange(s, s + n) for s, n, k in zip(starts, lens, reps, strict=True)
                          for _ in range(k)])
    yc = data.y[idx] - data.y[idx].mean(0)  # concept side shared by every cell (hoisted, in the naive's favour)
    syy = (yc * yc).sum(0)
    out = np.empty((len(cells), 3))
    for i, (a, err, dev) in enumerate(cells):
        ac = a[idx].astype(np.float64)
        ac -= ac.mean(0)
        saa = (ac * ac).sum(0)
        den = np.sqrt(saa * syy)
        r = np.where(den > 0, (ac * yc).sum(0) / np.where(den > 0, den, 1.0), 0.0)
        out[i] = (1 - err[idx].sum() / dev[idx].sum(), np.abs(r).mean(), np.mean(np.abs(r) >= threshold))
    return out


# ---------------------------------------------------------------- main


def _streamed(args: argparse.Namespace, data: Synthetic):
    """The cells' statistics made one at a time, as a run reads them from disk (no full copy held)."""
    for c in range(args.cells):
        yield f"synthetic cell {c}", data.stats(c)


def blas_kernel() -> str:
    """numpy's BLAS and the kernel it runs: the bootstrap is one float64 GEMM, so its wall time follows the kernel.
    OpenBLAS picks one for the CPU; OPENBLAS_CORETYPE in the environment forces one (the AMD development VM forced
    its AVX2 "Haswell" kernel on an AVX-512 CPU, where OpenBLAS's own choice ran ~1.8x as fast; see
    docs/architecture.md)."""
    from threadpoolctl import threadpool_info

    info = next((i for i in threadpool_info() if i.get("user_api") == "blas"), {})
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return (f"{info.get('internal_api', 'unknown BLAS')} {info.get('version') or ''}, kernel "
            f"{info.get('architecture') or '?'}" + (f" (forced by OPENBLAS_CORETYPE={forced})" if forced else
                                                  " (the library's own choice for this CPU)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=450)
    ap.add_argument("--concepts", type=int, default=49)
    ap.add_argument("--patients", type=int, default=2862)
    ap.add_argument("--records", type=int, default=3325)
    ap.add_argument("--draws", type=int, default=2000)
    ap.add_argument("--chunk-draws", type=int, default=250)
    ap.add_argument("--cells-per-block", type=int, default=64)
    ap.add_argument("--workers", type=int, default=None, help="concurrent tasks (default: all CPUs)")
    ap.add_argument("--naive-draws", type=int, default=3)
    ap.add_argument("--threshold", type=float, default=0.2)
    ap.add_argument("--dtype", choices=("float64", "float32"), default="float64", help="packed statistics / GEMM")
    args = ap.parse_args()

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.get([ray.remote(lambda: 0).remote() for _ in range(os.cpu_count() or 1)])  # start workers first
    data = Synthetic(args.patients, args.records, args.concepts)
    base = tree_pss_bytes(os.getpid())
    print(f"scale: {args.cells} cells x {args.concepts} concepts x {args.patients} patients "
          f"({args.records} records) x {args.draws} draws; workers={args.workers or os.cpu_count()}, {args.dtype}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"GEMM in the Ray workers: {ray.get(ray.remote(blas_kernel).remote())}")

    ids = [f"cell{c:03d}" for c in range(args.cells)]
    dtype = np.dtype(args.dtype).type
    # 1. peak memory first (before the timed passes' cells are made, which the driver's heap keeps afterwards):
    # the pipelined pass with cells made one at a time, under the PSS sampler (reading smaps of every Ray process
    # five times a second costs real CPU: it stretched a timed bootstrap ~20% on 2 CPUs, so no pass below is timed
    # under it)
    with PeakMemory() as mem:
        t0 = time.perf_counter()
        stats, sampled = bs.packed_patient_bootstrap(_streamed(args, data), ids, args.concepts, args.threshold,
                                                     args.draws, 1234, args.chunk_draws, args.cells_per_block,
                                                     dtype=dtype)
        t_mem = time.perf_counter() - t0
    del stats

    t0 = time.perf_counter()
    made = [(f"synthetic cell {c}", data.stats(c)) for c in range(args.cells)]  # not raybench's work: not timed
    t_synth = time.perf_counter() - t0

    # 2. in turn: pack, then bootstrap (the per-draw figures below are this bootstrap's)
    t0, c0 = time.perf_counter(), time.process_time()
    stats = pack_patient_stats(iter(made), ids, args.concepts, args.threshold, args.cells_per_block, put=True,
                               dtype=dtype)
    t_pack, cpu_pack = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), tree_cpu_seconds(os.getpid())
    draws = bs.patient_bootstrap(stats, args.draws, 1234, args.chunk_draws, args.workers)
    t_boot, cpu_boot = time.perf_counter() - t0, tree_cpu_seconds(os.getpid()) - c0
    n_patients = stats.n_patients
    del stats  # frees its blocks in the object store

    # 3. pipelined, as `raybench analyze` runs it: each block's tasks start while the driver packs the next
    t0, c0 = time.perf_counter(), tree_cpu_seconds(os.getpid())
    stats, piped = bs.packed_patient_bootstrap(iter(made), ids, args.concepts, args.threshold, args.draws, 1234,
                                               args.chunk_draws, args.cells_per_block, dtype=dtype)
    t_total, cpu_total = time.perf_counter() - t0, tree_cpu_seconds(os.getpid()) - c0
    if not (np.array_equal(piped, draws, equal_nan=True) and np.array_equal(sampled, draws, equal_nan=True)):
        raise SystemExit("the pipelined and in-turn bootstraps differ")
    del stats, made

    packed = n_patients * args.cells * (2 + 3 * args.concepts) * np.dtype(args.dtype).itemsize
    print(f"pack statistics (centring + packing + ray.put): {t_pack:.1f} s wall, CPU {cpu_pack:.1f} s  "
          f"[packed matrix {packed / 2**30:.2f} GiB; synthesizing the record-level data took another "
          f"{t_synth:.1f} s, not counted]")
    gflop = 2 * args.draws * packed / np.dtype(args.dtype).itemsize / 1e9
    print(f"patient bootstrap after packing: {t_boot:.1f} s wall  ({t_boot / args.draws * 1e3:.2f} ms per draw; "
          f"{gflop:.0f} GFLOP of GEMM, {gflop / t_boot:.0f} GFLOP/s); CPU {cpu_boot:.1f} s "
          f"({cpu_boot / args.draws * 1e3:.2f} ms per draw)")
    print(f"packing + bootstrap pipelined (packed_patient_bootstrap, as raybench analyze runs it): {t_total:.1f} s "
          f"wall, CPU {cpu_total:.1f} s (in turn: {t_pack + t_boot:.1f} s); same draws")
    print(f"peak memory (PSS, driver + Ray processes; a separate, sampled pipelined pass with cells made one at a "
          f"time, {t_mem:.1f} s, same draws): {mem.peak / 2**30:.2f} GiB total, "
          f"{(mem.peak - base) / 2**30:.2f} GiB above the idle Ray baseline ({base / 2**30:.2f} GiB)")

    cells = [data.cell(c) for c in range(args.cells)]
    counts = patient_counts(1234, args.draws, args.chunk_draws, args.patients, 0)[:args.naive_draws]
    t0, c0 = time.perf_counter(), time.process_time()
    naive = np.stack([naive_draw(data, cells, row, args.threshold) for row in counts])
    t_naive = (time.perf_counter() - t0) / args.naive_draws
    cpu_naive = (time.process_time() - c0) / args.naive_draws
    err = np.abs(naive - draws[:args.naive_draws]).max(axis=(0, 1))
    speed = t_naive / (t_boot / args.draws)
    print(f"naive record-level recomputation: {t_naive:.2f} s per draw -> {t_naive * args.draws / 60:.1f} min "
          f"for {args.draws} draws (extrapolated from {args.naive_draws})")
    cpu_speed = cpu_naive / (cpu_boot / args.draws)
    print(f"naive CPU: {cpu_naive:.2f} s per draw; per-draw CPU-time speedup {cpu_speed:.0f}x "
          f"(load-independent: the share of a busy machine each side got does not enter)")
    print(f"per-draw wall speedup: {speed:.0f}x  (max |bootstrap - naive| over {args.naive_draws} draws: "
          f"R2 {err[0]:.1e}, accessibility {err[1]:.1e}, coverage {err[2]:.1e})")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"packing + bootstrap (pipelined): {t_total:.1f} s wall (target <= 12 s: "
          f"{'PASS' if t_total <= 12 else 'FAIL'}), CPU {cpu_total:.1f} s; peak {mem.peak / 2**30:.2f} GiB "
          f"(target <= 4 GiB: "
          f"{'PASS' if mem.peak <= 4 * 2**30 else 'FAIL'}); wall targets hold for the default scale on an idle "
          f"{os.cpu_count()}-CPU machine")
    ok = t_boot <= 120 and mem.peak <= 4 * 2**30 and speed >= 50
    print(f"earlier targets (bootstrap <= 120 s, <= 4 GiB, >= 50x per draw): {'met' if ok else 'NOT met'}")
    ray.shutdown()


if __name__ == "__main__":
    main()
