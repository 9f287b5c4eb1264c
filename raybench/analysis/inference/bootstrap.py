"""Paired patient bootstrap and crossed depth x seed bootstrap as chunked Ray tasks (docs/protocol.md §8).

The patient bootstrap never touches records: a draw (multinomial patient counts w) of every cell's test-set
metrics is a weighted sum of the cells' packed per-patient statistics (packed_stats.py), and a chunk of
draws is one GEMM  counts [draws, P] x stats [P, features].

Determinism: the draws come from one of two streams (raybench.analysis.inference.streams): `published` (the
protocol code's own generator calls, drawn in order on the driver and handed to the tasks in chunks) or
`chunked` (chunk i from child i of SeedSequence(seed), drawn inside its task).  Either way every task
computes a fixed (draw chunk, cell block) pair with one BLAS thread, so results do not depend, bit for bit, on
how many workers run, in which order tasks finish, or whether packing and bootstrap are pipelined. The chunk
size changes the GEMMs' shapes, and a BLAS may round a row of a product differently with the number of rows
(OpenBLAS's AVX-512 kernels do): across chunk sizes, results agree to rounding (~1e-16 relative).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import ray

from raybench.analysis.inference.packed_stats import (
    CONSTANT_RTOL_F32,
    BlockReady,
    PatientStats,
    metrics_from_weighted,
    pack_patient_stats,
)
from raybench.analysis.inference.streams import (
    check_stream,
    crossed_counts,
    crossed_draw_indices,
    index_counts,
    n_chunks,
    patient_counts,
    patient_draws,
)
from raybench.core.sufficient_stats import CONSTANT_RTOL
from raybench.infra import progress

# ---------------------------------------------------------------- Ray tasks


@ray.remote(num_cpus=1)
def _counts_task(seed: int, n_draws: int, chunk_draws: int, n_patients: int, chunk: int) -> np.ndarray:
    return patient_counts(seed, n_draws, chunk_draws, n_patients, chunk)


@ray.remote(num_cpus=1)
def _patient_chunk(counts: np.ndarray, y_matrix: np.ndarray, block: np.ndarray, group: np.ndarray, n_concepts: int,
                   threshold: float) -> np.ndarray:
    rtol = CONSTANT_RTOL if block.dtype == np.float64 else CONSTANT_RTOL_F32
    # the y side over this block's own concept blocks only: the GEMM's shape then depends on the block alone, not
    # on how many concept blocks were read so far (packed_patient_bootstrap), and BLAS kernels may round a
    # product differently with its shape (OpenBLAS's AVX-512 ones do)
    groups, local = np.unique(group, return_inverse=True)
    width = 1 + 2 * n_concepts
    yw = counts @ y_matrix[:, (groups[:, None] * width + np.arange(width)).ravel()]
    return metrics_from_weighted(yw, counts.astype(block.dtype) @ block, local, n_concepts, threshold, rtol)


@ray.remote(num_cpus=1)
def _crossed_chunk(seed: int, n_draws: int, chunk_draws: int, chunk: int, values: np.ndarray) -> np.ndarray:
    return crossed_values(values, *crossed_counts(seed, n_draws, chunk_draws, values.shape[1], values.shape[2],
                                                  chunk))


@ray.remote(num_cpus=1)
def _crossed_given(di: np.ndarray, si: np.ndarray, values: np.ndarray) -> np.ndarray:
    if np.all(np.isfinite(values)):
        return crossed_values_published(values, di, si)
    return crossed_values(values, index_counts(di, values.shape[1]), index_counts(si, values.shape[2]))


def crossed_values_published(values: np.ndarray, di: np.ndarray, si: np.ndarray) -> np.ndarray:
    """values [M, D, S], resampled positions di [draws, D], si [draws, S] -> [draws, M] in the published
    arithmetic: the mean (numpy's pairwise sum / D*S) of the selected cells in draw order, depth-major.

    Equal to crossed_values up to rounding; rounding decides ties of quantized metrics between models, so
    this is what makes paired p-values and rank ties come out as published.  Needs a complete grid (as the
    published code does); crossed_bootstrap falls back to crossed_values when a cell is missing.
    """
    di, si = np.asarray(di, dtype=np.int64), np.asarray(si, dtype=np.int64)
    m, n, k = values.shape[0], di.shape[0], di.shape[1] * si.shape[1]
    picked = np.ascontiguousarray(values[:, di[:, :, None], si[:, None, :]]).reshape(m * n, k)  # rows: (model, draw)
    # a reduction along the contiguous last axis of a 2-d array runs numpy's pairwise sum per row, as np.mean
    # of one draw's list does (tested against the published draws); a 3-d reduction may not
    return (np.add.reduce(picked, axis=1) / k).reshape(m, n).T


def crossed_values(values: np.ndarray, cd: np.ndarray, cs: np.ndarray) -> np.ndarray:
    """values [M, D, S] (NaN = missing cell), counts cd [draws, D], cs [draws, S] -> [draws, M] weighted means."""
    ok = np.isfinite(values).astype(np.float64)
    filled = np.where(ok > 0, values, 0.0)
    num = np.einsum("nd,mds,ns->nm", cd, filled, cs)
    den = np.einsum("nd,mds,ns->nm", cd, ok, cs)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def run_bounded(jobs: Sequence[Callable[[], ray.ObjectRef]], num_workers: int | None) -> list[np.ndarray]:
    """Submit jobs with at most num_workers in flight; results come back in job order."""
    limit = len(jobs) if num_workers is None else max(1, int(num_workers))
    results: list[np.ndarray | None] = [None] * len(jobs)
    pending: dict[ray.ObjectRef, int] = {}
    nxt = 0
    shown = progress.current()  # the run's live display counts bootstrap tasks (raybench.infra.progress)
    shown.add_total("bootstrap", "bootstrap tasks", len(jobs), "tasks")
    while nxt < len(jobs) or pending:
        while nxt < len(jobs) and len(pending) < limit:
            pending[jobs[nxt]()] = nxt
            nxt += 1
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            results[pending.pop(ref)] = ray.get(ref)
            shown.advance("bootstrap")
    return results  # type: ignore[return-value]


def patient_bootstrap(stats: PatientStats, n_draws: int, seed: int, chunk_draws: int = 250,
                      num_workers: int | None = None, stream: str = "chunked") -> np.ndarray:
    """Paired patient bootstrap -> [n_draws, cells, 3] (reconstruction R^2, accessibility, coverage).

    The same draws apply to every cell (paired).  Data go to the object store once; each task is one
    (draw chunk, cell block) GEMM.  num_workers caps concurrent tasks (None: as many as Ray schedules).
    stream: "published" (the protocol code's draws, made in order on the driver) or "chunked" (each chunk's
    own SeedSequence child, drawn in its task); see raybench.analysis.inference.streams.
    """
    y_ref = ray.put(stats.y_matrix)
    block_refs = [b if isinstance(b, ray.ObjectRef) else ray.put(b) for b in stats.cell_blocks]
    slices = stats.block_slices
    group_refs = [stats.cell_group[s] for s in slices]
    count_refs = _count_refs(stats.n_patients, stats.active, n_draws, seed, chunk_draws, stream)
    jobs, where = [], []
    for c, cref in enumerate(count_refs):
        for b, bref in enumerate(block_refs):
            jobs.append(lambda cref=cref, bref=bref, g=group_refs[b]: _patient_chunk.remote(
                cref, y_ref, bref, g, stats.n_concepts, stats.threshold))
            where.append((c, b))
    results = run_bounded(jobs, num_workers)
    out = np.empty((n_draws, len(stats.cell_ids), 3))
    for (c, b), res in zip(where, results, strict=True):
        out[c * chunk_draws:c * chunk_draws + res.shape[0], slices[b]] = res
    return out


def _count_refs(n_patients: int, active: np.ndarray | None, n_draws: int, seed: int, chunk_draws: int,
                stream: str) -> list[ray.ObjectRef]:
    """The patient-count chunks of a bootstrap, in the object store: the published stream's drawn here in order,
    the chunked stream's each drawn by its own task."""
    if check_stream(stream) == "published":
        return [ray.put(c) for c in patient_draws(n_patients, n_draws, seed, chunk_draws, stream, active=active)]
    return [_counts_task.remote(seed, n_draws, chunk_draws, n_patients, c)
            for c in range(n_chunks(n_draws, chunk_draws))]


def packed_patient_bootstrap(items: Iterable[tuple[Path | str, dict[str, np.ndarray]]], cell_ids: Sequence[str],
                             n_concepts: int, threshold: float, n_draws: int, seed: int, chunk_draws: int = 250,
                             cells_per_block: int = 64, stream: str = "chunked",
                             dtype: type = np.float64) -> tuple[PatientStats, np.ndarray]:
    """pack_patient_stats(put=True) and patient_bootstrap in one pass -> (stats, draws [n_draws, cells, 3]).

    Packing runs on the driver, one cell at a time; here each block's tasks are submitted as soon as the block is
    in the object store, so the workers compute while the driver packs the next block. Same draws and tasks, so
    the same results as the two calls in turn. The published stream draws over the active patients, known for
    sure only once every cell is read: the draws are made from the first block's, and should a later cell add a
    patient, the bootstrap runs again over the final set.
    """
    check_stream(stream)
    counts: list[ray.ObjectRef] = []
    first_active: list[np.ndarray] = []
    tasks: list[tuple[int, int, ray.ObjectRef]] = []  # (draw chunk, block, task)
    shown = progress.current()  # every task counted up front: the total does not grow block by block
    n_blocks = -(-len(cell_ids) // cells_per_block)
    shown.add_total("bootstrap", "bootstrap tasks", n_chunks(n_draws, chunk_draws) * n_blocks, "tasks")

    def submit(ready: BlockReady) -> None:
        if not counts:
            first_active.append(ready.active)
            counts.extend(_count_refs(ready.n_patients, ready.active, n_draws, seed, chunk_draws, stream))
        y_ref = ray.put(ready.y_matrix)
        tasks.extend((c, ready.index, _patient_chunk.remote(cref, y_ref, ready.block, ready.group, n_concepts,
                                                            threshold)) for c, cref in enumerate(counts))

    stats = pack_patient_stats(items, cell_ids, n_concepts, threshold, cells_per_block, put=True, dtype=dtype,
                               on_block=submit)
    if stream == "published" and not np.array_equal(first_active[0], stats.active):
        for _, _, ref in tasks:
            ray.cancel(ref)
        return stats, patient_bootstrap(stats, n_draws, seed, chunk_draws, stream=stream)
    out = np.empty((n_draws, len(stats.cell_ids), 3))
    slices = stats.block_slices
    for c, b, ref in tasks:
        res = ray.get(ref)
        out[c * chunk_draws:c * chunk_draws + res.shape[0], slices[b]] = res
        shown.advance("bootstrap")
    return stats, out


def crossed_bootstrap(values: np.ndarray, n_draws: int, seed: int, chunk_draws: int = 2500,
                      num_workers: int | None = None, stream: str = "chunked") -> np.ndarray:
    """Crossed bootstrap over depth units and seeds of cell-level values [M, D, S] -> [n_draws, M].

    Each draw resamples the D depths and the S seeds with replacement (the same units for every model,
    so model comparisons stay paired) and averages the selected cells; missing cells (NaN) drop out.
    stream "published" draws as the protocol code does (its depth and seed axes must be in ascending unit
    order, as there) and averages in its arithmetic (crossed_values_published; on a complete grid);
    "chunked" draws each chunk from its own SeedSequence child inside its task.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 3:
        raise ValueError(f"crossed bootstrap needs values [models, depths, seeds], got shape {values.shape}")
    ref = ray.put(values)
    if check_stream(stream) == "published":
        di, si = crossed_draw_indices(seed, n_draws, chunk_draws, values.shape[1], values.shape[2], stream)
        jobs = [lambda a=a: _crossed_given.remote(di[a:a + chunk_draws], si[a:a + chunk_draws], ref)
                for a in range(0, n_draws, chunk_draws)]
    else:
        jobs = [lambda c=c: _crossed_chunk.remote(seed, n_draws, chunk_draws, c, ref)
                for c in range(n_chunks(n_draws, chunk_draws))]
    return np.concatenate(run_bounded(jobs, num_workers), axis=0)
