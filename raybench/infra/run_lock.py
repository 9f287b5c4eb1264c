"""One writer per run folder: every command that writes into a run (`grid`, `train`, `encode`, `analyze`,
`report`, `compare`, `features`, `provenance`, `reliability`) holds its lock while it works; readers (`export`,
`status`) take none.

Two runs on one folder would pick the same Tune experiment name and replace each other's cells, and a `report`
re-rendering while a `grid` writes would mix two states of the tables. Locally the lock is a file created
atomically (O_EXCL) in the run folder, naming its holder (host, pid, start time); a lock whose process is gone on
this host is stale and taken over. On s3:// it is a lease object (raybench.infra.s3_lease). The lock is re-entrant
in one process (`raybench grid` holds it around its train stage, which takes it again) and released on exit or
exception.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from raybench.infra.lock_holder import LOCK_NAME, RunLocked, holder_record, is_remote_uri, refusal
from raybench.infra.s3_lease import LEASE_S, REFRESH_S, S3Lease

__all__ = ["LEASE_S", "LOCK_NAME", "REFRESH_S", "LocalLock", "RunLocked", "S3Lease", "locks_run", "local_run",
           "run_holding", "run_lock"]

log = logging.getLogger(__name__)
_held: dict[str, int] = {}  # lock key -> nesting depth in this process
_held_guard = threading.Lock()


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, command: str = "grid") -> Iterator[None]:
    """Hold the run folder's lock for the block; refuse (RunLocked) when another process holds it."""
    remote = is_remote_uri(run_dir)
    key = str(run_dir).rstrip("/") if remote else os.path.abspath(run_dir)
    with _held_guard:
        nested = _held.get(key, 0) > 0
        if nested:
            _held[key] += 1
    if nested:
        try:
            yield
        finally:
            with _held_guard:
                _held[key] -= 1
        return
    lock = S3Lease(key, command) if remote else LocalLock(Path(key), command)
    lock.acquire()
    with _held_guard:
        _held[key] = 1
    try:
        yield
    finally:
        with _held_guard:
            _held.pop(key, None)
        lock.release()


def locks_run(command: str, where: Callable[[dict[str, Any]], str | os.PathLike | None] | None = None,
              guard: Callable[[dict[str, Any]], None] | None = None
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator of a click command that writes into a run folder: its body runs under run_lock of
    `where(params)` (default: the `run_dir` parameter); None takes no lock (nothing of a run is written). `guard`
    (e.g. a refusal of symlinked output paths) runs once the lock is held. Put it right above the `def`, below the
    click options."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def body(*args: Any, **params: Any) -> Any:
            target = where(params) if where is not None else params.get("run_dir")
            with run_lock(target, command) if target is not None else contextlib.nullcontext():
                if guard is not None:
                    guard(params)
                return fn(*args, **params)

        return body

    return wrap


def local_run(params: dict[str, Any]) -> str | None:
    """`where` of locks_run for a command that reads a local run folder only: its --run-dir, or None for a remote
    or missing one (which the command refuses with its own message)."""
    run_dir = params.get("run_dir")
    return run_dir if run_dir is not None and not is_remote_uri(run_dir) and Path(run_dir).is_dir() else None


def run_holding(folder: str | os.PathLike, runs: Iterable[str | os.PathLike]) -> str | None:
    """The run among `runs` whose folder holds `folder` (an output folder such as compare's --out or features'
    default), for locks_run; None when `folder` lies outside every (local) run: nothing of a run is written.
    Judged by the paths as written (symlinks not followed: a linked output folder is refused by its command)."""
    target = Path(os.path.abspath(Path(folder).expanduser()))
    for run in runs:
        if is_remote_uri(run):
            continue
        root = Path(os.path.abspath(Path(run).expanduser()))
        if target == root or root in target.parents:
            return str(run)
    return None


# ---------------------------------------------------------------- local folder

def _pid_alive(pid: int, started: str | None) -> bool:
    """Whether `pid` runs here and is the process that took the lock (not a later one given the same pid)."""
    from raybench.core.atomic import pid_alive

    if not pid_alive(pid):
        return False
    try:
        import psutil  # a Ray dependency
    except ImportError:
        return True
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:  # killed, not yet reaped by its parent
            return False
        begun = proc.create_time()
        taken = datetime.datetime.fromisoformat(started).timestamp() if started else None
    except psutil.NoSuchProcess:
        return False
    except Exception:
        return True
    return taken is None or begun <= taken + 2.0


def _signature(path: Path) -> tuple[int, int, int, int] | None:
    """Which file `path` is (device, inode) and which write of it (mtime, size); None when there is none."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


class LocalLock:
    """`<run>/.raybench-lock.json`, created with O_EXCL; stale when its pid is gone on this host."""

    def __init__(self, root: Path, command: str):
        self.root, self.path, self.holder = root, root / LOCK_NAME, holder_record(command)

    def acquire(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(self.holder, indent=2, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            return
        raise refusal(str(self.root), self._read(self.path), self._clear_hint())

    def _clear_hint(self) -> str:
        return (f"If that process is no longer running (e.g. its machine went down), delete {self.path} and "
                "run again.")

    @staticmethod
    def _read(path: Path) -> dict[str, Any] | None:
        try:
            holder = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return holder if isinstance(holder, dict) else None

    def _stale(self, holder: dict[str, Any] | None) -> bool:
        if holder is None:  # a writer killed between create and write, or a file someone else made
            with contextlib.suppress(OSError):
                return time.time() - self.path.stat().st_mtime > 60
            return False
        if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
            return False  # another machine's process cannot be checked from here
        return not _pid_alive(holder["pid"], holder.get("started"))

    def _take_over_if_stale(self) -> None:
        """Remove a stale lock; refuse a live one. The rename makes two processes that both found it stale safe:
        only one moves it away. What was moved is compared with what was judged by inode and mtime, not by content
        (two empty lock files, the stale one and a fresh one between its create and write, read alike): a lock
        that turns out to be another file is put back and refused."""
        seen = _signature(self.path)
        holder = self._read(self.path)
        if seen is None:
            return  # released meanwhile: try again
        if not self._stale(holder) or _signature(self.path) != seen:  # live, or replaced while it was read
            raise refusal(str(self.root), self._read(self.path), self._clear_hint())
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if _signature(aside) != seen:  # a fresh lock was taken between our judgement and the rename: give it back
            moved = self._read(aside)
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            raise refusal(str(self.root), moved, self._clear_hint())
        log.warning("taking over the stale lock of %s (pid %s on %s is gone)", self.root,
                    (holder or {}).get("pid"), (holder or {}).get("host"))
        aside.unlink(missing_ok=True)

    def release(self) -> None:
        if self._read(self.path) == self.holder:
            self.path.unlink(missing_ok=True)


# ---------------------------------------------------------------- s3:// prefix
