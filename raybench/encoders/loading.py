"""Extraction inputs: the manifest records extraction reads, and per-record loading (read one record, apply the
model's native preprocessing) as the Ray Data task UDF `load_batch`.

Bad signals at this boundary never crash the run and are never changed silently: the reader's and the
model's refusals (`RecordError`, the preprocessing's `SignalError`), a preprocessing that raises on one record
(`preprocess_failed`) or returns another shape (`bad_input_shape`) become flagged rows carrying their reason;
what the reader or the preprocessing changed in a record it kept (leads reordered, units scaled, a rate
resampled, a short record padded) travels with the row as its notes. Loading workers build a weightless copy
of the encoder on the meta device only for `preprocess`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from raybench.cohorts.waveforms import RecordError, Waveform, read_record
from raybench.core.errors import RaybenchError
from raybench.encoders.base import ECGEncoder, EncoderSpec, build_encoder
from raybench.encoders.preprocess import SignalError, collect_notes

Builder = Callable[[EncoderSpec], ECGEncoder]
MANIFEST_COLUMNS = ("ecg_id", "path", "fs", "n_samples", "split")
# and the record's full length, for a record longer than the window (a `wfdb` cohort's; n_samples elsewhere)
READ_COLUMNS = (*MANIFEST_COLUMNS, "record_samples")


class ExtractionError(RaybenchError, RuntimeError):
    """The pipeline cannot produce a consistent store (bad manifest, adapter contract broken)."""


# ---------------------------------------------------------------- manifest

@dataclass(frozen=True)
class ManifestRecords:
    """What extraction needs from a manifest: the ordered records, the data root and the content hash."""

    df: pd.DataFrame  # columns READ_COLUMNS, ascending unique ecg_id
    root: str
    manifest_hash: str
    path: str


def read_manifest_records(manifest_path: str | os.PathLike) -> ManifestRecords:
    """Load the manifest (its stored hash verified against the content: the hash keys every store) and keep
    the columns extraction uses."""
    from raybench.cohorts.manifest import ManifestError, load_manifest

    try:
        df, info = load_manifest(manifest_path, verify=True)
    except ManifestError as err:
        raise ExtractionError(str(err)) from err
    missing = [c for c in MANIFEST_COLUMNS if c not in df.columns]
    if missing:
        raise ExtractionError(f"manifest {manifest_path} lacks columns {missing}; rebuild it with `raybench manifest`")
    if "record_samples" not in df.columns:  # every record is exactly the window (ptbxl, mimic, synth)
        df["record_samples"] = df["n_samples"]
    df = df.loc[:, list(READ_COLUMNS)].copy()
    df["ecg_id"] = df["ecg_id"].astype(np.int64)
    df["split"] = df["split"].astype(str)
    df["path"] = df["path"].astype(str)
    ids = df["ecg_id"].to_numpy()
    if len(ids) > 1 and not np.all(np.diff(ids) > 0):
        raise ExtractionError(f"manifest {manifest_path}: ecg_id must be unique and ascending (manifest order); "
                              "rebuild it with `raybench manifest`")
    return ManifestRecords(df=df.reset_index(drop=True), root=str(info.root), manifest_hash=info.manifest_hash,
                           path=str(manifest_path))


def split_sizes(df: pd.DataFrame) -> dict[str, int]:
    return {str(k): int(v) for k, v in df["split"].value_counts(sort=False).sort_index().items()}


# ---------------------------------------------------------------- per-record loading (runs in Ray tasks)

_PREPROCESSORS: dict[tuple[EncoderSpec, str], ECGEncoder] = {}


def _preprocessor(spec: EncoderSpec, builder: Builder | None, real: bool = False) -> ECGEncoder:
    """The encoder whose `preprocess` a loading worker uses, built once per worker process.

    Preprocessing is the upstream signal pipeline and does not read weights, so the module is built on
    the meta device (no memory, no init time, no checkpoint read); an adapter whose preprocess does touch
    its tensors is rebuilt for real on first failure (`real=True`).
    """
    key = (spec, "real" if real else "meta")
    if key not in _PREPROCESSORS:
        build = builder or build_encoder
        if real:
            _PREPROCESSORS[key] = build(spec)
        else:
            try:
                with torch.device("meta"):
                    _PREPROCESSORS[key] = build(dataclasses.replace(spec, checkpoint=None))
            except Exception:
                _PREPROCESSORS[key] = _preprocessor(spec, builder, real=True)
    return _PREPROCESSORS[key]


def read_input(root: str, row: dict[str, Any]) -> Waveform:
    """The manifest row's record, checked against the manifest's rate and length (RecordError when bad)."""
    full = row.get("record_samples")
    return read_record(root, row["path"], expect_fs=float(row["fs"]), expect_samples=int(row["n_samples"]),
                       record_samples=None if full is None else int(full))


def apply_preprocess(wave: Waveform, preprocess: Callable[[np.ndarray, float], np.ndarray], name: str,
                     x_shape: tuple[int, ...] | None = None, wrap_errors: bool = True
                     ) -> tuple[np.ndarray, list[str]]:
    """One read record -> (native input, notes: the reader's then the preprocessing's). RecordError for a record
    the model cannot take: its `SignalError` reason, `nonfinite_input`, `bad_input_shape` (when `x_shape` is
    given), or, with `wrap_errors`, `preprocess_failed` for anything else the preprocessing raised."""
    with collect_notes() as notes:
        try:
            x = np.asarray(preprocess(wave.signal, wave.fs), dtype=np.float32)
        except SignalError as err:
            raise RecordError(wave.record, err.reason, f"{name}: {err.detail}") from err
        except Exception as err:
            if not wrap_errors:
                raise
            raise RecordError(wave.record, "preprocess_failed", f"{name} preprocessing failed on this record "
                              f"({type(err).__name__}: {err})") from err
    if x_shape is not None and x.shape != tuple(x_shape):
        raise RecordError(wave.record, "bad_input_shape", f"{name} preprocessing returned shape {list(x.shape)} "
                          f"for this record ({wave.signal.shape[1]} samples at {wave.fs:g} Hz), the model takes "
                          f"{list(x_shape)}")
    if not np.all(np.isfinite(x)):
        raise RecordError(wave.record, "nonfinite_input",
                          f"{name} preprocessing produced non-finite values; check the record's leads")
    return x, [*wave.notes, *notes]


def native_input(root: str, row: dict[str, Any], preprocess: Callable[[np.ndarray, float], np.ndarray],
                 name: str, notes: list[str] | None = None, x_shape: tuple[int, ...] | None = None) -> np.ndarray:
    """Read one record and apply a model's native preprocessing. Raises RecordError for bad records (see
    `apply_preprocess`); what was changed in a kept record is appended to `notes` when given."""
    x, got = apply_preprocess(read_input(root, row), preprocess, name, x_shape)
    if notes is not None:
        notes.extend(got)
    return x


def _worker_native(root: str, row: dict[str, Any], spec: EncoderSpec, builder: Builder | None,
                   x_shape: tuple[int, ...] | None = None, preprocessor: ECGEncoder | None = None
                   ) -> tuple[np.ndarray, list[str]]:
    wave = read_input(root, row)
    if preprocessor is not None:  # the real encoder: what the fallback below rebuilds, without a build
        return apply_preprocess(wave, preprocessor.preprocess, spec.name, x_shape)
    try:
        return apply_preprocess(wave, _preprocessor(spec, builder).preprocess, spec.name, x_shape, wrap_errors=False)
    except RecordError:
        raise
    except Exception:  # preprocess needs real tensors: rebuild this worker's copy for real
        return apply_preprocess(wave, _preprocessor(spec, builder, real=True).preprocess, spec.name, x_shape)


def load_batch(batch: dict[str, np.ndarray], *, root: str, spec: EncoderSpec, builder: Builder | None,
               x_shape: tuple[int, ...], preprocessor: ECGEncoder | None = None) -> dict[str, np.ndarray]:
    """Ray Data UDF: a batch of manifest rows -> native inputs; bad records flagged (zeros), never raised.

    `preprocessor`: a built encoder of `spec` whose preprocess to use, where the caller holds one (an encoder
    actor that loads its own records); else this worker's meta-device copy (`_preprocessor`). Building that
    copy costs more than it saves where the real one is at hand: a meta build goes through torch's Python
    reference kernels, whose first use imports torch._dynamo (~1.3 CPU-s per process)."""
    n = len(batch["ecg_id"])
    x = np.zeros((n, *x_shape), dtype=np.float32)
    ok = np.ones(n, dtype=bool)
    reason = np.full(n, "", dtype=object)
    detail = np.full(n, "", dtype=object)
    notes = np.full(n, "[]", dtype=object)  # JSON lists: what was changed in each kept record
    for i in range(n):
        row = {k: batch[k][i] for k in ("path", "fs", "n_samples", "record_samples") if k in batch}
        try:
            x[i], got = _worker_native(root, row, spec, builder, x_shape, preprocessor)
        except RecordError as err:
            ok[i], reason[i], detail[i] = False, err.reason, err.detail
            continue
        notes[i] = json.dumps(got)
    return {"ecg_id": batch["ecg_id"].astype(np.int64), "split": batch["split"].astype(object),
            "path": batch["path"].astype(object), "ok": ok, "reason": reason, "detail": detail, "notes": notes,
            "x": x}
