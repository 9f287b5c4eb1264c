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

from raybench.analysis.bootstrap import run_bounded
from raybench.analysis.metrics import reproducibility
from raybench.config import Protocol
from raybench.paths import RunLayout

COLUMNS = ["source", "model", "q", "expansion", "seed", "reseed", "metric", "value"]


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
