"""Paired patient bootstrap and crossed depth x seed bootstrap as chunked Ray tasks (docs/protocol.md §8).

The patient bootstrap never touches records: every cell's test-set metrics are functions of
per-patient sufficient statistics, so a draw (multinomial patient counts w) is a weighted sum and a
chunk of draws is one GEMM  counts [draws, P] x stats [P, features].  Statistics are centred on the
full-test means and scaled to unit variance before packing, so the sums stay well conditioned.

Determinism: the draws come from one of two streams (raybench.analysis.streams): `published` (the
protocol code's own generator calls, drawn in order on the driver and handed to the tasks in chunks) or
`chunked` (chunk i from child i of SeedSequence(seed), drawn inside its task).  Either way every task
computes a fixed (draw chunk, cell block) pair with one BLAS thread, so results do not depend on how many
workers run or in which order tasks finish.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import ray

from raybench.analysis.metrics import pearson_from_sums
from raybench.analysis.streams import check_stream, index_counts, published_crossed_indices, published_patient_counts

METRIC_NAMES: tuple[str, ...] = ("reconstruction", "accessibility", "coverage")
_CELL_FIXED = 2  # sse, sst
_CONSTANT_TOL = 1e-12  # relative variance below which a coordinate/concept counts as constant
_CONSTANT_TOL_F32 = 1e-5  # the same for float32 packed statistics (rounding of float32 sums)


class StatsError(ValueError):
    """A patient_stats file is missing or inconsistent; the message names the file and the fix."""


# ---------------------------------------------------------------- loading and packing


@dataclass
class PatientStats:
    """Packed, centred per-patient statistics for a set of cells, plus exact full-sample point values.

    y_matrix [P, G*(1+2C)]: per distinct concept block g: n, sum y~, sum y~^2 (y~ centred, scaled).
    cell_blocks: list of [P, nb*(2+3C)]: per cell: sse/SST, sst/SST, sum a~, sum a~^2, sum a~y~.
    cell_group [cells]: which concept block each cell uses (identical blocks are stored once).
    point [cells, 3]: reconstruction, accessibility, coverage from the raw sums (no resampling).
    point_r [cells, C]: per-concept test r from the raw sums.
    active [P]: patients with at least one evaluated record (the published stream draws over these only, e.g.
    the complete-case patients of a MIMIC run whose patient_stats keep empty patients with n = 0).
    """

    cell_ids: tuple[str, ...]
    n_patients: int
    n_concepts: int
    y_matrix: np.ndarray
    cell_blocks: list  # np.ndarray, or ray.ObjectRef when loaded with put=True
    block_sizes: list[int]
    cell_group: np.ndarray
    point: np.ndarray
    point_r: np.ndarray
    threshold: float
    active: np.ndarray | None = None

    @property
    def block_slices(self) -> list[slice]:
        starts = np.cumsum([0, *self.block_sizes])
        return [slice(int(a), int(b)) for a, b in zip(starts[:-1], starts[1:], strict=True)]


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    if not path.exists():
        raise StatsError(f"{path}: missing; rerun the SAE stage for this cell (raybench train) to write it")
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _center_cell(stats: dict[str, np.ndarray], path: Path, n_concepts: int | None,
                 n_patients: int | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
    """-> (cell columns [P, 2+3C], y columns [P, 1+2C], (SSE, SST) totals, raw totals [C, 5], records)."""
    for key in ("n", "sse", "sst", "corr"):
        if key not in stats:
            raise StatsError(f"{path}: no array {key!r}; expected n [P], sse [P], sst [P], corr [P, C, 5]")
    n = stats["n"].astype(np.float64)
    sse, sst, corr = stats["sse"].astype(np.float64), stats["sst"].astype(np.float64), stats["corr"].astype(np.float64)
    p = n.shape[0]
    if corr.ndim != 3 or corr.shape[0] != p or corr.shape[2] != 5 or sse.shape != (p,) or sst.shape != (p,):
        raise StatsError(f"{path}: shapes n {n.shape}, sse {sse.shape}, sst {sst.shape}, corr {corr.shape} "
                         f"do not fit n [P], sse [P], sst [P], corr [P, C, 5]")
    if n_patients is not None and p != n_patients:
        raise StatsError(f"{path}: {p} patients, other cells have {n_patients}; every cell must use the same "
                         f"sorted test patients (rerun the cell's evaluation)")
    if n_concepts is not None and corr.shape[1] != n_concepts:
        raise StatsError(f"{path}: {corr.shape[1]} concepts, metrics.json lists {n_concepts}")
    if not (np.all(np.isfinite(corr)) and np.all(np.isfinite(sse)) and np.all(np.isfinite(sst))):
        raise StatsError(f"{path}: non-finite sufficient statistics; the cell's evaluation diverged - rerun it")
    tot = corr.sum(axis=0)  # [C, 5]
    big_n = n.sum()
    sa, sy, saa, syy, say = (corr[:, :, i] for i in range(5))
    ma, my = tot[:, 0] / big_n, tot[:, 1] / big_n
    va = np.maximum(tot[:, 2] / big_n - ma**2, 0.0)
    vy = np.maximum(tot[:, 3] / big_n - my**2, 0.0)
    const_a = va <= _CONSTANT_TOL * np.maximum(tot[:, 2] / big_n, 1e-300)
    const_y = vy <= _CONSTANT_TOL * np.maximum(tot[:, 3] / big_n, 1e-300)
    sda = np.where(const_a, 1.0, np.sqrt(va))
    sdy = np.where(const_y, 1.0, np.sqrt(vy))
    nn = n[:, None]
    a_c = (sa - nn * ma) / sda
    aa_c = (saa - 2 * ma * sa + nn * ma**2) / sda**2
    y_c = (sy - nn * my) / sdy
    yy_c = (syy - 2 * my * sy + nn * my**2) / sdy**2
    ay_c = (say - my * sa - ma * sy + nn * ma * my) / (sda * sdy)
    a_c[:, const_a] = aa_c[:, const_a] = 0.0
    ay_c[:, const_a | const_y] = 0.0
    y_c[:, const_y] = yy_c[:, const_y] = 0.0
    sst_tot = sst.sum()
    if not sst_tot > 0:
        raise StatsError(f"{path}: total SST is {sst_tot}; the test activations are constant")
    cell_cols = np.concatenate([(sse / sst_tot)[:, None], (sst / sst_tot)[:, None], a_c, aa_c, ay_c], axis=1)
    y_cols = np.concatenate([n[:, None], y_c, yy_c], axis=1)
    return cell_cols, y_cols, np.array([sse.sum(), sst_tot]), tot, big_n


def load_patient_stats(paths: Sequence[Path], cell_ids: Sequence[str], n_concepts: int, threshold: float,
                       cells_per_block: int = 64, put: bool = False, dtype: type = np.float64) -> PatientStats:
    """Read every cell's patient_stats.npz, one cell at a time, into packed column blocks (see pack_patient_stats)."""
    if len(paths) != len(cell_ids) or not paths:
        raise StatsError(f"need one patient_stats path per cell, got {len(paths)} paths for {len(cell_ids)} cells")
    items = ((Path(p), _read_npz(Path(p))) for p in paths)
    return pack_patient_stats(items, cell_ids, n_concepts, threshold, cells_per_block, put, dtype)


def pack_patient_stats(items: Iterable[tuple[Path | str, dict[str, np.ndarray]]], cell_ids: Sequence[str],
                       n_concepts: int, threshold: float, cells_per_block: int = 64, put: bool = False,
                       dtype: type = np.float64) -> PatientStats:
    """Pack (label, {n, sse, sst, corr}) per cell, consumed one at a time, into centred column blocks.

    dtype float32 halves memory and roughly doubles GEMM speed at ~1e-6 error in r (float64: exact).

    put=True moves each finished block into the Ray object store at once (the driver keeps only a
    reference), so peak driver memory is one block, not the whole packed matrix.
    """
    n_cells = len(cell_ids)
    width = _CELL_FIXED + 3 * n_concepts
    groups: dict[str, int] = {}
    y_parts: list[np.ndarray] = []
    cell_group = np.zeros(n_cells, dtype=np.int64)
    point = np.zeros((n_cells, 3))
    point_r = np.zeros((n_cells, n_concepts))
    blocks: list = []
    sizes: list[int] = []
    current: np.ndarray | None = None
    n_patients: int | None = None
    active: np.ndarray | None = None
    i = -1
    for i, (label, raw) in enumerate(items):
        if i >= n_cells:
            raise StatsError(f"more statistics than cell ids ({n_cells})")
        cell_cols, y_cols, fid, tot, big_n = _center_cell(raw, Path(label), n_concepts, n_patients)
        n_patients = cell_cols.shape[0]
        active = (y_cols[:, 0] > 0) if active is None else (active | (y_cols[:, 0] > 0))
        key = hashlib.sha256(np.ascontiguousarray(y_cols).tobytes()).hexdigest()
        if key not in groups:
            groups[key] = len(y_parts)
            y_parts.append(y_cols)
        cell_group[i] = groups[key]
        r = pearson_from_sums(big_n, *(tot[:, j] for j in range(5)))
        point_r[i] = r
        point[i] = (1.0 - fid[0] / fid[1], np.mean(np.abs(r)), np.mean(np.abs(r) >= threshold))
        j = i % cells_per_block
        if j == 0:
            sizes.append(min(cells_per_block, n_cells - i))
            current = np.empty((n_patients, sizes[-1] * width), dtype=dtype)
        current[:, j * width:(j + 1) * width] = cell_cols
        if j == sizes[-1] - 1:
            blocks.append(ray.put(current) if put else current)
            current = None
    if i + 1 != n_cells:
        raise StatsError(f"statistics for {i + 1} cells, expected {n_cells}")
    return PatientStats(tuple(cell_ids), int(n_patients), n_concepts, np.concatenate(y_parts, axis=1), blocks,
                        sizes, cell_group, point, point_r, threshold, active)


def metrics_from_weighted(yw: np.ndarray, cw: np.ndarray, cell_group: np.ndarray, n_concepts: int,
                          threshold: float, tol: float = _CONSTANT_TOL) -> np.ndarray:
    """Weighted sums -> [draws, cells, 3] (R^2, accessibility, coverage).

    yw [D, G*(1+2C)] and cw [D, nb*(2+3C)] are the draw-weighted column sums of PatientStats' matrices
    (centred, so a variance below tol * n * sum(a~^2) is rounding: the coordinate is constant in that draw).
    """
    c = n_concepts
    d = cw.shape[0]
    cw = np.asarray(cw, dtype=np.float64).reshape(d, -1, _CELL_FIXED + 3 * c)
    yw = np.asarray(yw, dtype=np.float64).reshape(d, -1, 1 + 2 * c)
    groups = np.unique(cell_group)
    yw = yw[:, groups[:1]] if groups.size == 1 else yw[:, cell_group]  # one shared block: broadcast, no gather
    n, sy, syy = yw[:, :, :1], yw[:, :, 1:1 + c], yw[:, :, 1 + c:]
    sa, saa, say = cw[:, :, 2:2 + c], cw[:, :, 2 + c:2 + 2 * c], cw[:, :, 2 + 2 * c:]
    var_y = n * syy - sy * sy
    var_y = np.where(var_y > tol * n * syy, var_y, 0.0)
    nsaa = n * saa
    var_a = nsaa - sa * sa
    var_a *= var_a > tol * nsaa
    cov = n * say
    cov -= sa * sy
    den2 = var_a * var_y
    with np.errstate(divide="ignore", invalid="ignore"):
        absr = np.sqrt(np.where(den2 > 0, cov * cov / den2, 0.0))
    out = np.empty((d, cw.shape[1], 3))
    out[:, :, 0] = 1.0 - cw[:, :, 0] / cw[:, :, 1]
    out[:, :, 1] = np.minimum(absr, 1.0).mean(axis=-1)
    out[:, :, 2] = (absr >= threshold).mean(axis=-1)
    return out


# ---------------------------------------------------------------- draws


def n_chunks(n_draws: int, chunk_draws: int) -> int:
    return math.ceil(n_draws / chunk_draws)


def patient_counts(seed: int, n_draws: int, chunk_draws: int, n_patients: int, chunk: int) -> np.ndarray:
    """Multinomial patient counts [draws_in_chunk, P] of one chunk; chunk i uses child i of one SeedSequence."""
    children = np.random.SeedSequence(seed).spawn(n_chunks(n_draws, chunk_draws))
    size = min(chunk_draws, n_draws - chunk * chunk_draws)
    rng = np.random.default_rng(children[chunk])
    return rng.multinomial(n_patients, np.full(n_patients, 1.0 / n_patients), size=size).astype(np.float64)


def crossed_indices(seed: int, n_draws: int, chunk_draws: int, n_depths: int, n_seeds: int,
                    chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunked stream: resampled positions of depth units [draws, D] and seeds [draws, S] of one chunk.

    Its own SeedSequence([seed, 1]) so its draws never coincide with the patient bootstrap's.
    """
    children = np.random.SeedSequence([seed, 1]).spawn(n_chunks(n_draws, chunk_draws))
    size = min(chunk_draws, n_draws - chunk * chunk_draws)
    rng = np.random.default_rng(children[chunk])
    di = rng.integers(0, n_depths, size=(size, n_depths))
    si = rng.integers(0, n_seeds, size=(size, n_seeds))
    return di, si


def crossed_counts(seed: int, n_draws: int, chunk_draws: int, n_depths: int, n_seeds: int,
                   chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """Chunked stream: resampling counts of depth units [draws, D] and seeds [draws, S] of one chunk."""
    di, si = crossed_indices(seed, n_draws, chunk_draws, n_depths, n_seeds, chunk)
    return index_counts(di, n_depths), index_counts(si, n_seeds)


def crossed_draw_indices(seed: int, n_draws: int, chunk_draws: int, n_depths: int, n_seeds: int,
                         stream: str = "chunked") -> tuple[np.ndarray, np.ndarray]:
    """Every crossed draw of a stream: positions of the depth units [draws, D] and seeds [draws, S]."""
    if check_stream(stream) == "published":
        return published_crossed_indices(seed, n_draws, n_depths, n_seeds)
    parts = [crossed_indices(seed, n_draws, chunk_draws, n_depths, n_seeds, c)
             for c in range(n_chunks(n_draws, chunk_draws))]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def patient_draws(stats: PatientStats | int, n_draws: int, seed: int, chunk_draws: int,
                  stream: str = "chunked") -> Iterator[np.ndarray]:
    """The patient-count chunks [<= chunk_draws, P] a patient bootstrap of `stats` uses, in draw order.

    stats: the packed statistics (or just P).  The published stream draws over the active patients only and
    gives the others a count of 0; the chunked stream draws over all P.
    """
    n_patients = stats if isinstance(stats, int) else stats.n_patients
    if check_stream(stream) == "chunked":
        for c in range(n_chunks(n_draws, chunk_draws)):
            yield patient_counts(seed, n_draws, chunk_draws, n_patients, c)
        return
    active = None if isinstance(stats, int) else stats.active
    if active is None or bool(np.all(active)):
        yield from published_patient_counts(seed, n_draws, n_patients, chunk_draws)
        return
    cols = np.flatnonzero(active)
    if cols.size == 0:
        raise StatsError("no test patient has an evaluated record; nothing to bootstrap")
    for part in published_patient_counts(seed, n_draws, int(cols.size), chunk_draws):
        full = np.zeros((part.shape[0], n_patients))
        full[:, cols] = part
        yield full


# ---------------------------------------------------------------- Ray tasks


@ray.remote(num_cpus=1)
def _counts_task(seed: int, n_draws: int, chunk_draws: int, n_patients: int, chunk: int) -> np.ndarray:
    return patient_counts(seed, n_draws, chunk_draws, n_patients, chunk)


@ray.remote(num_cpus=1)
def _patient_chunk(counts: np.ndarray, y_matrix: np.ndarray, block: np.ndarray, group: np.ndarray, n_concepts: int,
                   threshold: float) -> np.ndarray:
    tol = _CONSTANT_TOL if block.dtype == np.float64 else _CONSTANT_TOL_F32
    return metrics_from_weighted(counts @ y_matrix, counts.astype(block.dtype) @ block, group, n_concepts,
                                 threshold, tol)


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


def _run_bounded(jobs: Sequence[Callable[[], ray.ObjectRef]], num_workers: int | None) -> list[np.ndarray]:
    """Submit jobs with at most num_workers in flight; results come back in job order."""
    limit = len(jobs) if num_workers is None else max(1, int(num_workers))
    results: list[np.ndarray | None] = [None] * len(jobs)
    pending: dict[ray.ObjectRef, int] = {}
    nxt = 0
    while nxt < len(jobs) or pending:
        while nxt < len(jobs) and len(pending) < limit:
            pending[jobs[nxt]()] = nxt
            nxt += 1
        done, _ = ray.wait(list(pending), num_returns=1)
        for ref in done:
            results[pending.pop(ref)] = ray.get(ref)
    return results  # type: ignore[return-value]


def patient_bootstrap(stats: PatientStats, n_draws: int, seed: int, chunk_draws: int = 250,
                      num_workers: int | None = None, stream: str = "chunked") -> np.ndarray:
    """Paired patient bootstrap -> [n_draws, cells, 3] (reconstruction R^2, accessibility, coverage).

    The same draws apply to every cell (paired).  Data go to the object store once; each task is one
    (draw chunk, cell block) GEMM.  num_workers caps concurrent tasks (None: as many as Ray schedules).
    stream: "published" (the protocol code's draws, made in order on the driver) or "chunked" (each chunk's
    own SeedSequence child, drawn in its task); see raybench.analysis.streams.
    """
    y_ref = ray.put(stats.y_matrix)
    block_refs = [b if isinstance(b, ray.ObjectRef) else ray.put(b) for b in stats.cell_blocks]
    slices = stats.block_slices
    group_refs = [stats.cell_group[s] for s in slices]
    if check_stream(stream) == "published":
        count_refs = [ray.put(c) for c in patient_draws(stats, n_draws, seed, chunk_draws, stream)]
    else:
        count_refs = [_counts_task.remote(seed, n_draws, chunk_draws, stats.n_patients, c)
                      for c in range(n_chunks(n_draws, chunk_draws))]
    jobs, where = [], []
    for c, cref in enumerate(count_refs):
        for b, bref in enumerate(block_refs):
            jobs.append(lambda cref=cref, bref=bref, g=group_refs[b]: _patient_chunk.remote(
                cref, y_ref, bref, g, stats.n_concepts, stats.threshold))
            where.append((c, b))
    results = _run_bounded(jobs, num_workers)
    out = np.empty((n_draws, len(stats.cell_ids), 3))
    for (c, b), res in zip(where, results, strict=True):
        out[c * chunk_draws:c * chunk_draws + res.shape[0], slices[b]] = res
    return out


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
    return np.concatenate(_run_bounded(jobs, num_workers), axis=0)
