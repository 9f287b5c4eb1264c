"""Activation extraction: manifest -> Ray Data (load + native preprocessing on CPU tasks -> frozen encoder in an
actor pool) -> activation store, streamed in manifest order so memory is bounded by a few batches.

The driver builds the encoder once (its fingerprint decides which stores are already complete) and
puts it in the object store; each actor fetches it instead of building again. Loading workers build a
weightless copy on the meta device only for `preprocess`. With num_gpus=0, Ray fuses the loading step
into the actor (same resources), so each actor loads and encodes; with a GPU share the loading runs in
separate CPU tasks feeding the GPU actors. Bad records travel as flagged rows (zeros, never encoded)
so the driver can quarantine them with their reason while writing the others in manifest order.

Bad signals at this boundary never crash the run and are never changed silently: the reader's and the
model's refusals (`RecordError`, the preprocessing's `SignalError`), a preprocessing that raises on one record
(`preprocess_failed`) or returns another shape (`bad_input_shape`) quarantine that record with its reason;
what the reader or the preprocessing changed in a record it kept (leads reordered, units scaled, a rate
resampled, a short record padded) travels as the record's notes into every layer store's index.json
(`record_notes`: note -> count and the first ecg_ids) and the summary.

`plain_loop_activations` is the single-process reference the Ray path must reproduce.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from raybench.cohorts.waveforms import RecordError
from raybench.config import EncoderConfig, layer_for_depth
from raybench.encoders.actor import EncoderActor, actor_cpus, encode_states
from raybench.encoders.base import ECGEncoder, EncoderSpec, build_encoder, worker_builder
from raybench.encoders.loading import (
    MANIFEST_COLUMNS,
    Builder,
    ExtractionError,
    ManifestRecords,
    load_batch,
    native_input,
    read_manifest_records,
    split_sizes,
)
from raybench.encoders.preprocess import SignalError
from raybench.encoders.store import QUARANTINE_COLUMNS, ActivationStore

__all__ = ["MANIFEST_COLUMNS", "Builder", "EncoderActor", "ExtractionError", "ManifestRecords", "actor_cpus",
           "encode_states", "extract_activations", "load_batch", "native_input", "plain_loop_activations",
           "read_manifest_records", "split_sizes"]


# ---------------------------------------------------------------- driver

def extract_activations(manifest_path: str | os.PathLike, run_root: str | os.PathLike, spec: EncoderSpec,
                        enc_cfg: EncoderConfig, layers: Sequence[int] | None = None, progress: bool = True, *,
                        depths: Sequence[float] | None = None, builder: Builder | None = None,
                        cpu_threads: int | None = None) -> dict[str, Any]:
    """Extract the pooled states of `layers` (or of the layers at relative `depths`; default all) into the store.

    Layers whose store is already complete for this manifest and encoder fingerprint are skipped; if all
    are, no Ray work runs. `builder` replaces `build_encoder` (tests, unregistered models); it is shipped
    to Ray workers, so it must be picklable. `cpu_threads`: torch threads of an actor that ended up on CPU
    (default: this node's cores shared by the actor pool). Returns a summary dict.
    """
    import ray

    from raybench.ray_session import init_ray

    manifest = read_manifest_records(manifest_path)
    store = ActivationStore.for_run(run_root)
    builder = builder or worker_builder(spec.name)  # run-time registrations travel to the workers
    build = builder or build_encoder
    encoder = build(spec)
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
            _say(f"[encode] {spec.name}: all {len(wanted)} layer stores complete, skipped")
        return summary
    if manifest.df.empty:
        raise ExtractionError(f"manifest {manifest.path} has no records; check the cohort and its quarantine.csv")
    x_shape = _probe_shape(encoder, manifest.df)
    init_ray()
    try:
        shared = [ray.put(encoder)]
    except Exception:  # an adapter that cannot be pickled is built in each actor instead
        shared = None
    del encoder

    capacity = split_sizes(manifest.df)
    n_total = len(manifest.df)
    t0 = time.perf_counter()
    ctx = ray.data.DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars)
    extra = {"size": spec.size, "profile": spec.profile, "checkpoint": spec.checkpoint, "input_shape": list(x_shape)}
    writers = {layer: store.writer(spec.name, layer, n_layers=n_layers, d=d, manifest_hash=manifest.manifest_hash,
                                   fingerprint=fingerprint, capacity=capacity, extra=extra) for layer in todo}
    baseline = _free_resources()
    failure: str | None = None
    try:
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = progress
        ds = _pipeline(manifest, spec, enc_cfg, todo, x_shape, builder, cpu_threads, shared)
        quarantine, devices, notes = _consume(ds, writers, todo, spec.name, n_total, t0, progress)
        del ds
        _check_counts(spec.name, writers[todo[0]], capacity, quarantine)
        if len(quarantine):
            store.add_quarantine(spec.name, quarantine)
        dirs = [str(writers[layer].finalize()) for layer in todo]
    except Exception as err:  # re-raised below, once the failed pipeline's actors are released
        failure = str(err) if isinstance(err, ExtractionError) else _describe(err)
        del err
    finally:
        for w in writers.values():
            w.abort()
        ctx.execution_options.preserve_order, ctx.enable_progress_bars = saved
    if failure is not None:
        # The Ray exception's traceback keeps the failed pipeline (and its actors, which hold CPUs and GPU
        # shares) alive until a garbage collection happens to run; a rerun on a full node would then wait
        # forever for its loading tasks. Drop those references now and wait until the resources are back.
        _release_failed_pipeline(baseline)
        raise ExtractionError(f"{spec.name}: extraction failed; no partial store was kept, rerun to finish "
                              f"the remaining layers. Cause: {failure}")
    seconds = time.perf_counter() - t0
    n_ok = n_total - len(quarantine)
    summary.update(records=n_ok, quarantined=len(quarantine), seconds=seconds, records_per_s=n_total / seconds,
                   devices=sorted(devices), store_dirs=dirs,
                   quarantine_reasons=quarantine["reason"].value_counts().to_dict() if len(quarantine) else {},
                   record_notes={text: len(ids) for text, ids in notes.items()})
    if progress:
        _say(f"[encode] {spec.name}: {n_ok} records ({len(quarantine)} quarantined) x {len(todo)} layers in "
             f"{seconds:.1f}s, {n_total / seconds:.1f} rec/s on {', '.join(sorted(devices))}")
        for text, ids in sorted(notes.items(), key=lambda kv: -len(kv[1])):
            _say(f"[encode] {spec.name}: note on {len(ids)} records: {text}")
    return summary


def _consume(ds, writers: dict, todo: list[int], name: str, n_total: int, t0: float,
             progress: bool) -> tuple[pd.DataFrame, set[str], dict[str, list[int]]]:
    """Stream the pipeline's batches into the layer writers in manifest order; returns (quarantine, devices,
    notes: note text -> ecg_ids of the kept records it applies to). The writers get the notes too."""
    bad: list[pd.DataFrame] = []
    notes: dict[str, list[int]] = {}
    seen = 0
    last_id = -(2**63)
    devices: set[str] = set()
    last_report = t0
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=1):
        ids = batch["ecg_id"]
        if len(ids) and (ids[0] <= last_id or np.any(np.diff(ids) <= 0)):
            raise ExtractionError("Ray Data returned records out of manifest order; preserve_order was not honored")
        if len(ids):
            last_id = int(ids[-1])
        ok, split, states = batch["ok"], batch["split"].astype(str), batch["states"]
        for s in np.unique(split[ok]):
            mask = ok & (split == s)
            for j, layer in enumerate(todo):
                writers[layer].append(s, ids[mask], states[mask, j])
        for i in np.flatnonzero(ok):
            for text in json.loads(batch["notes"][i]):
                notes.setdefault(text, []).append(int(ids[i]))
        if not ok.all():
            bad.append(pd.DataFrame({k: batch[k][~ok] for k in QUARANTINE_COLUMNS}))
        devices.update(str(v) for v in np.unique(batch["device"]))
        seen += len(ids)
        now = time.perf_counter()
        if progress and now - last_report > 30:
            _say(f"[encode] {name}: {seen}/{n_total} records, {seen / (now - t0):.1f} rec/s")
            last_report = now
    quarantine = pd.concat(bad, ignore_index=True) if bad else pd.DataFrame(columns=list(QUARANTINE_COLUMNS))
    for writer in writers.values():
        writer.set_notes(notes)
    return quarantine, devices, notes


def _check_counts(name: str, first_writer, capacity: dict[str, int], quarantine: pd.DataFrame) -> None:
    n_bad = quarantine["split"].astype(str).value_counts().to_dict()
    for s, n in capacity.items():
        if first_writer.count[s] + n_bad.get(s, 0) != n:
            raise ExtractionError(f"{name}: split {s!r} got {first_writer.count[s]} rows + {n_bad.get(s, 0)} "
                                  f"quarantined of {n} manifest records; the stream ended early")


def _describe(err: BaseException) -> str:
    """What the user's code raised inside a Ray worker (the first `Type: message` line of the remote traceback
    that is not a Ray wrapper) first, then the full text."""
    text = f"{type(err).__name__}: {err}"
    for line in str(err).splitlines():
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt): ", line) and not line.startswith("ray."):
            return f"{line.strip()}\n{text}"
    return text


def _free_resources() -> dict[str, float]:
    import ray

    return {k: float(v) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}


def _release_failed_pipeline(baseline: dict[str, float], timeout_s: float = 30.0) -> None:
    """Collect the failed pipeline (its actors die with their last handle) and wait, bounded, until the CPU and
    GPU shares it held are free again, so that an immediate rerun can schedule its loading tasks."""
    import gc

    deadline = time.monotonic() + timeout_s
    while True:
        gc.collect()
        free = _free_resources()
        if all(free.get(k, 0.0) >= v - 1e-9 for k, v in baseline.items()) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def _pipeline(manifest: ManifestRecords, spec: EncoderSpec, enc_cfg: EncoderConfig, layers: list[int],
              x_shape: tuple[int, ...], builder: Builder | None, cpu_threads: int | None, shared: list | None):
    import ray

    df = manifest.df.loc[:, list(MANIFEST_COLUMNS)]
    n_blocks = max(1, math.ceil(len(df) / enc_cfg.batch_size))
    if cpu_threads is None:
        cpu_threads = max(1, (os.cpu_count() or 1) // enc_cfg.max_actors)
    # one block per batch so loading runs in parallel tasks (list form: override_num_blocks trips on pandas 3)
    step = math.ceil(len(df) / n_blocks)
    ds = ray.data.from_pandas([df.iloc[i:i + step] for i in range(0, len(df), step)])
    ds = ds.map_batches(load_batch, batch_size=enc_cfg.batch_size, batch_format="numpy", num_cpus=1,
                        fn_kwargs={"root": manifest.root, "spec": spec, "builder": builder, "x_shape": x_shape})
    return ds.map_batches(
        EncoderActor,
        fn_constructor_kwargs={"spec": spec, "layers": layers, "builder": builder, "cpu_threads": cpu_threads,
                               "shared": shared},
        compute=ray.data.ActorPoolStrategy(min_size=enc_cfg.min_actors, max_size=enc_cfg.max_actors),
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


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- reference

def plain_loop_activations(manifest_path: str | os.PathLike, spec: EncoderSpec, layers: Sequence[int] | None = None,
                           batch_size: int = 32, builder: Builder | None = None
                           ) -> dict[int, dict[str, np.ndarray]]:
    """Single-process reference: the same records (bad ones skipped), layers and order, no Ray."""
    manifest = read_manifest_records(manifest_path)
    encoder = (builder or build_encoder)(spec)
    wanted = _resolve_layers(encoder.n_layers, layers, None, spec.name)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in split_sizes(manifest.df)}
    xs: list[np.ndarray] = []
    splits: list[str] = []

    def flush() -> None:
        if xs:
            states = encode_states(encoder, np.stack(xs), wanted)
            for s in set(splits):
                parts[s].append(states[np.asarray(splits) == s])
            xs.clear()
            splits.clear()

    x_shape = _probe_shape(encoder, manifest.df) if len(manifest.df) else None
    for row in manifest.df.to_dict("records"):
        try:
            xs.append(native_input(manifest.root, row, encoder.preprocess, spec.name, x_shape=x_shape))
        except RecordError:
            continue
        splits.append(row["split"])
        if len(xs) == batch_size:
            flush()
    flush()
    out: dict[int, dict[str, np.ndarray]] = {}
    for j, layer in enumerate(wanted):
        out[layer] = {s: (np.concatenate([p[:, j] for p in ps]) if ps else np.zeros((0, encoder.d), np.float32))
                      for s, ps in parts.items()}
    return out
