"""Seed reproducibility of the decoder dictionaries on a run (docs/protocol.md §7): one Ray task per
model x depth x E reads its seeds' decoder_top.npz and compares every seed pair (metrics.reproducibility).

The permutation floor's generator: the published stream seeds one generator per seed pair
(streams.pair_floor_seeds); the chunked stream one per model x depth x E (streams.chunked_floor_seed).
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import ray

from raybench.analysis.inference.bootstrap import run_bounded
from raybench.analysis.inference.metrics import reproducibility
from raybench.analysis.inference.packed_stats import StatsError
from raybench.analysis.inference.streams import chunked_floor_seed, pair_floor_seeds
from raybench.core.config import Protocol
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)

COLUMNS = ["model", "q", "expansion", "matched_cosine", "random_floor", "excess", "subspace_overlap"]
PAIR_COLUMNS = ["model", "q", "expansion", "seed_a", "seed_b", "matched_cosine", "random_floor", "excess",
                "subspace_overlap"]


@ray.remote(num_cpus=1)
def _repro_task(paths: list[str], top: int, n_perm: int, seed: int,
                pair_seeds: list[int] | None = None) -> dict[str, float]:
    decs = []
    for p in paths:
        with np.load(p, allow_pickle=False) as z:
            if "columns" not in z.files:
                raise StatsError(f"{p}: no 'columns' array; expected columns [d, m] and indices [m]")
            decs.append(z["columns"])
    return reproducibility(decs, top, n_perm, seed, pair_seeds)


def reproducibility_tables(layout: RunLayout, ok: pd.DataFrame, protocol: Protocol,
                           num_workers: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """-> (the reproducibility table, its values per seed pair: paper_analyses 'reproducibility_pairs')."""
    prim = ok[ok.arm == "primary"]
    jobs, keys = [], []
    for (m, q, e), sub in prim.groupby(["model", "q", "expansion"], sort=True):
        if len(sub) < 2:
            log.warning("reproducibility: %s q=%g E=%d has %d ok seed(s); needs 2", m, q, e, len(sub))
            continue
        paths = []
        for cdir in sub.sort_values("seed").cell_dir:
            path = (layout.root / str(cdir) / "decoder_top.npz").resolve()
            if not path.exists():
                raise StatsError(f"{path}: missing; rerun the SAE stage for this cell")
            paths.append(str(path))
        seed = chunked_floor_seed(protocol.inference.seed, m, q, int(e))
        pair_seeds = pair_floor_seeds(protocol.inference.stream, m, int(sub.layer.iloc[0]), q, int(e), "primary",
                                      [int(s) for s in sub.seed])  # published stream: one generator per seed pair
        jobs.append(lambda p=paths, s=seed, ps=pair_seeds: _repro_task.remote(
            p, protocol.eval.repro_top, protocol.eval.repro_permutations, s, ps))
        keys.append((m, q, e, sorted(int(s) for s in sub.seed)))
    results = run_bounded(jobs, num_workers)
    rows = [{"model": m, "q": q, "expansion": int(e), **{k: r[k] for k in COLUMNS[3:]}}
            for (m, q, e, _), r in zip(keys, results, strict=True)]
    pairs = [(m, q, int(e), ss[i], ss[j], mc, rf, mc - rf, ov)
             for (m, q, e, ss), r in zip(keys, results, strict=True) for i, j, mc, rf, ov in r["pairs"]]
    return pd.DataFrame(rows, columns=COLUMNS), pd.DataFrame(pairs, columns=PAIR_COLUMNS)
