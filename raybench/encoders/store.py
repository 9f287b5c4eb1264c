"""The activation store: one folder of float32 arrays per model x layer, complete only when indexed.

Layout of `<run>/activations/<model>/layer_XX/`:
    <split>.npy            float32 [n, d], C order, plain `.npy` (np.load(..., mmap_mode="r") maps it)
    <split>_ecg_ids.npy    int64 [n], the records of each row, ascending ecg_id (manifest order)
    index.json             written last: model, layer, n_layers, d, manifest_hash, fingerprint, splits, dtype,
                           record_notes (what the reader / preprocessing changed in kept records: each note
                           -> {"n": records, "ecg_ids": the first NOTE_IDS of them, ascending})
A writer fills a hidden temp folder beside the final one (pre-allocated memory maps, so memory stays
bounded) and renames it into place only after index.json is written; a killed run leaves at most a
hidden `.layer_XX.<pid>.<token>.tmp` folder, which the next writer removes.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench import __version__
from raybench.core.atomic import atomic_path, pid_alive, write_json
from raybench.core.config import ModelDims
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout

INDEX = "index.json"
NOTE_IDS = 100  # ecg_ids listed per record note in index.json (the count is always complete)
DTYPE = np.float32
QUARANTINE_COLUMNS = ("ecg_id", "split", "path", "reason", "detail")


def array_name(split: str) -> str:
    return f"{split}.npy"


def ids_name(split: str) -> str:
    return f"{split}_ecg_ids.npy"


class StoreError(RaybenchError, RuntimeError):
    """A store is missing, incomplete or does not match what the caller expects."""


class ActivationStore:
    """Reads and writes the activation stores under one `activations/` folder."""

    def __init__(self, activations_root: str | os.PathLike):
        self.root = Path(activations_root)

    @classmethod
    def for_run(cls, run_root: str | os.PathLike) -> ActivationStore:
        return cls(RunLayout.at(run_root).activations_dir)

    def layer_dir(self, model: str, layer: int) -> Path:
        # RunLayout owns the naming; re-root its relative part onto this store's folder.
        layout = RunLayout(Path("run"))
        return self.root / layout.activation_dir(model, layer).relative_to(layout.activations_dir)

    def model_dir(self, model: str) -> Path:
        return self.root / model

    def quarantine_path(self, model: str) -> Path:
        return self.model_dir(model) / "quarantine.csv"

    # ---------------------------------------------------------------- reading

    def index(self, model: str, layer: int) -> dict[str, Any]:
        path = self.layer_dir(model, layer) / INDEX
        if not path.exists():
            raise StoreError(f"no complete activation store at {path.parent} (index.json missing); "
                             "run `raybench encode` for this model")
        return json.loads(path.read_text())

    def layers(self, model: str) -> list[int]:
        """The layers of `model` whose store is indexed (complete), ascending; [] when there is none."""
        folder = self.model_dir(model)
        if not folder.is_dir():
            return []
        found = []
        for path in folder.iterdir():  # temp folders (".layer_XX.<pid>...") never parse as a layer
            _, _, number = path.name.partition("_")
            if number.isdigit() and self.layer_dir(model, int(number)) == path and (path / INDEX).is_file():
                found.append(int(number))
        return sorted(found)

    def models(self) -> list[str]:
        """The models with at least one indexed layer store, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and self.layers(p.name))

    def model_dims(self, models: Iterable[str] | None = None) -> dict[str, ModelDims]:
        """Audited state count and width of each of `models` (default: every encoded model), from its lowest
        indexed layer; a model without any store is a StoreError that says to encode it."""
        dims = {}
        for model in self.models() if models is None else models:
            layers = self.layers(model)
            if not layers:
                raise StoreError(f"no activation store for model {model!r} under {self.root}; "
                                 "run `raybench encode` first")
            idx = self.index(model, layers[0])
            dims[model] = ModelDims(n_layers=int(idx["n_layers"]), d=int(idx["d"]))
        return dims

    def is_complete(self, model: str, layer: int, manifest_hash: str, fingerprint: str) -> bool:
        """True when the store exists, matches this manifest and encoder, and every file has its indexed size."""
        try:
            idx = self.index(model, layer)
        except (StoreError, json.JSONDecodeError):
            return False
        if (idx.get("model"), idx.get("layer"), idx.get("manifest_hash"), idx.get("fingerprint")) != (
            model, layer, manifest_hash, fingerprint
        ):
            return False
        folder = self.layer_dir(model, layer)
        d = int(idx["d"])
        for split, n in idx["splits"].items():
            if not (_npy_ok(folder / array_name(split), (n, d), DTYPE)
                    and _npy_ok(folder / ids_name(split), (n,), np.int64)):
                return False
        return True

    def load(self, model: str, layer: int, split: str, mmap: bool = True) -> np.ndarray:
        """[n, d] float32 activations of one split (memory-mapped read-only by default)."""
        return np.load(self._file(model, layer, split, array_name(split)), mmap_mode="r" if mmap else None)

    def ecg_ids(self, model: str, layer: int, split: str) -> np.ndarray:
        return np.load(self._file(model, layer, split, ids_name(split)))

    def _file(self, model: str, layer: int, split: str, name: str) -> Path:
        idx = self.index(model, layer)
        if split not in idx["splits"]:
            raise StoreError(f"split {split!r} not in store {self.layer_dir(model, layer)}; "
                             f"it holds {sorted(idx['splits'])}")
        return self.layer_dir(model, layer) / name

    # ---------------------------------------------------------------- writing

    def writer(self, model: str, layer: int, *, n_layers: int, d: int, manifest_hash: str, fingerprint: str,
               capacity: Mapping[str, int], extra: Mapping[str, Any] | None = None) -> StoreWriter:
        """A writer pre-allocated for at most `capacity[split]` rows per split."""
        index = {
            "model": model, "layer": int(layer), "n_layers": int(n_layers), "d": int(d),
            "manifest_hash": manifest_hash, "fingerprint": fingerprint, "dtype": np.dtype(DTYPE).name,
            "raybench_version": __version__, **dict(extra or {}),
        }
        return StoreWriter(self.layer_dir(model, layer), index, dict(capacity))

    def add_quarantine(self, model: str, rows: pd.DataFrame) -> Path:
        """Merge quarantined records into `<model>/quarantine.csv` (one row per ecg_id, latest reason wins)."""
        path = self.quarantine_path(model)
        rows = rows.loc[:, list(QUARANTINE_COLUMNS)]
        if path.exists():
            rows = pd.concat([pd.read_csv(path, dtype={"split": str, "path": str}), rows], ignore_index=True)
        rows = rows.drop_duplicates("ecg_id", keep="last").sort_values("ecg_id", kind="stable")
        with atomic_path(path) as tmp:
            rows.to_csv(tmp, index=False)
        return path


class StoreWriter:
    """Append rows split by split; `finalize` makes the store visible, `abort` (or an exception) drops it."""

    def __init__(self, final_dir: Path, index: dict[str, Any], capacity: dict[str, int]):
        self.final_dir = final_dir
        self._index = index
        self.d = int(index["d"])
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale(final_dir)
        self.tmp_dir = final_dir.parent / f".{final_dir.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        self.tmp_dir.mkdir()
        self.capacity = capacity
        self.count = dict.fromkeys(capacity, 0)
        self._arrays: dict[str, np.memmap] = {}
        self._ids: dict[str, np.memmap] = {}
        self._notes: dict[str, list[int]] = {}
        for split, n in capacity.items():
            self._arrays[split] = np.lib.format.open_memmap(
                self.tmp_dir / array_name(split), mode="w+", dtype=DTYPE, shape=(n, self.d))
            self._ids[split] = np.lib.format.open_memmap(
                self.tmp_dir / ids_name(split), mode="w+", dtype=np.int64, shape=(n,))

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.tmp_dir.exists():
            self.abort()

    def append(self, split: str, ecg_ids: np.ndarray, states: np.ndarray) -> None:
        if split not in self.capacity:
            raise StoreError(f"split {split!r} was not declared for {self.final_dir}")
        m = len(ecg_ids)
        if states.shape != (m, self.d):
            raise StoreError(f"{self.final_dir}: rows of shape {states.shape}, expected ({m}, {self.d})")
        start = self.count[split]
        if start + m > self.capacity[split]:
            raise StoreError(f"{self.final_dir}: more than the {self.capacity[split]} rows declared for {split!r}")
        self._arrays[split][start:start + m] = states
        self._ids[split][start:start + m] = ecg_ids
        self.count[split] = start + m

    def set_notes(self, notes: Mapping[str, list[int]]) -> None:
        """What was changed in kept records (note text -> their ecg_ids), written into index.json by `finalize`."""
        self._notes = {str(text): [int(i) for i in ids] for text, ids in notes.items()}

    def finalize(self) -> Path:
        """Trim unused rows (quarantined records), flush, write index.json last, rename into place."""
        splits = {}
        for split in self.capacity:
            n = self.count[split]
            self._arrays[split].flush()
            self._ids[split].flush()
            arr, ids = self._arrays.pop(split), self._ids.pop(split)
            if n < self.capacity[split]:
                _shrink(self.tmp_dir / array_name(split), arr, n)
                _shrink(self.tmp_dir / ids_name(split), ids, n)
            del arr, ids
            for name in (array_name(split), ids_name(split)):
                _fsync(self.tmp_dir / name)
            splits[split] = n
        notes = {text: {"n": len(ids), "ecg_ids": sorted(ids)[:NOTE_IDS]}
                 for text, ids in sorted(self._notes.items(), key=lambda kv: (-len(kv[1]), kv[0]))}
        write_json(self.tmp_dir / INDEX, {**self._index, "splits": splits, "record_notes": notes})
        old = None
        if self.final_dir.exists():
            old = self.final_dir.parent / f".{self.final_dir.name}.{os.getpid()}.{secrets.token_hex(4)}.old"
            os.replace(self.final_dir, old)
        os.replace(self.tmp_dir, self.final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.final_dir

    def abort(self) -> None:
        self._arrays.clear()
        self._ids.clear()
        shutil.rmtree(self.tmp_dir, ignore_errors=True)


def store_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).iterdir() if p.is_file())


# ---------------------------------------------------------------- helpers

def _shrink(path: Path, arr: np.ndarray, n: int) -> None:
    """Rewrite a pre-allocated .npy with only its first n rows (chunked: never loads the whole array)."""
    tmp = path.with_name(path.name + ".part")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=arr.dtype, shape=(n, *arr.shape[1:]))
    step = max(1, (64 << 20) // max(1, arr[:1].nbytes))
    for i in range(0, n, step):
        out[i:i + step] = arr[i:min(n, i + step)]
    out.flush()
    del out
    os.replace(tmp, path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _npy_ok(path: Path, shape: tuple[int, ...], dtype: Any) -> bool:
    """Header says `shape`/`dtype` and the file is exactly as long as that data (no truncation)."""
    try:
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            got_shape, fortran, got_dtype = read(f)
            offset = f.tell()
    except (OSError, ValueError):
        return False
    expected = offset + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    return (tuple(got_shape) == tuple(shape) and not fortran and got_dtype == np.dtype(dtype)
            and path.stat().st_size == expected)


def _remove_stale(final_dir: Path) -> None:
    """Drop temp folders of this store left by writers whose process is gone (killed runs)."""
    for p in final_dir.parent.glob(f".{final_dir.name}.*"):
        parts = p.name.split(".")
        if len(parts) >= 5 and parts[-1] in ("tmp", "old") and parts[-3].isdigit() and not pid_alive(int(parts[-3])):
            shutil.rmtree(p, ignore_errors=True)
