"""Atomic writes: a killed run never leaves a half file that looks complete."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual mode
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


@contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp folder beside `path`; it replaces `path` only if the block succeeds.

    Whatever `path` held is deleted: callers decide whether that is safe (e.g. only their own output).
    The working directory and its ancestors are refused outright (`path` "." or ".." would be rmtree'd).
    """
    path = Path(os.path.abspath(path))  # "." has no name and no real parent: normalize before using either
    cwd = Path.cwd()
    if path == cwd or path in cwd.parents:
        raise ValueError(f"refusing to replace {path}: it is the current directory or contains it; "
                         "write to a new folder instead")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Stable JSON (sorted keys, fixed indent) so reruns leave byte-identical files."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n")


def read_json(path: str | os.PathLike) -> Any:
    return json.loads(Path(path).read_text())


def write_table(path: str | os.PathLike, df: pd.DataFrame, csv: bool = True) -> None:
    """Write `<path>.parquet` (and a `.csv` copy) atomically; `path` may carry either suffix or none."""
    base = Path(path)
    if base.suffix in (".parquet", ".csv"):
        base = base.with_suffix("")
    with atomic_path(base.with_suffix(".parquet")) as tmp:
        df.to_parquet(tmp, index=False)
    if csv:
        with atomic_path(base.with_suffix(".csv")) as tmp:
            df.to_csv(tmp, index=False, float_format="%.6g")


def json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.floating):
        return float(obj)
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
