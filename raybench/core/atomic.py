"""Atomic writes: a killed run never leaves a half file that looks complete."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import secrets
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
    The old folder is renamed aside (`.<name>.old-<pid>-<random>`) before the new one moves in and deleted
    only after, so a kill between the steps leaves it recoverable: the next call (or `recover_dir`) puts a
    dead process's aside back when `path` is missing, and deletes it when `path` is there.
    """
    path = Path(os.path.abspath(path))  # "." has no name and no real parent: normalize before using either
    cwd = Path.cwd()
    if path == cwd or path in cwd.parents:
        raise ValueError(f"refusing to replace {path}: it is the current directory or contains it; "
                         "write to a new folder instead")
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        _swap_in(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _swap_in(tmp: Path, path: Path) -> None:
    """Rename `path` aside, move `tmp` in, delete the aside; on a failure before the move, put `path` back."""
    aside = None
    if path.exists():
        aside = path.with_name(f".{path.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(path, aside)
    try:
        os.replace(tmp, path)
    except BaseException:
        if aside is not None and not path.exists():
            os.replace(aside, path)
        raise
    if aside is not None:
        with contextlib.suppress(OSError):  # the new folder is in place; the next call deletes the aside
            shutil.rmtree(aside)


def recover_dir(path: str | os.PathLike) -> bool:
    """Finish what a killed `atomic_dir` left beside `path`: put its old folder back when `path` is missing
    (True), delete it when `path` is there. While `path` is missing, the aside of a process still running (between
    its two renames) is left alone."""
    path = Path(os.path.abspath(path))
    if not path.parent.is_dir():
        return False
    recovered = False
    for aside in sorted(path.parent.glob(f".{glob.escape(path.name)}.old-*")):
        if path.exists():  # superseded by a newer folder, whoever set it aside
            shutil.rmtree(aside, ignore_errors=True)
            continue
        pid = aside.name[len(path.name) + 6:].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            os.replace(aside, path)
            recovered = True
    return recovered


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (the one check behind every stale temp folder, aside and lock)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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


def file_sha256(path: str | os.PathLike) -> str:
    """The sha256 of a file's bytes, read in 1 MiB chunks (export manifests, the cluster wheel's SHA256SUMS)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
