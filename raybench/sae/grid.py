"""The SAE grid on Ray Tune: one trial per unit of stacks (a stack = the seeds of one model x depth x E x arm).

`run_grid` builds the cells from the protocol and the activation store's model dimensions, runs a Tune
trial (raybench.sae.trial) for every unit of stacks that still has a cell to train, and writes
`tables/cells.parquet` (raybench.sae.cells_table): one row per expected cell, failed cells included with
their reason. Resume never unpickles Tune state (it travels with the run folder, so it could be planted:
raybench.sae.tune_experiments): the stacks with a missing cell run as a fresh experiment
`tune/grid-<config hash>[-<n+1>]`, a trial never retrains a cell that is already done
(raybench.sae.freshness), and a stack resumes from the newest pickle-free in-trial checkpoint an earlier
experiment of the config left for it. So a killed driver loses at most the steps since the last checkpoint,
and every rerun trains exactly the missing cells.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.core.atomic import write_table
from raybench.core.config import ModelDims, RunConfig, to_dict
from raybench.core.paths import RunLayout
from raybench.core.privacy import failure_text, is_credentialed
from raybench.encoders.store import ActivationStore, StoreError
from raybench.infra.resources import resolve_reuse_trial_processes, resolve_trial_gpus
from raybench.sae.cells import CellSpec, build_cells, group_trials
from raybench.sae.cells_table import collect_cells_table
from raybench.sae.freshness import cell_done, check_stores_match_manifest, expected_provenance
from raybench.sae.grid_progress import GridProgress, progress_callback
from raybench.sae.grid_progress import finish as finish_progress
from raybench.sae.tracking import tracking_callbacks
from raybench.sae.trial import train_cells_trial
from raybench.sae.tune_experiments import RESUME_KEY, earlier_checkpoints, experiment_dirs, fs_join

log = logging.getLogger(__name__)

EXPERIMENT = "grid"


def run_grid(cfg: RunConfig, dims: dict[str, ModelDims] | None = None, *, fail_once_dir: str | None = None,
             only_models: tuple[str, ...] | None = None, verbose: int = 0,
             remote_uri: str | None = None, hold_dir: str | None = None) -> pd.DataFrame:
    """Train every missing cell through Ray Tune, then write and return the cells table.

    With `remote_uri` (an s3:// run folder mirrored at cfg.run_dir) trials on any node fetch their
    activation store from it and upload each finished cell, and Tune keeps its state there too.
    Two drivers on one run folder would replace each other's cells: the run's lock refuses the second
    (raybench.infra.run_lock; `raybench grid` already holds it).
    """
    from raybench.infra.run_lock import run_lock

    with run_lock(remote_uri or cfg.run_dir, "train"):
        return _run_grid(cfg, dims, fail_once_dir=fail_once_dir, only_models=only_models, verbose=verbose,
                         remote_uri=remote_uri, hold_dir=hold_dir)


def _run_grid(cfg: RunConfig, dims: dict[str, ModelDims] | None, *, fail_once_dir: str | None,
              only_models: tuple[str, ...] | None, verbose: int, remote_uri: str | None,
              hold_dir: str | None) -> pd.DataFrame:
    """run_grid under the run's lock."""
    from raybench.infra.ray_session import init_ray

    init_ray(cfg.resources)
    layout = RunLayout.at(cfg.run_dir)
    protocol = cfg.protocol
    dims = dims or ActivationStore.for_run(layout.root).model_dims(protocol.grid.models)
    cells = build_cells(protocol, dims)
    if only_models:
        cells = [c for c in cells if c.model in only_models]
    check_stores_match_manifest(layout, cells)
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    trials = group_trials(cells, cfg.resources.trial_unit)

    errors: dict[str, str] = {}
    pending = {key: stacks for key, stacks in trials.items()
               if not all(cell_done(layout, expect, c) for s in stacks for c in s)}
    shown = GridProgress.of(len(cells), pending, lambda c: cell_done(layout, expect, c),
                            credentialed=is_credentialed(cfg))  # the run's live display (raybench.infra.progress)
    if pending:
        errors = _fit(cfg, layout, pending, fail_once_dir, verbose, remote_uri, hold_dir, shown)
    if remote_uri:
        from raybench.infra.storage import sync_down

        sync_down(remote_uri, layout.root, "cells")
    table = collect_cells_table(cfg, cells, errors)
    write_table(layout.cells_table, table)
    finish_progress(shown, int((table["status"] == "ok").sum()))
    return table


def _fit(cfg: RunConfig, layout: RunLayout, pending: dict[str, list[list[CellSpec]]],
         fail_once_dir: str | None, verbose: int, remote_uri: str | None = None,
         hold_dir: str | None = None, shown: GridProgress | None = None) -> dict[str, str]:
    """Run the pending trials as a fresh Tune experiment `<EXPERIMENT>-<hash>[-<n+1>]`; returns stack_id -> failure
    reason. No experiment is restored (that would unpickle whatever the run folder holds): a stack resumes from the
    newest pickle-free checkpoint the config's earlier experiments hold for it (raybench.sae.tune_experiments).
    """
    from pyarrow import fs as pafs
    from ray import tune

    from raybench.infra.s3_lease import lease_token

    res = cfg.resources
    storage_fs = None  # pyarrow filesystem for s3:// (pyarrow alone ignores AWS_ENDPOINT_URL)
    if remote_uri:
        from raybench.infra.storage import arrow_filesystem

        storage_fs, storage = arrow_filesystem(f"{remote_uri.rstrip('/')}/tune")
    else:
        storage = str(layout.tune_dir.resolve())
    fs = storage_fs or pafs.LocalFileSystem()
    base = f"{EXPERIMENT}-{cfg.config_hash()}"
    experiments = experiment_dirs(fs, storage, base)
    threads = max(1, int(res.trial_cpus))
    gpus = run_trial_gpus(cfg, layout.root)  # trial_gpus, auto resolved against the cluster (raybench.infra.resources)
    trainable = tune.with_resources(train_cells_trial, {"cpu": res.trial_cpus, "gpu": gpus})
    wanted = {c.cell_id for stacks in pending.values() for s in stacks for c in s}
    resume_from = {key: path for key, path in earlier_checkpoints(fs, experiments).items()
                   if set(key.split("\n")) <= wanted}
    n = experiments[-1].n + 1 if experiments else 1
    exp_dir = fs_join(storage, base if n == 1 else f"{base}-{n}")
    param_space = {
        "run_root": str(layout.root.resolve()),
        "remote_uri": remote_uri,
        "lease_token": lease_token(remote_uri) if remote_uri else None,  # trials re-check it before uploads
        "protocol": to_dict(cfg.protocol),
        "config_hash": cfg.config_hash(),
        "fail_once_dir": fail_once_dir,
        "hold_dir": hold_dir,
        RESUME_KEY: resume_from,
        "threads": threads,
        "log_every": cfg.tracking.log_every if cfg.tracking.enabled else 0,  # raybench.sae.tracking
        "stacks": tune.grid_search([[[c.to_dict() for c in stack] for stack in stacks]
                                    for stacks in pending.values()]),
    }
    tuner = tune.Tuner(
        trainable,
        param_space=param_space,
        # reuse_actors only where no node can join (resources.reuse_trial_processes): a reused trial process
        # keeps its node, so on a cluster a worker added mid-run would get fewer trials (test_grid_elastic.py)
        tune_config=tune.TuneConfig(max_concurrent_trials=res.max_concurrent_trials or None,
                                    reuse_actors=resolve_reuse_trial_processes(res.reuse_trial_processes)),
        run_config=tune.RunConfig(
            name=os.path.basename(exp_dir),
            storage_path=storage,
            storage_filesystem=storage_fs,
            failure_config=tune.FailureConfig(max_failures=res.max_failures),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
            callbacks=[*tracking_callbacks(cfg), *([progress_callback(shown)] if shown is not None else [])],
            verbose=verbose,
        ),
    )
    return trial_errors(tuner.fit(), is_credentialed(cfg))


def trial_errors(results, credentialed: bool) -> dict[str, str]:
    """stack_id -> why its trial failed, as `raybench.core.privacy.failure_text` allows for the cohort (a credentialed
    cohort's message can list record ids: only the exception type and a count are kept)."""
    errors = {}
    for r in results:
        if r.error is not None:
            reason = failure_text(r.error, credentialed)
            for stack in r.config.get("stacks", []):
                errors[CellSpec(**stack[0]).stack_id] = reason
    return errors


def run_trial_gpus(cfg: RunConfig, run_root: str | Path) -> float:
    """resolve_trial_gpus for the grid of `cfg` on the run's activation stores (their widths and train rows);
    without stores the need is unknown (0) and auto packs resources.max_per_gpu trials per GPU."""
    store = ActivationStore.for_run(run_root)
    cells: list[Any] = []
    n_train: dict[int, int] = {}
    try:
        dims = store.model_dims(cfg.protocol.grid.models)
        cells = build_cells(cfg.protocol, dims)
        for model, dim in dims.items():
            rows = int(store.index(model, store.layers(model)[0]).get("splits", {}).get("train", 0))
            n_train[dim.d] = max(n_train.get(dim.d, 0), rows)
    except (StoreError, KeyError, OSError, ValueError):
        pass
    return resolve_trial_gpus(cfg.resources.trial_gpus, cells, cfg.protocol.sae.batch_size, run_root, cfg.resources,
                              n_train)
