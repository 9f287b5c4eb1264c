"""Concept-level patient-bootstrap intervals: each concept's common-scale AUC of |r| per model (docs/protocol.md §10.3).

The published summary of the patient bootstrap gives every concept of every model an interval: the draw's |r|
of the concept in each cell, weighted by the cell's common-scale AUC coefficient, summed, and the 2.5 / 97.5
percentiles over draws. Here the same paired draws as the profiles (the same count chunks of the same
stream, `bootstrap._count_refs`) run over the same packed blocks; each Ray task is one (draw chunk, cell
block) pair and returns the block's weighted contribution [draws, concepts, models], summed on the driver in
block order (so results do not depend on the number of workers). The mean over concepts of a draw is the
accessibility profile's draw, up to the summation order.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import ray

from raybench.analysis.inference import stats as st
from raybench.analysis.inference.bootstrap import _count_refs, run_bounded
from raybench.analysis.inference.packed_stats import CELL_FIXED, CONSTANT_RTOL_F32, PatientStats, abs_pearson_inplace
from raybench.cohorts.panel import concept_families
from raybench.core.sufficient_stats import CONSTANT_RTOL

INTERVAL_COLUMNS = ["model", "concept", "family", "auc", "ci_low", "ci_high"]


def concept_abs_r(yw: np.ndarray, cw: np.ndarray, cell_group: np.ndarray, n_concepts: int,
                  rtol: float = CONSTANT_RTOL) -> np.ndarray:
    """Weighted sums (as packed_stats.metrics_from_weighted takes them) -> |r| [draws, cells, concepts]."""
    c = n_concepts
    d = cw.shape[0]
    cw = np.asarray(cw, dtype=np.float64).reshape(d, -1, CELL_FIXED + 3 * c)
    yw = np.asarray(yw, dtype=np.float64).reshape(d, -1, 1 + 2 * c)[:, cell_group]
    n, sy, syy = yw[:, :, :1], yw[:, :, 1:1 + c], yw[:, :, 1 + c:]
    sa, saa, say = cw[:, :, 2:2 + c], cw[:, :, 2 + c:2 + 2 * c], cw[:, :, 2 + 2 * c:]
    return abs_pearson_inplace(n, sa, sy, saa, syy, say, rtol)


def concept_auc_chunk(counts: np.ndarray, y_matrix: np.ndarray, block: np.ndarray, group: np.ndarray,
                      n_concepts: int, weights: np.ndarray) -> np.ndarray:
    """One (draw chunk, cell block): counts [D, P], the block's packed columns, weights [cells of block, M] ->
    the block's share of every model's concept AUC draws [D, C, M]."""
    rtol = CONSTANT_RTOL if block.dtype == np.float64 else CONSTANT_RTOL_F32
    groups, local = np.unique(group, return_inverse=True)
    width = 1 + 2 * n_concepts
    yw = counts @ y_matrix[:, (groups[:, None] * width + np.arange(width)).ravel()]
    absr = concept_abs_r(yw, counts.astype(block.dtype) @ block, local, n_concepts, rtol)
    return np.einsum("dbc,bm->dcm", absr, np.asarray(weights, dtype=np.float64))


@ray.remote(num_cpus=1)
def _concept_chunk(counts: np.ndarray, y_matrix: np.ndarray, block: np.ndarray, group: np.ndarray, n_concepts: int,
                   weights: np.ndarray) -> np.ndarray:
    return concept_auc_chunk(counts, y_matrix, block, group, n_concepts, weights)


def concept_bootstrap(stats: PatientStats, weights: np.ndarray, n_draws: int, seed: int, chunk_draws: int,
                      num_workers: int | None = None, stream: str = "chunked") -> np.ndarray:
    """Concept AUC draws [n_draws, C, M] on the profiles' patient draws; weights [cells, M] (the profiles')."""
    y_ref = ray.put(stats.y_matrix)
    block_refs = [b if isinstance(b, ray.ObjectRef) else ray.put(b) for b in stats.cell_blocks]
    slices = stats.block_slices
    count_refs = _count_refs(stats.n_patients, stats.active, n_draws, seed, chunk_draws, stream)
    jobs, where = [], []
    for c, cref in enumerate(count_refs):
        for b, bref in enumerate(block_refs):
            w = np.ascontiguousarray(weights[slices[b]])
            jobs.append(lambda cref=cref, bref=bref, g=stats.cell_group[slices[b]], w=w: _concept_chunk.remote(
                cref, y_ref, bref, g, stats.n_concepts, w))
            where.append(c)
    out = np.zeros((n_draws, stats.n_concepts, weights.shape[1]))
    for c, res in zip(where, run_bounded(jobs, num_workers), strict=True):  # job order: blocks in order per chunk
        out[c * chunk_draws:c * chunk_draws + res.shape[0]] += res
    return out


def concept_intervals(draws: np.ndarray, point_r: np.ndarray, weights: np.ndarray, models: list[str],
                      concepts: list[str], lo: float, hi: float) -> pd.DataFrame:
    """model, concept, family, auc (the `concepts` table's point value), percentile CI of the draws [n, C, M]."""
    point = np.abs(point_r).T @ weights  # [C, M], as tables.concept_table
    fams = concept_families(concepts)
    rows = []
    for i, m in enumerate(models):
        clo, chi = st.percentile_ci(draws[:, :, i], lo, hi)
        rows += [(m, c, fams[j], float(point[j, i]), float(clo[j]), float(chi[j])) for j, c in enumerate(concepts)]
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)
