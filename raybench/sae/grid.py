"""The atlas on Ray Tune: one trial per unit of stacks (a stack = the seeds of one model x depth x E x arm).

Each trial asks for `{"cpu": c, "gpu": g}` (fractional g packs several trials on one GPU), reads the
activation store, trains its stack with periodic in-trial checkpoints, evaluates every cell and writes
`cells/<cell_id>/` atomically. Resume is layered: `Tuner.restore` continues the experiment, and a
trial never retrains a cell whose folder is already complete, so a killed driver loses at most the
steps since the last checkpoint. The product is `tables/cells.parquet`, one row per expected cell,
failed cells included with their reason.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.config import Protocol, RunConfig, from_dict, to_dict
from raybench.io import write_json, write_table
from raybench.paths import RunLayout
from raybench.sae.cells import CellSpec, ModelDims, build_cells, group_trials
from raybench.sae.data import load_cell_data

EXPERIMENT = "grid"
CELL_COLUMNS = [
    "cell_id", "model", "layer", "n_layers", "q", "realized_depth", "arm", "expansion", "n_latents", "k", "seed",
    "status", "val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass", "test_accessibility",
    "test_coverage", "train_seconds", "config_hash", "cell_dir",
]


def cell_complete(cell_dir: Path) -> bool:
    """A cell folder exists only after its atomic rename, and metrics.json is in it."""
    return (cell_dir / "metrics.json").exists()


def model_dims_from_store(run_root: str | Path, models: tuple[str, ...]) -> dict[str, ModelDims]:
    """Read (n_layers, d) of each encoded model from its activation store index."""
    from raybench.io import read_json

    layout = RunLayout.at(run_root)
    dims = {}
    for model in models:
        indexes = sorted((layout.activations_dir / model).glob("layer_*/index.json"))
        if not indexes:
            raise FileNotFoundError(
                f"no activation store for model {model!r} under {layout.activations_dir}; run `raybench encode` first")
        idx = read_json(indexes[0])
        dims[model] = ModelDims(n_layers=int(idx["n_layers"]), d=int(idx["d"]))
    return dims


# ---------------------------------------------------------------- the trial

def train_cells_trial(config: dict[str, Any]) -> None:
    """Tune function trainable: train + evaluate + save the missing cells of each stack in this trial."""
    import torch
    from ray import tune

    layout = RunLayout.at(config["run_root"])
    remote = config.get("remote_uri")
    protocol: Protocol = from_dict(Protocol, config["protocol"])
    stacks = [[CellSpec(**c) for c in stack] for stack in config["stacks"]]
    if remote:  # this node may not have the inputs (or other nodes' finished cells) yet
        from raybench.storage import sync_down

        sync_down(remote, layout.root, "manifest")
        for cell in (c for stack in stacks for c in stack):
            sync_down(remote, layout.root, f"cells/{cell.cell_id}")
    total = sum(len(s) for s in stacks)
    todo_stacks = [[c for c in s if not cell_complete(layout.cell_dir(c.cell_id))] for s in stacks]
    todo_stacks = [s for s in todo_stacks if s]
    if todo_stacks:
        _maybe_fail_once(config.get("fail_once_dir"), todo_stacks[0][0].stack_id)
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    device = "cuda" if torch.cuda.is_available() and _assigned_gpu() else "cpu"

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as ckdir:
            resume = torch.load(Path(ckdir) / "state.pt", map_location="cpu", weights_only=False)  # our own file

    trained = 0
    loaded: dict[tuple[str, int], Any] = {}
    for todo in todo_stacks:
        key = (todo[0].model, todo[0].layer)
        if key not in loaded:
            loaded.clear()  # one (model, layer) in memory at a time
            if remote:
                sync_down(remote, layout.root, RunLayout(Path(".")).activation_dir(*key).as_posix())
            loaded[key] = load_cell_data(layout.root, key[0], key[1], protocol.eval)
        ids = [c.cell_id for c in todo]
        state = resume["state"] if resume is not None and resume.get("cell_ids") == ids else None
        _train_and_save(layout, protocol, todo, loaded[key], device, state, config["config_hash"],
                        {"cells_trained": trained, "cells_total": total}, remote, config.get("hold_dir"))
        trained += len(todo)
    tune.report({"cells_trained": trained, "cells_total": total})


def _train_and_save(layout: RunLayout, protocol: Protocol, todo: list[CellSpec], data, device: str,
                    state: dict | None, config_hash: str, progress: dict[str, int],
                    remote_uri: str | None = None, hold_dir: str | None = None) -> None:
    """Train one stack (the seeds of a cell) together, then evaluate and save each SAE atomically."""
    import torch
    from ray import tune

    from raybench.sae.cellio import save_cell
    from raybench.sae.evaluate import evaluate_cell
    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack

    cfgs = [SAECellConfig.from_protocol(protocol.sae, c.d, c.n_latents, c.k, c.seed) for c in todo]
    ids = [c.cell_id for c in todo]

    def on_checkpoint(step: int, st: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            torch.save({"cell_ids": ids, "state": st}, Path(tmp) / "state.pt")
            tune.report({"step": step, **progress}, checkpoint=tune.Checkpoint.from_directory(tmp))
        _maybe_hold(hold_dir, ids)

    t0 = time.perf_counter()
    result = train_stack(data.acts["train"], cfgs, device=device, state=state, on_checkpoint=on_checkpoint,
                         checkpoint_every=protocol.sae.checkpoint_every, implementation="auto")
    seconds = (time.perf_counter() - t0) / len(todo)
    for i, cell in enumerate(todo):
        ev = evaluate_cell(result.sae, result.normalizer, data.acts, data.concepts, data.test_patient_codes,
                           data.selection_idx, protocol.eval, index=i, n_patients=len(data.test_patients))
        extra = {"cell_id": cell.cell_id, "realized_depth": cell.realized_depth, "train_seconds": seconds,
                 "config_hash": config_hash, "device": device, "concepts": list(data.concept_names),
                 "n_test_patients": len(data.test_patients), **_placement()}
        save_cell(layout.cell_dir(cell.cell_id), result.sae.single(i), {**asdict(cfgs[i]), **cell.to_dict()}, ev,
                  extra, normalizer=result.normalizer)
        if remote_uri:
            from raybench.storage import sync_up

            sync_up(layout.root, remote_uri, f"cells/{cell.cell_id}")


def _placement() -> dict[str, str]:
    """Where the cell was trained (node id + host), so elastic runs can be audited."""
    import socket

    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    return {"node_id": node, "hostname": socket.gethostname()}


def _assigned_gpu() -> bool:
    import ray

    try:
        return bool(ray.get_gpu_ids())
    except Exception:
        return False


def _maybe_fail_once(marker_dir: str | None, stack_id: str) -> None:
    """Test hook: the first attempt of a stack raises, the retry succeeds (exercises FailureConfig)."""
    if not marker_dir:
        return
    marker = Path(marker_dir) / f"{stack_id}.failed-once"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("injected failure\n")
        raise RuntimeError(f"injected failure for {stack_id} (test hook)")


def _maybe_hold(hold_dir: str | None, cell_ids: list[str]) -> None:
    """Test hook: on the node whose id is in <hold_dir>/node_id, a trial that has just persisted a checkpoint
    says so (<hold_dir>/held.json) and waits to be killed, so a node kill lands mid-trial for certain."""
    if not hold_dir or not (Path(hold_dir) / "node_id").exists():
        return
    import ray

    if (Path(hold_dir) / "node_id").read_text().strip() != ray.get_runtime_context().get_node_id():
        return
    write_json(Path(hold_dir) / "held.json", cell_ids)
    while True:
        time.sleep(1.0)


# ---------------------------------------------------------------- the grid

def run_grid(cfg: RunConfig, dims: dict[str, ModelDims] | None = None, *, fail_once_dir: str | None = None,
             only_models: tuple[str, ...] | None = None, verbose: int = 0,
             remote_uri: str | None = None, hold_dir: str | None = None) -> pd.DataFrame:
    """Train every missing cell through Ray Tune, then write and return the cells table.

    With `remote_uri` (an s3:// run folder mirrored at cfg.run_dir) trials on any node fetch their
    activation store from it and upload each finished cell, and Tune keeps its state there too.
    """

    from raybench.ray_session import init_ray

    init_ray(cfg.resources)
    layout = RunLayout.at(cfg.run_dir)
    protocol = cfg.protocol
    dims = dims or model_dims_from_store(layout.root, protocol.grid.models)
    cells = build_cells(protocol, dims)
    if only_models:
        cells = [c for c in cells if c.model in only_models]
    trials = group_trials(cells, cfg.resources.trial_unit)
    pending = {key: stacks for key, stacks in trials.items()
               if not all(cell_complete(layout.cell_dir(c.cell_id)) for s in stacks for c in s)}
    errors: dict[str, str] = {}
    if pending:
        errors = _fit(cfg, layout, pending, fail_once_dir, verbose, remote_uri, hold_dir)
    if remote_uri:
        from raybench.storage import sync_down

        sync_down(remote_uri, layout.root, "cells")
    table = collect_cells_table(cfg, cells, errors)
    write_table(layout.cells_table, table)
    return table


def _fit(cfg: RunConfig, layout: RunLayout, pending: dict[str, list[list[CellSpec]]], fail_once_dir: str | None,
         verbose: int, remote_uri: str | None = None, hold_dir: str | None = None) -> dict[str, str]:
    from ray import tune

    res = cfg.resources
    storage_fs = None  # pyarrow filesystem for s3:// (pyarrow alone ignores AWS_ENDPOINT_URL)
    if remote_uri:
        from raybench.storage import arrow_filesystem

        storage_fs, storage = arrow_filesystem(f"{remote_uri.rstrip('/')}/tune")
    else:
        storage = str(layout.tune_dir.resolve())
    exp_dir = os.path.join(storage, f"{EXPERIMENT}-{cfg.config_hash()}")
    threads = max(1, int(res.trial_cpus))
    trainable = tune.with_resources(train_cells_trial, {"cpu": res.trial_cpus, "gpu": res.trial_gpus})
    param_space = {
        "run_root": str(layout.root.resolve()),
        "remote_uri": remote_uri,
        "protocol": to_dict(cfg.protocol),
        "config_hash": cfg.config_hash(),
        "fail_once_dir": fail_once_dir,
        "hold_dir": hold_dir,
        "threads": threads,
        "stacks": tune.grid_search([[[c.to_dict() for c in stack] for stack in stacks]
                                    for stacks in pending.values()]),
    }
    if tune.Tuner.can_restore(exp_dir, storage_filesystem=storage_fs):
        tuner = tune.Tuner.restore(exp_dir, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                   param_space=param_space, storage_filesystem=storage_fs)
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=tune.TuneConfig(max_concurrent_trials=res.max_concurrent_trials or None),
            run_config=tune.RunConfig(
                name=os.path.basename(exp_dir),
                storage_path=storage,
                storage_filesystem=storage_fs,
                failure_config=tune.FailureConfig(max_failures=res.max_failures),
                checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
                verbose=verbose,
            ),
        )
    results = tuner.fit()
    errors = {}
    for r in results:
        if r.error is not None:
            reason = f"{type(r.error).__name__}: {str(r.error).strip().splitlines()[-1][:300]}"
            for stack in r.config.get("stacks", []):
                errors[CellSpec(**stack[0]).stack_id] = reason
    return errors


def collect_cells_table(cfg: RunConfig, cells: list[CellSpec], errors: dict[str, str]) -> pd.DataFrame:
    """One row per expected cell, in grid order; a missing cell is `failed: <reason>`, never dropped."""
    from raybench.sae.cellio import load_cell_metrics

    layout = RunLayout.at(cfg.run_dir)
    rows = []
    for c in cells:
        cdir = layout.cell_dir(c.cell_id)
        row: dict[str, Any] = {
            "cell_id": c.cell_id, "model": c.model, "layer": c.layer, "n_layers": c.n_layers, "q": c.q,
            "realized_depth": c.realized_depth, "arm": c.arm, "expansion": c.expansion, "n_latents": c.n_latents,
            "k": c.k, "seed": c.seed, "config_hash": cfg.config_hash(),
            "cell_dir": str(cdir.relative_to(layout.root)),
        }
        if cell_complete(cdir):
            m = load_cell_metrics(cdir)
            row.update(status="ok", train_seconds=float(m.get("train_seconds", np.nan)))
            for key in ("val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass",
                        "test_accessibility", "test_coverage"):
                row[key] = m.get(key, np.nan)
        else:
            reason = errors.get(c.stack_id, "not trained (trial did not finish)")
            row.update(status=f"failed: {reason}", train_seconds=np.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in CELL_COLUMNS:
        if col not in df:
            df[col] = np.nan
    df["gate_pass"] = df["gate_pass"].astype("boolean")
    return df[CELL_COLUMNS]
