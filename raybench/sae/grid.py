"""The SAE grid on Ray Tune: one trial per unit of stacks (a stack = the seeds of one model x depth x E x arm).

`run_grid` builds the cells from the protocol and the activation store's model dimensions, runs a Tune
trial (raybench.sae.trial) for every unit of stacks that still has a cell to train, and writes
`tables/cells.parquet` (raybench.sae.cells_table): one row per expected cell, failed cells included with
their reason. Resume is layered: `Tuner.restore` continues the newest experiment of the config
(`tune/grid-<config hash>[-<n>]`; refused without raybench's owner stamp, raybench.sae.tune_experiments), a
trial never retrains a cell that is already done (raybench.sae.provenance), and the stacks still missing
after that (cells deleted since, stacks the restored experiment never had) run as a fresh experiment
`tune/grid-<hash>-<n+1>`. So a killed driver loses at most the steps since the last checkpoint, and every
rerun trains exactly the missing cells.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import pandas as pd

from raybench.atomic import write_table
from raybench.config import ModelDims, RunConfig, to_dict
from raybench.encoders.store import ActivationStore
from raybench.paths import RunLayout
from raybench.privacy import failure_text, is_credentialed
from raybench.resources import resolve_reuse_trial_processes, run_trial_gpus
from raybench.sae.cells import CellSpec, build_cells, group_trials
from raybench.sae.cells_table import collect_cells_table
from raybench.sae.grid_progress import GridProgress, progress_callback
from raybench.sae.grid_progress import finish as finish_progress
from raybench.sae.provenance import cell_done, check_stores_match_manifest, expected_provenance
from raybench.sae.tracking import tracking_callbacks
from raybench.sae.trial import train_cells_trial
from raybench.sae.tune_experiments import check_owner_stamp, experiment_dirs, fs_join, write_owner_stamp

log = logging.getLogger(__name__)

EXPERIMENT = "grid"


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
    dims = dims or ActivationStore.for_run(layout.root).model_dims(protocol.grid.models)
    cells = build_cells(protocol, dims)
    if only_models:
        cells = [c for c in cells if c.model in only_models]
    check_stores_match_manifest(layout, cells)
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    trials = group_trials(cells, cfg.resources.trial_unit)

    def pending_trials() -> dict[str, list[list[CellSpec]]]:  # _fit asks again after a restored experiment
        return {key: stacks for key, stacks in trials.items()
                if not all(cell_done(layout, expect, c) for s in stacks for c in s)}

    errors: dict[str, str] = {}
    pending = pending_trials()
    shown = GridProgress.of(len(cells), pending, lambda c: cell_done(layout, expect, c),
                            credentialed=is_credentialed(cfg))  # the run's live display (raybench.progress)
    if pending:
        errors = _fit(cfg, layout, pending_trials, fail_once_dir, verbose, remote_uri, hold_dir, shown)
    if remote_uri:
        from raybench.storage import sync_down

        sync_down(remote_uri, layout.root, "cells")
    table = collect_cells_table(cfg, cells, errors)
    write_table(layout.cells_table, table)
    finish_progress(shown, int((table["status"] == "ok").sum()))
    return table


def _fit(cfg: RunConfig, layout: RunLayout, pending_trials: Callable[[], dict[str, list[list[CellSpec]]]],
         fail_once_dir: str | None, verbose: int, remote_uri: str | None = None,
         hold_dir: str | None = None, shown: GridProgress | None = None) -> dict[str, str]:
    """Run Tune for the pending trials; returns stack_id -> failure reason.

    The newest experiment of this config is restored first (its unfinished and errored trials resume from
    their checkpoints; refused without raybench's owner stamp). `pending_trials()` is then asked again: what
    is still missing and was not just tried by the restored trials (cells deleted since, stacks that
    experiment never had) runs as a fresh experiment `<EXPERIMENT>-<hash>-<n+1>`.
    """
    from pyarrow import fs as pafs
    from ray import tune

    res = cfg.resources
    storage_fs = None  # pyarrow filesystem for s3:// (pyarrow alone ignores AWS_ENDPOINT_URL)
    if remote_uri:
        from raybench.storage import arrow_filesystem

        storage_fs, storage = arrow_filesystem(f"{remote_uri.rstrip('/')}/tune")
    else:
        storage = str(layout.tune_dir.resolve())
    fs = storage_fs or pafs.LocalFileSystem()
    base = f"{EXPERIMENT}-{cfg.config_hash()}"
    experiments = experiment_dirs(fs, storage, base)
    threads = max(1, int(res.trial_cpus))
    gpus = run_trial_gpus(cfg, layout.root)  # trial_gpus, auto resolved against the cluster (raybench.resources)
    trainable = tune.with_resources(train_cells_trial, {"cpu": res.trial_cpus, "gpu": gpus})
    errors: dict[str, str] = {}
    if experiments and tune.Tuner.can_restore(experiments[-1].path, storage_filesystem=storage_fs):
        exp_dir = experiments[-1].path
        name = exp_dir.rsplit("/", 1)[-1]
        check_owner_stamp(fs, exp_dir, f"{remote_uri.rstrip('/')}/tune/{name}" if remote_uri else None)
        tuner = tune.Tuner.restore(exp_dir, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                   storage_filesystem=storage_fs)
        errors.update(trial_errors(tuner.fit(), is_credentialed(cfg), lost_checkpoint_ok=True))
        if remote_uri:  # cells the restored trials finished on other nodes
            from raybench.storage import sync_down

            sync_down(remote_uri, layout.root, "cells")
    pending = {key: [s for s in stacks if s[0].stack_id not in errors] for key, stacks in pending_trials().items()}
    pending = {key: stacks for key, stacks in pending.items() if stacks}
    if not pending:
        return errors
    n = experiments[-1].n + 1 if experiments else 1
    exp_dir = fs_join(storage, base if n == 1 else f"{base}-{n}")
    write_owner_stamp(fs, exp_dir, cfg.config_hash())
    param_space = {
        "run_root": str(layout.root.resolve()),
        "remote_uri": remote_uri,
        "protocol": to_dict(cfg.protocol),
        "config_hash": cfg.config_hash(),
        "fail_once_dir": fail_once_dir,
        "hold_dir": hold_dir,
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
    errors.update(trial_errors(tuner.fit(), is_credentialed(cfg)))
    return errors


# Tune's error for a restored trial whose recorded checkpoint is gone: a driver killed between Tune deleting the
# previous checkpoint (num_to_keep=1) and saving its experiment state leaves the state pointing at it
LOST_CHECKPOINT = "Could not recover from checkpoint as it does not exist on storage anymore"


def trial_errors(results, credentialed: bool, lost_checkpoint_ok: bool = False) -> dict[str, str]:
    """stack_id -> why its trial failed, as `raybench.privacy.failure_text` allows for the cohort (a credentialed
    cohort's message can list record ids: only the exception type and a count are kept). lost_checkpoint_ok: a
    restored trial that failed only because its checkpoint was gone is left out, so its unfinished cells count as
    pending and train afresh (training is seeded: the same cells)."""
    errors = {}
    for r in results:
        if r.error is not None and lost_checkpoint_ok and LOST_CHECKPOINT in str(r.error):
            log.warning("a restored trial's checkpoint is gone (driver killed mid-save); its cells train afresh")
            continue
        if r.error is not None:
            reason = failure_text(r.error, credentialed)
            for stack in r.config.get("stacks", []):
                errors[CellSpec(**stack[0]).stack_id] = reason
    return errors
