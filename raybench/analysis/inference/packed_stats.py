"""Per-patient statistics of many cells, packed for the patient bootstrap (docs/protocol.md §8).

Every cell's test-set metrics are functions of its per-patient sums (patient_stats.npz, written by the SAE
stage through raybench.core.sufficient_stats.patient_stats), so a bootstrap draw (multinomial patient counts w) is
a weighted column sum and a chunk of draws is one GEMM  counts [draws, P] x packed [P, features].  Statistics
are centred on the full-test means and scaled to unit variance before packing, so the sums stay well
conditioned; `metrics_from_weighted` turns weighted sums back into (reconstruction R^2, accessibility,
coverage) with the one Pearson-from-sums of raybench.core.sufficient_stats.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import ray

from raybench.core.sufficient_stats import CONSTANT_RTOL, centered_sum_of_squares, pearson_from_sums

METRIC_NAMES: tuple[str, ...] = ("reconstruction", "accessibility", "coverage")
CELL_FIXED = 2  # sse, sst columns in front of each cell's packed block
CONSTANT_RTOL_F32 = 1e-5  # the zero-variance rule's rtol for float32 packed statistics (rounding of float32 sums)


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


class BlockReady(NamedTuple):
    """A block of packed cells, handed to pack_patient_stats' `on_block` as soon as it is complete."""

    index: int
    block: Any
    """[P, nb*(2+3C)] array, or its ray.ObjectRef with put=True."""
    group: np.ndarray
    """[nb] the concept block of each of the block's cells (indices into y_matrix)."""
    y_matrix: np.ndarray
    """The distinct concept blocks read so far: every group of this block is among them."""
    n_patients: int
    active: np.ndarray
    """Patients with an evaluated record in the cells read so far."""


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
    n = np.asarray(stats["n"], dtype=np.float64)  # no copy when already float64
    sse, sst = np.asarray(stats["sse"], dtype=np.float64), np.asarray(stats["sst"], dtype=np.float64)
    corr = np.asarray(stats["corr"], dtype=np.float64)
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
    sa, sy, saa, syy, say = np.moveaxis(corr, 2, 0).copy()  # contiguous [P, C] each: the elementwise passes run faster
    ma, my = tot[:, 0] / big_n, tot[:, 1] / big_n
    va = np.maximum(tot[:, 2] / big_n - ma**2, 0.0)
    vy = np.maximum(tot[:, 3] / big_n - my**2, 0.0)
    const_a = centered_sum_of_squares(big_n, tot[:, 0], tot[:, 2]) == 0  # the one zero-variance rule
    const_y = centered_sum_of_squares(big_n, tot[:, 1], tot[:, 3]) == 0
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


def load_packed_stats(paths: Sequence[Path], cell_ids: Sequence[str], n_concepts: int, threshold: float,
                      cells_per_block: int = 64, put: bool = False, dtype: type = np.float64) -> PatientStats:
    """Read every cell's patient_stats.npz, one cell at a time, into packed column blocks (see pack_patient_stats).

(Not raybench.sae.cellio.load_patient_stats, which reads one cell's file as it is.)"""
    return pack_patient_stats(read_cell_stats(paths, cell_ids), cell_ids, n_concepts, threshold, cells_per_block,
                              put, dtype)


def read_cell_stats(paths: Sequence[Path], cell_ids: Sequence[str]) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    """(path, arrays) of every cell's patient_stats.npz, read one at a time as consumed (pack_patient_stats' items)."""
    if len(paths) != len(cell_ids) or not paths:
        raise StatsError(f"need one patient_stats path per cell, got {len(paths)} paths for {len(cell_ids)} cells")
    return ((Path(p), _read_npz(Path(p))) for p in paths)


def pack_patient_stats(items: Iterable[tuple[Path | str, dict[str, np.ndarray]]], cell_ids: Sequence[str],
                       n_concepts: int, threshold: float, cells_per_block: int = 64, put: bool = False,
                       dtype: type = np.float64,
                       on_block: Callable[[BlockReady], None] | None = None) -> PatientStats:
    """Pack (label, {n, sse, sst, corr}) per cell, consumed one at a time, into centred column blocks.

    dtype float32 halves memory and roughly doubles GEMM speed at ~1e-6 error in r (float64: exact).

    put=True moves each finished block into the Ray object store at once (the driver keeps only a
    reference), so peak driver memory is one block, not the whole packed matrix. on_block is called with each
    finished block (raybench.analysis.inference.bootstrap.packed_patient_bootstrap starts its tasks there).
    """
    n_cells = len(cell_ids)
    width = CELL_FIXED + 3 * n_concepts
    groups: dict[str, list[int]] = {}  # cheap fingerprint -> candidate y blocks (confirmed by exact comparison)
    y_parts: list[np.ndarray] = []
    cell_group = np.zeros(n_cells, dtype=np.int64)
    point = np.zeros((n_cells, 3))
    point_r = np.zeros((n_cells, n_concepts))
    blocks: list = []
    sizes: list[int] = []
    current: np.ndarray | None = None
    staging: np.ndarray | None = None  # put=True: one block buffer, faulted in once, reused for every block
    n_patients: int | None = None
    active: np.ndarray | None = None
    i = -1
    for i, (label, raw) in enumerate(items):
        if i >= n_cells:
            raise StatsError(f"more statistics than cell ids ({n_cells})")
        cell_cols, y_cols, fid, tot, big_n = _center_cell(raw, Path(label), n_concepts, n_patients)
        n_patients = cell_cols.shape[0]
        active = (y_cols[:, 0] > 0) if active is None else (active | (y_cols[:, 0] > 0))
        cell_group[i] = _y_group(y_cols, y_parts, groups)
        r = pearson_from_sums(big_n, *(tot[:, j] for j in range(5)))
        point_r[i] = r
        point[i] = (1.0 - fid[0] / fid[1], np.mean(np.abs(r)), np.mean(np.abs(r) >= threshold))
        j = i % cells_per_block
        if j == 0:
            sizes.append(min(cells_per_block, n_cells - i))
            if not put:
                current = np.empty((n_patients, sizes[-1] * width), dtype=dtype)
            else:
                if staging is None:
                    # written column-slice by column-slice, a fresh block page-faults row by row; filling it once
                    # first costs one sequential pass
                    staging = small_page_array((n_patients, sizes[-1] * width), dtype)
                    staging.fill(0.0)
                current = staging if sizes[-1] * width == staging.shape[1] else staging[:, :sizes[-1] * width]
        current[:, j * width:(j + 1) * width] = cell_cols
        if j == sizes[-1] - 1:
            blocks.append(ray.put(np.ascontiguousarray(current)) if put else current)
            current = None
            if on_block is not None:
                on_block(BlockReady(len(blocks) - 1, blocks[-1], cell_group[i - j:i + 1].copy(),
                                    np.concatenate(y_parts, axis=1), int(n_patients), active.copy()))
    if i + 1 != n_cells:
        raise StatsError(f"statistics for {i + 1} cells, expected {n_cells}")
    return PatientStats(tuple(cell_ids), int(n_patients), n_concepts, np.concatenate(y_parts, axis=1), blocks,
                        sizes, cell_group, point, point_r, threshold, active)


def small_page_array(shape: tuple[int, int], dtype: type) -> np.ndarray:
    """A zeroed array on ordinary 4 KiB pages (anonymous mmap memory, which numpy does not advise).

    numpy advises every array of 4 MiB or more for transparent huge pages. Faulting those in can stall when the
    kernel has no free huge page at hand: with a local Ray instance up, filling the 218 MB staging block of the
    published-scale bootstrap took 3.1 s advised against 0.18 s here, and bench/bootstrap.py's pipelined run
    went from 17.0 s to 12.8 s. The staging block is written once per block and copied into the object store,
    so huge pages' smaller TLB cost never repays that."""
    count = int(np.prod(shape))
    buffer = mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1))
    return np.frombuffer(buffer, dtype=dtype, count=count).reshape(shape)


def _y_group(y_cols: np.ndarray, parts: list[np.ndarray], groups: dict[str, list[int]]) -> int:
    """The index of y_cols among the distinct concept blocks `parts` (appended when new): cells evaluated on the same
    test records share one block. A digest of a strided sample finds the candidates, an exact comparison decides."""
    sample = np.ascontiguousarray(y_cols[::max(1, y_cols.shape[0] // 64)])
    key = hashlib.sha256(sample.tobytes() + str(y_cols.shape).encode()).hexdigest()
    for g in groups.setdefault(key, []):
        if np.array_equal(parts[g], y_cols):
            return g
    groups[key].append(len(parts))
    parts.append(y_cols)
    return len(parts) - 1


def metrics_from_weighted(yw: np.ndarray, cw: np.ndarray, cell_group: np.ndarray, n_concepts: int,
                          threshold: float, rtol: float = CONSTANT_RTOL) -> np.ndarray:
    """Weighted sums -> [draws, cells, 3] (R^2, accessibility, coverage).

    yw [D, G*(1+2C)] and cw [D, nb*(2+3C)] are the draw-weighted column sums of PatientStats' matrices
    (centred, so the zero-variance rule of raybench.core.sufficient_stats applies to them as to raw sums; pass
    rtol=CONSTANT_RTOL_F32 for float32-packed statistics).
    """
    c = n_concepts
    d = cw.shape[0]
    cw = np.asarray(cw, dtype=np.float64).reshape(d, -1, CELL_FIXED + 3 * c)
    yw = np.asarray(yw, dtype=np.float64).reshape(d, -1, 1 + 2 * c)
    groups = np.unique(cell_group)
    yw = yw[:, groups[:1]] if groups.size == 1 else yw[:, cell_group]  # one shared block: broadcast, no gather
    n, sy, syy = yw[:, :, :1], yw[:, :, 1:1 + c], yw[:, :, 1 + c:]
    sa, saa, say = cw[:, :, 2:2 + c], cw[:, :, 2 + c:2 + 2 * c], cw[:, :, 2 + 2 * c:]
    absr = abs_pearson_inplace(n, sa, sy, saa, syy, say, rtol)
    out = np.empty((d, cw.shape[1], 3))
    out[:, :, 0] = 1.0 - cw[:, :, 0] / cw[:, :, 1]
    out[:, :, 1] = absr.mean(axis=-1)
    out[:, :, 2] = (absr >= threshold).mean(axis=-1)
    return out


def abs_pearson_inplace(n: np.ndarray, sa: np.ndarray, sy: np.ndarray, saa: np.ndarray, syy: np.ndarray,
                        say: np.ndarray, rtol: float = CONSTANT_RTOL) -> np.ndarray:
    """|pearson_from_sums(...)| (float64) with the same operations in the same order, so bit for bit the same values,
    but in a few reused buffers: the bootstrap calls it on [draws, cells, C] arrays, where fresh temporaries per
    operation cost more than the arithmetic. The y side ([draws, 1, C] when the cells share one concept block) is
    broadcast, not copied."""
    def css(s1: np.ndarray, s2: np.ndarray) -> np.ndarray:  # centered_sum_of_squares
        nss = n * s2
        var = s1 * s1
        np.subtract(nss, var, out=var)
        np.abs(nss, out=nss)
        nss *= rtol
        var[~(var > nss)] = 0.0  # as np.where(var > rtol * |nss|, var, 0): NaN too
        return var

    var_a = css(sa, saa)
    var_y = css(sy, syy)
    cov = n * say
    cov -= sa * sy
    var_a *= var_y  # den^2
    np.sqrt(var_a, out=var_a)
    positive = var_a > 0
    np.divide(cov, var_a, out=cov, where=positive)
    cov[~positive] = 0.0
    np.clip(cov, -1.0, 1.0, out=cov)
    return np.abs(cov, out=cov)
