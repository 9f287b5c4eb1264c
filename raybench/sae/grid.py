"""The atlas on Ray Tune: one trial per unit of stacks (a stack = the seeds of one model x depth x E x arm).

Each trial asks for `{"cpu": c, "gpu": g}` (fractional g packs several trials on one GPU), reads the
activation store, trains its stack with periodic in-trial checkpoints, evaluates every cell and writes
`cells/<cell_id>/` atomically. Resume is layered: `Tuner.restore` continues the newest experiment of
the config (`tune/grid-<config hash>[-<n>]`), a trial never retrains a cell whose folder is already
complete, and the stacks still missing after that (cells deleted since, stacks the restored experiment
never had) run as a fresh experiment `tune/grid-<hash>-<n+1>`. So a killed driver loses at most the
steps since the last checkpoint, and every rerun trains exactly the missing cells. The product is
`tables/cells.parquet`, one row per expected cell, failed cells included with their reason.

Trust: in-trial checkpoints hold no pickle (`state.safetensors` tensors + `state.json`), but
`Tuner.restore` unpickles Tune's own experiment state, which can run arbitrary code. raybench writes an
owner stamp (`raybench_owner.json`) into each experiment folder it creates and refuses to restore a
folder without one. Never restore (or copy into a run's `tune/`) Tune state from an untrusted source:
delete such a folder instead; finished cells are kept and only unfinished stacks restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.config import Protocol, RunConfig, from_dict, to_dict
from raybench.errors import RaybenchError
from raybench.io import write_json, write_table
from raybench.paths import RunLayout
from raybench.privacy import failure_text, is_credentialed
from raybench.sae.cells import CellSpec, ModelDims, build_cells, group_trials
from raybench.sae.data import load_cell_data

EXPERIMENT = "grid"
OWNER_STAMP = "raybench_owner.json"  # written by raybench into every Tune experiment folder it creates
STATE_TENSORS, STATE_JSON = "state.safetensors", "state.json"  # an in-trial checkpoint (no pickle)
STATE_FORMAT = 1
CELL_COLUMNS = [
    "cell_id", "model", "layer", "n_layers", "q", "realized_depth", "arm", "expansion", "n_latents", "k", "seed",
    "status", "val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass", "test_accessibility",
    "test_coverage", "train_seconds", "config_hash", "cell_dir",
]


def cell_complete(cell_dir: Path, expect: dict[str, str] | None = None) -> bool:
    """A cell folder exists only after its atomic rename, and metrics.json is in it.

    With `expect` (see `expected_provenance`) the cell must also record exactly those values: a cell trained
    under another config hash, or on activations of another manifest or encoder, is not complete (retrained).
    """
    path = cell_dir / "metrics.json"
    if not path.exists():
        return False
    if expect is None:
        return True
    try:
        recorded = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return all(recorded.get(key) == value for key, value in expect.items())


def activation_provenance(run_root: str | Path, model: str, layer: int) -> dict[str, str] | None:
    """Manifest hash and encoder fingerprint of the (model, layer) activation store; None when there is none."""
    from raybench.encoders.store import ActivationStore, StoreError

    try:
        idx = ActivationStore.for_run(run_root).index(model, layer)
    except (StoreError, ValueError):
        return None
    return {"manifest_hash": str(idx.get("manifest_hash")), "encoder_fingerprint": str(idx.get("fingerprint"))}


def expected_provenance(run_root: str | Path, config_hash: str,
                        cells: list[CellSpec]) -> dict[str, dict[str, str] | None]:
    """cell_id -> what its metrics.json must record to count as complete: the run's config hash and the
    manifest hash + encoder fingerprint of the activation store it trains on (None: no store, never complete)."""
    stores: dict[tuple[str, int], dict[str, str] | None] = {}
    out: dict[str, dict[str, str] | None] = {}
    for c in cells:
        key = (c.model, c.layer)
        if key not in stores:
            stores[key] = activation_provenance(run_root, *key)
        out[c.cell_id] = None if stores[key] is None else {"config_hash": config_hash, **stores[key]}
    return out


def _done(layout: RunLayout, expect: dict[str, dict[str, str] | None], cell: CellSpec) -> bool:
    want = expect.get(cell.cell_id)
    return want is not None and cell_complete(layout.cell_dir(cell.cell_id), want)


def _check_stores_match_manifest(layout: RunLayout, cells: list[CellSpec]) -> None:
    """Refuse to train on activation stores encoded from another manifest than the run's current one."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.encoders.store import StoreError

    if not layout.manifest.exists():
        return  # a remote run's trials fetch it; nothing to compare here
    current = load_manifest(layout.manifest)[1].manifest_hash
    stale = sorted({f"{c.model}/layer_{c.layer:02d}" for c in cells
                    if (p := activation_provenance(layout.root, c.model, c.layer)) is not None
                    and p["manifest_hash"] != current})
    if stale:
        raise StoreError(f"activation stores {stale} under {layout.activations_dir} were encoded from another manifest "
                         f"than {layout.manifest} (hash {current}); run `raybench encode --run-dir {layout.root}` "
                         "first")


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
        for key in dict.fromkeys((c.model, c.layer) for stack in stacks for c in stack):  # what cells must match
            sync_down(remote, layout.root, (RunLayout(Path(".")).activation_dir(*key) / "index.json").as_posix())
    total = sum(len(s) for s in stacks)
    expect = expected_provenance(layout.root, config["config_hash"], [c for s in stacks for c in s])
    todo_stacks = [[c for c in s if not _done(layout, expect, c)] for s in stacks]
    todo_stacks = [s for s in todo_stacks if s]
    if todo_stacks:
        _maybe_fail_once(config.get("fail_once_dir"), todo_stacks[0][0].stack_id)
    torch.set_num_threads(max(1, int(config.get("threads", 1))))
    device = "cuda" if torch.cuda.is_available() and _assigned_gpu() else "cpu"

    resume = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as ckdir:
            resume = load_trial_state(ckdir)  # tensors + JSON: nothing is unpickled

    trained = 0
    loaded: dict[tuple[str, int], Any] = {}
    for todo in todo_stacks:
        key = (todo[0].model, todo[0].layer)
        if key not in loaded:
            loaded.clear()  # one (model, layer) in memory at a time
            if remote:
                sync_down(remote, layout.root, RunLayout(Path(".")).activation_dir(*key).as_posix())
            loaded[key] = load_cell_data(layout.root, key[0], key[1], protocol.eval)
            store_provenance = activation_provenance(layout.root, *key) or {}  # the activations trained on
        ids = [c.cell_id for c in todo]
        state = resume["state"] if resume is not None and resume.get("cell_ids") == ids else None
        _train_and_save(layout, protocol, todo, loaded[key], device, state, config["config_hash"],
                        {"cells_trained": trained, "cells_total": total}, remote, config.get("hold_dir"),
                        provenance=store_provenance)
        trained += len(todo)
    tune.report({"cells_trained": trained, "cells_total": total})


def _train_and_save(layout: RunLayout, protocol: Protocol, todo: list[CellSpec], data, device: str,
                    state: dict | None, config_hash: str, progress: dict[str, int],
                    remote_uri: str | None = None, hold_dir: str | None = None, *,
                    provenance: dict[str, str] | None = None) -> None:
    """Train one stack (the seeds of a cell) together, then evaluate and save each SAE atomically.

    Each cell's metrics.json records `config_hash` and `provenance` (manifest hash + encoder fingerprint of the
    activations it was trained on): `cell_complete` compares them with the run's current ones.
    """
    from ray import tune

    from raybench.sae.cellio import save_cell
    from raybench.sae.evaluate import evaluate_cell
    from raybench.sae.model import SAECellConfig
    from raybench.sae.train import train_stack

    cfgs = [SAECellConfig.from_protocol(protocol.sae, c.d, c.n_latents, c.k, c.seed) for c in todo]
    ids = [c.cell_id for c in todo]

    def on_checkpoint(step: int, st: dict) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            save_trial_state(tmp, {"cell_ids": ids, "state": st})
            tune.report({"step": step, **progress}, checkpoint=tune.Checkpoint.from_directory(tmp))
        _maybe_hold(hold_dir, ids)

    t0 = time.perf_counter()
    result = train_stack(data.acts["train"], cfgs, device=device, state=state, on_checkpoint=on_checkpoint,
                         checkpoint_every=protocol.sae.checkpoint_every, implementation="auto")
    seconds = (time.perf_counter() - t0) / len(todo)
    for i, cell in enumerate(todo):
        ev = evaluate_cell(result.sae, result.normalizer, data.acts, data.concepts, data.test_patient_codes,
                           data.selection_idx, protocol.eval, index=i, n_patients=len(data.test_patients),
                           selection_present=getattr(data, "selection_present", None))
        extra = {"cell_id": cell.cell_id, "realized_depth": cell.realized_depth, "train_seconds": seconds,
                 "config_hash": config_hash, "device": device, "concepts": list(data.concept_names),
                 "n_test_patients": len(data.test_patients), **(provenance or {}), **_placement(),
                 "missing_concepts": getattr(data, "missing_concepts", "fill_zero"),
                 "n_eval_records": {s: int(len(data.acts[s])) for s in ("val", "test")}}
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


# ---------------------------------------------------------------- trial checkpoints and owner stamps

def save_trial_state(folder: str | os.PathLike, payload: dict) -> None:
    """Write an in-trial checkpoint without pickle: every tensor and numpy array of `payload` (weights, Adam
    moments, dead counters, batch permutations, losses) goes into state.safetensors; the rest (step, seeds,
    cell ids, RNG states as plain ints, Adam hyperparameters) into state.json, which names the tensors. Dict
    keys keep their type (Adam's state is keyed by int) and tuples stay tuples, so the load is exact."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}

    def enc(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor | np.ndarray):
            key = f"t{len(tensors)}"
            is_np = isinstance(obj, np.ndarray)
            tensors[key] = torch.from_numpy(np.ascontiguousarray(obj)) if is_np else obj.detach().cpu().contiguous()
            return {"ndarray" if is_np else "tensor": key}
        if isinstance(obj, dict):
            if not all(isinstance(k, str | int) for k in obj):
                raise TypeError(f"trial state: dict keys must be str or int, got {list(obj)}")
            return {"dict": [[k, enc(v)] for k, v in obj.items()]}
        if isinstance(obj, tuple):
            return {"tuple": [enc(v) for v in obj]}
        if isinstance(obj, list):
            return [enc(v) for v in obj]
        if obj is None or isinstance(obj, bool | int | float | str):
            return obj
        raise TypeError(f"trial state: cannot store {type(obj).__name__} without pickle")

    meta = {"format": STATE_FORMAT, "state": enc(payload)}
    folder = Path(folder)
    save_file(tensors, str(folder / STATE_TENSORS))
    (folder / STATE_JSON).write_text(json.dumps(meta) + "\n")


def load_trial_state(folder: str | os.PathLike) -> dict | None:
    """Read what `save_trial_state` wrote (safetensors + JSON, nothing unpickled); None when the folder holds
    no such checkpoint (e.g. one from an older raybench: that stack then restarts from step 0)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / STATE_JSON).is_file() or not (folder / STATE_TENSORS).is_file():
        return None
    meta = json.loads((folder / STATE_JSON).read_text())
    if meta.get("format") != STATE_FORMAT:
        return None
    tensors = load_file(str(folder / STATE_TENSORS), device="cpu")

    def dec(obj: Any) -> Any:
        if isinstance(obj, list):
            return [dec(v) for v in obj]
        if isinstance(obj, dict):
            ((kind, val),) = obj.items()
            if kind == "tensor":
                return tensors[val]
            if kind == "ndarray":
                return tensors[val].numpy()
            if kind == "dict":
                return {k: dec(v) for k, v in val}
            if kind == "tuple":
                return tuple(dec(v) for v in val)
            raise ValueError(f"{folder / STATE_JSON}: unknown entry {kind!r}")
        return obj

    return dec(meta["state"])


class UntrustedTuneState(RaybenchError, RuntimeError):
    """A Tune experiment folder that raybench did not create (no owner stamp): restoring it would unpickle it."""


def _fs_join(base: str, name: str) -> str:
    return f"{base.rstrip('/')}/{name}"


def _experiment_dirs(fs, storage: str, base: str) -> list[tuple[int, str]]:
    """(n, path) of the experiment folders `<base>` (n = 1) and `<base>-<n>` under `storage`, oldest first."""
    from pyarrow import fs as pafs

    pattern = re.compile(rf"{re.escape(base)}(?:-(\d+))?")
    found = []
    for info in fs.get_file_info(pafs.FileSelector(storage, allow_not_found=True)):
        m = pattern.fullmatch(info.base_name)
        if info.type == pafs.FileType.Directory and m:
            found.append((int(m.group(1) or 1), _fs_join(storage, info.base_name)))
    return sorted(found)


def _write_owner_stamp(fs, exp_dir: str, config_hash: str) -> None:
    """Mark `exp_dir` as created by raybench, before Tune writes anything into it."""
    import datetime

    stamp = {"owner": "raybench", "experiment": exp_dir.rstrip("/").rsplit("/", 1)[-1], "config_hash": config_hash,
             "token": secrets.token_hex(16), "host": socket.gethostname(),
             "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")}
    fs.create_dir(exp_dir, recursive=True)
    with fs.open_output_stream(_fs_join(exp_dir, OWNER_STAMP)) as out:
        out.write((json.dumps(stamp, indent=2, sort_keys=True) + "\n").encode())


def _check_owner_stamp(fs, exp_dir: str, shown: str | None = None) -> None:
    """Refuse to restore (= unpickle) a Tune experiment folder that raybench's owner stamp does not mark as its own.

    `shown`: how to name the folder to the user (e.g. its s3:// URI)."""
    from pyarrow import fs as pafs

    path = _fs_join(exp_dir, OWNER_STAMP)
    stamp = None
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_stream(path) as f, contextlib.suppress(ValueError):
            stamp = json.loads(f.read().decode())
    name = exp_dir.rstrip("/").rsplit("/", 1)[-1]
    if not isinstance(stamp, dict) or stamp.get("owner") != "raybench" or stamp.get("experiment") != name:
        raise UntrustedTuneState(
            f"refusing to restore the Ray Tune experiment in {shown or exp_dir}: it has no valid raybench owner stamp "
            f"({OWNER_STAMP}), so raybench did not create it (or an older raybench did). Restoring Tune state "
            "unpickles it, which can run arbitrary code, so Tune state from an untrusted source must never be "
            f"restored. Delete {shown or exp_dir} to start its trials fresh (finished cells are kept).")


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
    _check_stores_match_manifest(layout, cells)
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    trials = group_trials(cells, cfg.resources.trial_unit)

    def pending_trials() -> dict[str, list[list[CellSpec]]]:  # _fit asks again after a restored experiment
        return {key: stacks for key, stacks in trials.items()
                if not all(_done(layout, expect, c) for s in stacks for c in s)}

    errors: dict[str, str] = {}
    if pending_trials():
        errors = _fit(cfg, layout, pending_trials, fail_once_dir, verbose, remote_uri, hold_dir)
    if remote_uri:
        from raybench.storage import sync_down

        sync_down(remote_uri, layout.root, "cells")
    table = collect_cells_table(cfg, cells, errors)
    write_table(layout.cells_table, table)
    return table


def _fit(cfg: RunConfig, layout: RunLayout, pending_trials: Callable[[], dict[str, list[list[CellSpec]]]],
         fail_once_dir: str | None, verbose: int, remote_uri: str | None = None,
         hold_dir: str | None = None) -> dict[str, str]:
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
    experiments = _experiment_dirs(fs, storage, base)
    threads = max(1, int(res.trial_cpus))
    trainable = tune.with_resources(train_cells_trial, {"cpu": res.trial_cpus, "gpu": res.trial_gpus})
    errors: dict[str, str] = {}
    if experiments and tune.Tuner.can_restore(experiments[-1][1], storage_filesystem=storage_fs):
        exp_dir = experiments[-1][1]
        name = exp_dir.rsplit("/", 1)[-1]
        _check_owner_stamp(fs, exp_dir, f"{remote_uri.rstrip('/')}/tune/{name}" if remote_uri else None)
        tuner = tune.Tuner.restore(exp_dir, trainable=trainable, resume_unfinished=True, resume_errored=True,
                                   storage_filesystem=storage_fs)
        errors.update(trial_errors(tuner.fit(), is_credentialed(cfg)))
        if remote_uri:  # cells the restored trials finished on other nodes
            from raybench.storage import sync_down

            sync_down(remote_uri, layout.root, "cells")
    pending = {key: [s for s in stacks if s[0].stack_id not in errors] for key, stacks in pending_trials().items()}
    pending = {key: stacks for key, stacks in pending.items() if stacks}
    if not pending:
        return errors
    n = experiments[-1][0] + 1 if experiments else 1
    exp_dir = _fs_join(storage, base if n == 1 else f"{base}-{n}")
    _write_owner_stamp(fs, exp_dir, cfg.config_hash())
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
    errors.update(trial_errors(tuner.fit(), is_credentialed(cfg)))
    return errors


def trial_errors(results, credentialed: bool) -> dict[str, str]:
    """stack_id -> why its trial failed, as `raybench.privacy.failure_text` allows for the cohort (a credentialed
    cohort's message can list record ids: only the exception type and a count are kept)."""
    errors = {}
    for r in results:
        if r.error is not None:
            reason = failure_text(r.error, credentialed)
            for stack in r.config.get("stacks", []):
                errors[CellSpec(**stack[0]).stack_id] = reason
    return errors


def collect_cells_table(cfg: RunConfig, cells: list[CellSpec], errors: dict[str, str]) -> pd.DataFrame:
    """One row per expected cell, in grid order; a missing cell is `failed: <reason>`, never dropped.

    A cell is `ok` only when complete for this config and the current activation stores (`cell_complete`).
    """
    from raybench.sae.cellio import load_cell_metrics

    layout = RunLayout.at(cfg.run_dir)
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    rows = []
    for c in cells:
        cdir = layout.cell_dir(c.cell_id)
        row: dict[str, Any] = {
            "cell_id": c.cell_id, "model": c.model, "layer": c.layer, "n_layers": c.n_layers, "q": c.q,
            "realized_depth": c.realized_depth, "arm": c.arm, "expansion": c.expansion, "n_latents": c.n_latents,
            "k": c.k, "seed": c.seed, "config_hash": cfg.config_hash(),
            "cell_dir": str(cdir.relative_to(layout.root)),
        }
        if _done(layout, expect, c):
            m = load_cell_metrics(cdir)
            row.update(status="ok", train_seconds=float(m.get("train_seconds", np.nan)))
            for key in ("val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass",
                        "test_accessibility", "test_coverage"):
                row[key] = m.get(key, np.nan)
        else:
            reason = errors.get(c.stack_id, "not trained (trial did not finish)")
            if c.stack_id in errors and is_credentialed(cfg):  # however `errors` was made: no record ids
                reason = failure_text(reason, True)
            row.update(status=f"failed: {reason}", train_seconds=np.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in CELL_COLUMNS:
        if col not in df:
            df[col] = np.nan
    df["gate_pass"] = df["gate_pass"].astype("boolean")
    return df[CELL_COLUMNS]
