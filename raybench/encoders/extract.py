"""Activation extraction: manifest -> Ray Data (load + native preprocessing on CPU tasks -> frozen encoder in an
actor pool) -> activation store, streamed in manifest order so memory is bounded by a few batches.

The driver builds the encoder once (its fingerprint decides which stores are already complete) and
puts it in the object store; each actor fetches it instead of building again. Loading workers build a
weightless copy on the meta device only for `preprocess`. With num_gpus=0 each actor loads and encodes
its batches itself (one Ray Data step, 1 CPU per actor); with a GPU share the loading runs in
separate CPU tasks feeding the GPU actors. Bad records travel as flagged rows (zeros, never encoded)
so the driver can quarantine them with their reason while writing the others in manifest order.

Bad signals at this boundary never crash the run and are never changed silently: the reader's and the
model's refusals (`RecordError`, the preprocessing's `SignalError`), a preprocessing that raises on one record
(`preprocess_failed`) or returns another shape (`bad_input_shape`) quarantine that record with its reason;
what the reader or the preprocessing changed in a record it kept (leads reordered, units scaled, a rate
resampled, a short record padded) travels as the record's notes into every layer store's index.json
(`record_notes`: note -> count and the first ecg_ids) and the summary.

`extract_models` runs several small encoders on CPU through one pipeline (MultiEncoderActor: each record read
once, every model's preprocessing and encoder applied to it) and writes the same per-model stores; starting a
pipeline and an actor pool per model costs more than encoding demo-size encoders (raybench.encoders.stage
picks it for the demo size).
The batches stream into the stores through `raybench.encoders.sink`; `raybench.encoders.reference` is the
single-process reference the Ray path must reproduce.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.core.config import EncoderConfig, ResourceConfig, layer_for_depth
from raybench.encoders.actor import EncoderActor, MultiEncoderActor, actor_cpus, encode_states
from raybench.encoders.base import ECGEncoder, EncoderSpec, build_encoder, worker_builder
from raybench.encoders.fingerprint_key import fingerprint_key
from raybench.encoders.loading import (
    MANIFEST_COLUMNS,
    READ_COLUMNS,
    Builder,
    ExtractionError,
    ManifestRecords,
    load_batch,
    native_input,
    read_manifest_records,
    split_sizes,
)
from raybench.encoders.preprocess import SignalError
from raybench.encoders.roster import run_pipeline
from raybench.encoders.sink import Sink, check_counts, consume, say
from raybench.encoders.store import ActivationStore
from raybench.infra.resources import with_encoder_gpus

__all__ = ["MANIFEST_COLUMNS", "Builder", "EncoderActor", "ExtractionError", "ManifestRecords", "actor_cpus",
           "encode_states", "extract_activations", "extract_models", "load_batch", "native_input",
           "read_manifest_records", "split_sizes"]


def checkpoint_sha256(path: str | None) -> str | None:
    """sha256 of a checkpoint file (of a folder: over its files' relative paths and hashes), recorded in every
    store's index.json so the report and model cards name the exact weights; None without a checkpoint."""
    import hashlib

    from raybench.core.atomic import file_sha256

    if not path or "://" in path:
        return None
    p = Path(path).expanduser()
    if p.is_file():
        return file_sha256(p)
    if not p.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        h.update(f"{f.relative_to(p).as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


# ---------------------------------------------------------------- driver

def extract_activations(manifest_path: str | os.PathLike, run_root: str | os.PathLike, spec: EncoderSpec,
                        enc_cfg: EncoderConfig, layers: Sequence[int] | None = None, progress: bool = True, *,
                        depths: Sequence[float] | None = None, builder: Builder | None = None,
                        cpu_threads: int | None = None, resources: ResourceConfig | None = None,
                        credentialed: bool = False) -> dict[str, Any]:
    """Extract the pooled states of `layers` (or of the layers at relative `depths`; default all) into the store.

    Layers whose store is already complete for this manifest and encoder fingerprint are skipped; if all
    are, no Ray work runs. `builder` replaces `build_encoder` (tests, unregistered models); it is shipped
    to Ray workers, so it must be picklable. `cpu_threads`: torch threads of an actor that ended up on CPU
    (default: this node's cores shared by the actor pool). `resources` sizes an `auto` encoders.num_gpus
    (raybench.infra.resources). `credentialed`: the cohort's record identifiers must stay put, so a failure's text is
    withheld (raybench.core.privacy). Returns a summary dict.
    """
    import ray

    from raybench.infra.ray_session import init_ray, quiet_ray_logs

    manifest = read_manifest_records(manifest_path)
    store = ActivationStore.for_run(run_root)
    builder = builder or worker_builder(spec.name)  # run-time registrations travel to the workers
    encoder, todo, summary = _plan(manifest, store, spec, builder, layers, depths, progress)
    if not todo:
        return summary
    fingerprint, n_layers, d = summary["fingerprint"], summary["n_layers"], summary["d"]
    x_shape = _probe_shape(encoder, manifest.df)
    init_ray()
    import ray.data  # noqa: F401  (configures its own logger on first import)

    quiet_ray_logs()
    try:
        shared = [ray.put(encoder)]
    except Exception:  # an adapter that cannot be pickled is built in each actor instead
        shared = None
    enc_cfg = with_encoder_gpus(enc_cfg, encoder, x_shape, run_root, resources)  # auto -> a GPU share or 0
    del encoder

    capacity = split_sizes(manifest.df)
    n_total = len(manifest.df)
    t0 = time.perf_counter()
    extra = {"size": spec.size, "profile": spec.profile, "checkpoint": spec.checkpoint, "input_shape": list(x_shape),
             "checkpoint_sha256": checkpoint_sha256(spec.checkpoint),
             "fingerprint_key": fingerprint_key(spec) if builder is None else None}
    writers = {layer: store.writer(spec.name, layer, n_layers=n_layers, d=d, manifest_hash=manifest.manifest_hash,
                                   fingerprint=fingerprint, capacity=capacity, extra=extra) for layer in todo}
    sink = Sink(spec.name, writers, todo, n_total)

    def body(roster) -> tuple[pd.DataFrame, list[str]]:
        ds = _pipeline(manifest, spec, enc_cfg, todo, x_shape, builder, cpu_threads, shared, roster)
        [quarantine] = consume(ds, [sink], t0, progress)
        del ds
        check_counts(spec.name, writers[todo[0]], capacity, quarantine)
        if len(quarantine):
            store.add_quarantine(spec.name, quarantine)
        return quarantine, [str(writers[layer].finalize()) for layer in todo]

    quarantine, dirs = run_pipeline(body, [spec.name], writers.values(), enc_cfg, progress, credentialed)
    devices, notes = sink.devices, sink.notes
    return _finished(summary, n_total, len(todo), quarantine, devices, notes, dirs, time.perf_counter() - t0,
                     progress)


def extract_models(manifest_path: str | os.PathLike, run_root: str | os.PathLike, specs: Sequence[EncoderSpec],
                   enc_cfg: EncoderConfig, progress: bool = True, *, depths: Sequence[float] | None = None,
                   cpu_threads: int | None = None, resources: ResourceConfig | None = None,
                   credentialed: bool = False) -> list[dict[str, Any]]:
    """`extract_activations` for several small encoders at once on CPU: one Ray Data pipeline whose actors hold
    every encoder still to write (MultiEncoderActor) and read each record once, instead of one pipeline, actor
    pool and record pass per model. Same stores (values, indices, quarantine) as the per-model path; when
    encoders.num_gpus resolves to a GPU share it falls back to that path. Returns one summary per spec."""
    import ray

    from raybench.infra.ray_session import init_ray, quiet_ray_logs

    manifest = read_manifest_records(manifest_path)
    store = ActivationStore.for_run(run_root)
    summaries, jobs = [], []
    for spec in specs:
        builder = worker_builder(spec.name)
        encoder, todo, summary = _plan(manifest, store, spec, builder, None, depths, progress)
        summaries.append(summary)
        if todo:
            jobs.append((spec, builder, encoder, todo, summary, _probe_shape(encoder, manifest.df)))
    if not jobs:
        return summaries
    init_ray()
    import ray.data  # noqa: F401  (configures its own logger on first import)

    quiet_ray_logs()
    if any(with_encoder_gpus(enc_cfg, job[2], job[5], run_root, resources).num_gpus for job in jobs):
        return [extract_activations(manifest_path, run_root, spec, enc_cfg, progress=progress, depths=depths,
                                    cpu_threads=cpu_threads, resources=resources, credentialed=credentialed)
                for spec in specs]
    shared = [_put(job[2]) for job in jobs]  # None: an adapter that cannot be pickled is built in each actor
    capacity = split_sizes(manifest.df)
    n_total = len(manifest.df)
    writers = [{layer: store.writer(spec.name, layer, n_layers=summary["n_layers"], d=summary["d"],
                                    manifest_hash=manifest.manifest_hash, fingerprint=summary["fingerprint"],
                                    capacity=capacity,
                                    extra={"size": spec.size, "profile": spec.profile, "checkpoint": spec.checkpoint,
                                           "input_shape": list(x_shape),
                                           "checkpoint_sha256": checkpoint_sha256(spec.checkpoint),
                                           "fingerprint_key": fingerprint_key(spec) if builder is None else None})
                for layer in todo} for spec, builder, _, todo, summary, x_shape in jobs]
    sinks = [Sink(job[0].name, w, job[3], n_total, f"{i}:") for i, (job, w) in enumerate(zip(jobs, writers,
                                                                                               strict=True))]
    jobs = [(spec, builder, todo, x_shape) for spec, builder, _, todo, _, x_shape in jobs]  # drop the encoders
    t0 = time.perf_counter()

    def body(roster) -> tuple[list[pd.DataFrame], list[list[str]]]:
        ds = _multi_pipeline(manifest, enc_cfg, jobs, cpu_threads, shared, roster)
        quarantines = consume(ds, sinks, t0, progress)
        del ds
        for sink, quarantine in zip(sinks, quarantines, strict=True):
            check_counts(sink.name, sink.writers[sink.todo[0]], capacity, quarantine)
        dirs = []
        for sink, quarantine in zip(sinks, quarantines, strict=True):
            if len(quarantine):
                store.add_quarantine(sink.name, quarantine)
            dirs.append([str(sink.writers[layer].finalize()) for layer in sink.todo])
        return quarantines, dirs

    quarantines, dirs = run_pipeline(body, [s.name for s in sinks],
                                      [w for sink in sinks for w in sink.writers.values()], enc_cfg, progress,
                                      credentialed)
    seconds = time.perf_counter() - t0
    for sink, quarantine, job_dirs in zip(sinks, quarantines, dirs, strict=True):
        summary = next(s for s in summaries if s["model"] == sink.name)
        _finished(summary, n_total, len(sink.todo), quarantine, sink.devices, sink.notes, job_dirs, seconds, progress)
    return summaries


def _put(encoder: ECGEncoder):
    import ray

    try:
        return ray.put(encoder)
    except Exception:
        return None


def _plan(manifest: ManifestRecords, store: ActivationStore, spec: EncoderSpec, builder: Builder | None,
          layers: Sequence[int] | None, depths: Sequence[float] | None,
          progress: bool) -> tuple[ECGEncoder, list[int], dict[str, Any]]:
    """Build `spec`'s encoder (its fingerprint decides which stores are complete): (encoder, layers to write,
    the summary so far)."""
    encoder = (builder or build_encoder)(spec)
    fingerprint = encoder.fingerprint()
    n_layers, d = int(encoder.n_layers), int(encoder.d)
    wanted = _resolve_layers(n_layers, layers, depths, spec.name)
    todo = [layer for layer in wanted if not store.is_complete(spec.name, layer, manifest.manifest_hash, fingerprint)]
    summary: dict[str, Any] = {
        "model": spec.name, "layers": todo, "skipped_layers": [la for la in wanted if la not in todo],
        "fingerprint": fingerprint, "manifest_hash": manifest.manifest_hash, "n_layers": n_layers, "d": d,
        "records": 0, "quarantined": 0, "seconds": 0.0, "records_per_s": 0.0, "devices": [],
    }
    if not todo:
        if progress:
            say(f"[encode] {spec.name}: all {len(wanted)} layer stores complete, skipped")
    elif manifest.df.empty:
        raise ExtractionError(f"manifest {manifest.path} has no records; check the cohort and its quarantine.csv")
    return encoder, todo, summary


def _finished(summary: dict[str, Any], n_total: int, n_layers_done: int, quarantine: pd.DataFrame,
              devices: set[str], notes: dict[str, list[int]], dirs: list[str], seconds: float,
              progress: bool) -> dict[str, Any]:
    """`summary` completed with what one model's extraction wrote (and its closing lines with `progress`)."""
    name = summary["model"]
    n_ok = n_total - len(quarantine)
    summary.update(records=n_ok, quarantined=len(quarantine), seconds=seconds, records_per_s=n_total / seconds,
                   devices=sorted(devices), store_dirs=dirs,
                   quarantine_reasons=quarantine["reason"].value_counts().to_dict() if len(quarantine) else {},
                   record_notes={text: len(ids) for text, ids in notes.items()})
    if progress:
        say(f"[encode] {name}: {n_ok} records ({len(quarantine)} quarantined) x {n_layers_done} layers in "
             f"{seconds:.1f}s, {n_total / seconds:.1f} rec/s on {', '.join(sorted(devices))}")
        for text, ids in sorted(notes.items(), key=lambda kv: -len(kv[1])):
            say(f"[encode] {name}: note on {len(ids)} records: {text}")
    return summary


def _blocks(df: pd.DataFrame, batch_size: int) -> list[pd.DataFrame]:
    """One block per batch so loading runs in parallel tasks (list form: override_num_blocks trips on pandas 3)."""
    step = math.ceil(len(df) / max(1, math.ceil(len(df) / batch_size)))
    return [df.iloc[i:i + step] for i in range(0, len(df), step)]


def _records(manifest: ManifestRecords, batch_size: int):
    """The manifest's READ_COLUMNS as a Ray dataset of one pandas block per batch. `from_blocks` keeps the blocks
    as they are and takes their metadata here; `from_pandas` ran a remote task per block for it (a worker that
    imports Ray Data and pandas in every new driver, and a task per batch before the stream began)."""
    import ray

    return ray.data.from_blocks(_blocks(manifest.df.loc[:, list(READ_COLUMNS)], batch_size))


def _multi_pipeline(manifest: ManifestRecords, enc_cfg: EncoderConfig, jobs: list[tuple], cpu_threads: int | None,
                    shared: list | None, roster):
    import ray

    if cpu_threads is None:
        cpu_threads = max(1, (os.cpu_count() or 1) // enc_cfg.max_actors)
    ds = _records(manifest, enc_cfg.batch_size)
    specs, builders, layers, x_shapes = (list(col) for col in zip(*jobs, strict=True))
    with warnings.catch_warnings():  # max_restarts has no named parameter in the pinned Ray Data yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return ds.map_batches(
            MultiEncoderActor,
            fn_constructor_kwargs={"specs": specs, "layers": layers, "builders": builders, "x_shapes": x_shapes,
                                   "root": manifest.root, "cpu_threads": cpu_threads, "shared": shared,
                                   "roster": roster},
            compute=ray.data.ActorPoolStrategy(min_size=enc_cfg.min_actors, max_size=enc_cfg.max_actors),
            max_restarts=0,  # as in _actor_stage
            num_cpus=1.0, batch_size=enc_cfg.batch_size, batch_format="numpy",
        )


def _pipeline(manifest: ManifestRecords, spec: EncoderSpec, enc_cfg: EncoderConfig, layers: list[int],
              x_shape: tuple[int, ...], builder: Builder | None, cpu_threads: int | None, shared: list | None,
              roster):
    if cpu_threads is None:
        cpu_threads = max(1, (os.cpu_count() or 1) // enc_cfg.max_actors)
    ds = _records(manifest, enc_cfg.batch_size)
    load = {"root": manifest.root, "spec": spec, "builder": builder, "x_shape": x_shape}
    on_gpu = bool(enc_cfg.num_gpus)
    if on_gpu:  # loading in 1-CPU tasks feeding the GPU actors
        ds = ds.map_batches(load_batch, batch_size=enc_cfg.batch_size, batch_format="numpy", num_cpus=1,
                            fn_kwargs=load)
    with warnings.catch_warnings():  # max_restarts has no named parameter in the pinned Ray Data yet
        warnings.filterwarnings("ignore", message=".*ray_remote_args.*deprecated")
        return _actor_stage(ds, spec, enc_cfg, layers, builder, cpu_threads, shared, None if on_gpu else load, roster)


def _actor_stage(ds, spec: EncoderSpec, enc_cfg: EncoderConfig, layers: list[int], builder: Builder | None,
                 cpu_threads: int, shared: list | None, load: dict | None, roster):
    import ray

    return ds.map_batches(
        EncoderActor,
        fn_constructor_kwargs={"spec": spec, "layers": layers, "builder": builder, "cpu_threads": cpu_threads,
                               "shared": shared, "load": load, "roster": roster},
        compute=ray.data.ActorPoolStrategy(min_size=enc_cfg.min_actors, max_size=enc_cfg.max_actors),
        # Ray Data hands its actors their constructor arguments as object refs, and Ray refuses (loudly) to
        # promise a restart with those; a crashed encoder actor fails the extraction instead, which names the
        # model and is finished by a rerun (complete layer stores are kept).
        max_restarts=0,
        num_gpus=enc_cfg.num_gpus or None,
        num_cpus=actor_cpus(enc_cfg.num_gpus, enc_cfg.max_actors, ray.cluster_resources().get("CPU", 1.0)),
        batch_size=enc_cfg.batch_size, batch_format="numpy",
    )


def _resolve_layers(n_layers: int, layers: Sequence[int] | None, depths: Sequence[float] | None,
                    name: str) -> list[int]:
    if layers is not None and depths is not None:
        raise ValueError("pass layers or depths, not both")
    if depths is not None:
        layers = [layer_for_depth(q, n_layers) for q in depths]
    out = sorted(set(range(n_layers) if layers is None else (int(la) for la in layers)))
    bad = [la for la in out if not 0 <= la < n_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range for {name} ({n_layers} audited states: 0..{n_layers - 1})")
    return out


def _probe_shape(encoder: ECGEncoder, rows: pd.DataFrame | pd.Series) -> tuple[int, ...]:
    """The fixed native input shape, from a synthetic record at the manifest's rate and length (the most common
    (fs, n_samples) first; a pair the model refuses, e.g. too short for its filter, gives way to the next)."""
    if isinstance(rows, pd.Series):
        rows = rows.to_frame().T
    pairs = rows.groupby(["fs", "n_samples"], sort=False).size().sort_values(ascending=False, kind="stable")
    errors = []
    for fs, n in pairs.index:
        fs, n = float(fs), int(n)
        t = np.arange(n) / fs
        rng = np.random.default_rng(0)
        signal = (0.5 * np.sin(2 * np.pi * 1.2 * t)[None] + 0.05 * rng.standard_normal((12, n))).astype(np.float32)
        try:
            return tuple(np.asarray(encoder.preprocess(signal, fs)).shape)
        except SignalError as err:
            errors.append(f"{n} samples at {fs:g} Hz: {err.detail}")
    raise ExtractionError(f"{encoder.name}: no record rate/length in the manifest is one the model takes: "
                          + "; ".join(errors[:4]))
