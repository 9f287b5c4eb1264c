"""Reseed noise of the evaluation (docs/protocol.md §11.1): hold each sampled SAE fixed and redo what evaluation
draws at random with R other seeds.

- the selection subset (eval.selection_seed): coordinates are re-selected and the cell's test accessibility and
  coverage recomputed by raybench.sae.evaluate.evaluate_cell. When the train split is no larger than
  eval.selection_records the subset is the whole split (no draw), and this source is exactly zero.
- the permutation floor of reproducibility (the floor generator's seed), per sampled stack.
- the bootstrap stream (inference.seed): the patient bootstrap of the profiles redrawn (intervals.py), which
  moves interval ends and rank probabilities, never point values.
Reconstruction R2 and the dead fraction involve no draw (frozen-order evaluation): their reseed noise is 0 by
construction. One Ray task per sampled stack.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import ray
import torch

from raybench.analysis.inference.bootstrap import run_bounded
from raybench.analysis.inference.metrics import reproducibility
from raybench.core.config import Protocol
from raybench.core.paths import RunLayout

COLUMNS = ["source", "model", "q", "expansion", "seed", "reseed", "metric", "value"]
CELL_COLUMNS = ["source", "metric", "model", "q", "expansion", "seed", "drawn", "n", "mean", "s", "cv", "mrd_1",
                "mrd_3"]
NO_DRAW = ("reconstruction", "dead_fraction")


def reseed_seeds(base: int, n: int) -> list[int]:
    """R evaluation seeds derived from `base` (the original seed is not among them)."""
    return [int(s) for s in np.random.SeedSequence([int(base), 11]).generate_state(n)]


@ray.remote(num_cpus=1)
def _stack_task(root: str, cells: list[dict], protocol: Protocol, n_reseeds: int) -> list[tuple]:
    from raybench.cohorts.manifest import load_manifest
    from raybench.encoders.store import ActivationStore
    from raybench.sae.cell_files import load_cell_sae
    from raybench.sae.data import concept_present, load_cell_data, selection_ecg_ids
    from raybench.sae.evaluate import evaluate_cell

    torch.set_num_threads(1)
    layout = RunLayout.at(root)
    c0 = cells[0]
    model, q, e, layer = c0["model"], float(c0["q"]), int(c0["expansion"]), int(c0["layer"])
    data = load_cell_data(root, model, layer, protocol.eval)
    manifest, _ = load_manifest(layout.manifest)
    train_ids = np.asarray(ActivationStore(layout.activations_dir).ecg_ids(model, layer, "train"), dtype=np.int64)
    present_all = None
    if data.selection_present is not None:
        present_all = pd.DataFrame(concept_present(manifest, data.concept_names),
                                   index=manifest.ecg_id.to_numpy(np.int64))
    rows: list[tuple] = []
    saes = [load_cell_sae(Path(root) / str(c["cell_dir"])) for c in cells]
    for r, seed in enumerate(reseed_seeds(protocol.eval.selection_seed, n_reseeds)):
        sel = selection_ecg_ids(manifest, replace(protocol.eval, selection_seed=seed))
        idx = np.flatnonzero(np.isin(train_ids, sel))
        present = None if present_all is None else present_all.loc[train_ids[idx]].to_numpy(bool)
        for c, (sae, norm) in zip(cells, saes, strict=True):
            ev = evaluate_cell(sae, norm, data.acts, data.concepts, data.test_patient_codes, idx, protocol.eval,
                               n_patients=len(data.test_patients), selection_present=present)
            for metric, key in (("accessibility", "test_accessibility"), ("coverage", "test_coverage"),
                                ("reconstruction", "test_r2"), ("dead_fraction", "val_dead_fraction")):
                rows.append(("selection_subset", model, q, e, int(c["seed"]), r, metric, float(ev.metrics[key])))
    decs = []
    for c in cells:
        with np.load(Path(root) / str(c["cell_dir"]) / "decoder_top.npz", allow_pickle=False) as z:
            decs.append(z["columns"])
    if len(decs) >= 2:
        for r, seed in enumerate(reseed_seeds(protocol.inference.seed, n_reseeds)):
            ex = reproducibility(decs, protocol.eval.repro_top, protocol.eval.repro_permutations, seed)["excess"]
            rows.append(("permutation_floor", model, q, e, -1, r, "reproducibility", float(ex)))
    return rows


def selection_is_drawn(root: Path, protocol: Protocol) -> bool:
    """Whether the selection subset is a random draw (the train split is larger than eval.selection_records)."""
    from raybench.cohorts.manifest import load_manifest

    manifest, _ = load_manifest(RunLayout.at(root).manifest)
    return int((manifest["split"] == "train").sum()) > protocol.eval.selection_records


def evaluation_reseeds(root: Path, stacks: list[pd.DataFrame], protocol: Protocol, n_reseeds: int,
                       num_workers: int | None = None) -> pd.DataFrame:
    """Long table: each sampled cell's metrics under every selection reseed, each stack's reproducibility excess
    under every floor reseed."""
    cols = ["model", "q", "expansion", "layer", "seed", "cell_dir"]
    jobs = [lambda s=s: _stack_task.remote(str(root), s[cols].to_dict("records"), protocol, n_reseeds)
            for s in stacks]
    return pd.DataFrame([r for res in run_bounded(jobs, num_workers) for r in res], columns=COLUMNS)


def reseed_sd(long: pd.DataFrame) -> pd.DataFrame:
    """Per metric: pooled standard deviation over reseeds (within each cell, or stack), its df, the mean value."""
    from raybench.analysis.reliability.mrd import pooled_sd

    rows = []
    for metric, sub in long.groupby("metric", sort=False):
        groups = [g.value.to_numpy(float) for _, g in sub.groupby(["source", "model", "q", "expansion", "seed"])]
        s, df = pooled_sd(groups)
        rows.append((metric, str(sub.source.iloc[0]), s, df, float(sub.value.mean())))
    return pd.DataFrame(rows, columns=["metric", "source", "s_eval", "df_eval", "mean"])


def per_cell(long: pd.DataFrame, selection_drawn: bool) -> pd.DataFrame:
    """Per SAE (or stack, for the permutation floor): R reseeds' mean, sd s, CV, |D|*_1 = t(0.975, R-1) s sqrt(2)
    (two single-reseed scores) and |D|*_3 = t(0.975, 4) s sqrt(2/3) (two 3-seed means) (paper §3, Appendix D).
    `drawn` is False where no random draw is involved (R^2, dead fraction; the selection subset when it is the
    whole train split): there s is 0 by construction and says nothing about noise."""
    from raybench.analysis.reliability.mrd import cv, mrd

    rows = []
    keys = ["source", "metric", "model", "q", "expansion", "seed"]
    for key, g in long.groupby(keys, sort=False):
        v = g.value.to_numpy(float)
        v = v[np.isfinite(v)]
        n = int(v.size)
        s = float(v.std(ddof=1)) if n >= 2 and np.ptp(v) > 0 else (0.0 if n >= 2 else float("nan"))
        drawn = key[1] not in NO_DRAW and (key[0] != "selection_subset" or selection_drawn)
        rows.append((*key, drawn, n, float(v.mean()) if n else float("nan"), s, cv(s, float(v.mean())) if n else
                     float("nan"), mrd(s, 1, df=n - 1) if n >= 2 else float("nan"), mrd(s, 3)))
    return pd.DataFrame(rows, columns=CELL_COLUMNS)


def reseed_summary(cells: pd.DataFrame) -> pd.DataFrame:
    """Per metric over the drawn cells: median s, CV, |D|*_1 and |D|*_3, and the spread of s across cells (min,
    max: the paper's caveat that one SAE's s is not every SAE's)."""
    rows = []
    for metric, g in cells[cells.drawn.astype(bool)].groupby("metric", sort=False):
        rows.append((metric, len(g), float(g.s.median()), float(g.s.min()), float(g.s.max()), float(g.cv.median()),
                     float(g.mrd_1.median()), float(g.mrd_3.median())))
    return pd.DataFrame(rows, columns=["metric", "n_cells", "s_median", "s_min", "s_max", "cv_median",
                                       "mrd_1_median", "mrd_3_median"])
