"""One writer per run folder: every command that writes into a run (`grid`, `train`, `encode`, `analyze`,
`report`, `compare`, `features`, `provenance`, `reliability`) holds its lock while it works; readers (`export`,
`status`) take none.

Two runs on one folder would pick the same Tune experiment name and replace each other's cells, and a `report`
re-rendering while a `grid` writes would mix two states of the tables. Locally the lock
is a file created atomically (O_EXCL) in the run folder, naming its holder (host, pid, start time); a lock whose
process is gone on this host is stale and taken over. On s3:// it is a lease object written with a conditional
put (If-None-Match: only if absent), refreshed while the run works and taken over only once expired (If-Match:
only if unchanged), since no process on another machine can be checked. The lock is re-entrant in one process
(`raybench grid` holds it around its train stage, which takes it again) and released on exit or exception.
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

from raybench.core.errors import RaybenchError

LOCK_NAME = ".raybench-lock.json"  # a dot name: never synced up or down with the run (raybench.infra.storage)
LEASE_S = 120.0  # an s3 lease not refreshed for this long is stale
REFRESH_S = 30.0

log = logging.getLogger(__name__)
_held: dict[str, int] = {}  # lock key -> nesting depth in this process
_held_guard = threading.Lock()


class RunLocked(RaybenchError, RuntimeError):
    """Another raybench command writes into this run folder."""


def _is_remote(uri: str | os.PathLike) -> bool:
    """As raybench.infra.storage.is_remote (which imports this module to guard its uploads)."""
    s = str(uri)
    return "://" in s and not s.startswith("file://")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def _holder(command: str) -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": _now(), "command": command,
            "token": secrets.token_hex(8)}


def _refusal(where: str, holder: dict[str, Any] | None, how_to_clear: str) -> RunLocked:
    who = ("an unreadable holder" if not isinstance(holder, dict) else
           f"`raybench {holder.get('command', '?')}` on host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
           f"started {holder.get('started', '?')}")
    return RunLocked(f"the run folder {where} is in use by {who}; two writers on one folder would replace each other's "
                     f"files. Wait for it to finish, or use another --run-dir. {how_to_clear}")


@contextlib.contextmanager
def run_lock(run_dir: str | os.PathLike, command: str = "grid") -> Iterator[None]:
    """Hold the run folder's lock for the block; refuse (RunLocked) when another process holds it."""
    remote = _is_remote(run_dir)
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


def locks_run(command: str, where: Callable[[dict[str, Any]], str | os.PathLike | None] | None = None
              ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator of a click command that writes into a run folder: its body runs under run_lock of
    `where(params)` (default: the `run_dir` parameter); None takes no lock (nothing of a run is written). Put it
    right above the `def`, below the click options."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def body(*args: Any, **params: Any) -> Any:
            target = where(params) if where is not None else params.get("run_dir")
            with run_lock(target, command) if target is not None else contextlib.nullcontext():
                return fn(*args, **params)

        return body

    return wrap


def local_run(params: dict[str, Any]) -> str | None:
    """`where` of locks_run for a command that reads a local run folder only: its --run-dir, or None for a remote
    or missing one (which the command refuses with its own message)."""
    run_dir = params.get("run_dir")
    return run_dir if run_dir is not None and not _is_remote(run_dir) and Path(run_dir).is_dir() else None


def run_holding(folder: str | os.PathLike, runs: Iterable[str | os.PathLike]) -> str | None:
    """The run among `runs` whose folder holds `folder` (an output folder such as compare's --out or features'
    default), for locks_run; None when `folder` lies outside every (local) run: nothing of a run is written."""
    target = Path(folder).expanduser().resolve()
    for run in runs:
        if _is_remote(run):
            continue
        root = Path(run).expanduser().resolve()
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


class LocalLock:
    """`<run>/.raybench-lock.json`, created with O_EXCL; stale when its pid is gone on this host."""

    def __init__(self, root: Path, command: str):
        self.root, self.path, self.holder = root, root / LOCK_NAME, _holder(command)

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
        raise _refusal(str(self.root), self._read(self.path), self._clear_hint())

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
        only one moves it away, and a lock that turns out to be fresh is put back."""
        holder = self._read(self.path)
        if not self._stale(holder):
            if self.path.exists():
                raise _refusal(str(self.root), holder, self._clear_hint())
            return  # released meanwhile: try again
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        moved = self._read(aside)
        if moved != holder:  # a fresh lock was taken between our read and the rename: give it back
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
            aside.unlink(missing_ok=True)
            raise _refusal(str(self.root), moved, self._clear_hint())
        log.warning("taking over the stale lock of %s (pid %s on %s is gone)", self.root,
                    (holder or {}).get("pid"), (holder or {}).get("host"))
        aside.unlink(missing_ok=True)

    def release(self) -> None:
        if self._read(self.path) == self.holder:
            self.path.unlink(missing_ok=True)


# ---------------------------------------------------------------- s3:// prefix

class S3Lease:
    """`<prefix>/.raybench-lock.json` with an expiry, written only if absent (or unchanged, to refresh/take over)."""

    def __init__(self, uri: str, command: str, lease_s: float = LEASE_S, refresh_s: float = REFRESH_S):
        rest = uri.partition("://")[2]
        self.uri, (self.bucket, _, prefix) = uri, rest.partition("/")
        self.key = f"{prefix.strip('/')}/{LOCK_NAME}".lstrip("/")
        self.holder, self.lease_s, self.refresh_s = _holder(command), lease_s, refresh_s
        self.etag: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _client(self):
        import boto3

        return boto3.client("s3")  # AWS_ENDPOINT_URL and credentials from the environment, as raybench.infra.storage

    def _body(self) -> bytes:
        return json.dumps({**self.holder, "expires": time.time() + self.lease_s}, sort_keys=True).encode()

    def acquire(self) -> None:
        from botocore.exceptions import ClientError

        s3 = self._client()
        try:
            self.etag = s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(), IfNoneMatch="*")["ETag"]
        except ClientError as err:
            if not _precondition_failed(err):
                raise
            self._take_over_if_expired(s3)
        self._thread = threading.Thread(target=self._refresh, name="raybench-run-lease", daemon=True)
        self._thread.start()

    def _clear_hint(self) -> str:
        return (f"A lease not refreshed for {self.lease_s:.0f} s expires by itself; to clear it at once, delete "
                f"{self.uri.rstrip('/')}/{LOCK_NAME}.")

    def _take_over_if_expired(self, s3) -> None:
        from botocore.exceptions import ClientError

        try:
            got = s3.get_object(Bucket=self.bucket, Key=self.key)
            etag, holder = got["ETag"], json.loads(got["Body"].read())
        except (ClientError, ValueError):
            holder, etag = None, None
        expires = holder.get("expires") if isinstance(holder, dict) else None
        if etag is None or not isinstance(expires, int | float) or expires > time.time():
            raise _refusal(self.uri, holder, self._clear_hint())
        try:
            self.etag = s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(), IfMatch=etag)["ETag"]
        except ClientError as err:
            if _precondition_failed(err):  # someone else took it over first
                raise _refusal(self.uri, holder, self._clear_hint()) from None
            raise
        log.warning("took over the expired lease of %s (held by pid %s on %s)", self.uri, holder.get("pid"),
                    holder.get("host"))

    def _refresh(self) -> None:
        from botocore.exceptions import ClientError

        s3 = self._client()
        while not self._stop.wait(self.refresh_s):
            try:
                self.etag = s3.put_object(Bucket=self.bucket, Key=self.key, Body=self._body(),
                                          IfMatch=self.etag)["ETag"]
            except ClientError as err:
                if _precondition_failed(err) or err.response.get("Error", {}).get("Code") == "NoSuchKey":
                    log.error("lost the lease on %s (taken over or deleted): another run may write into it", self.uri)
                    return
                log.warning("could not refresh the lease on %s (%s); retrying", self.uri, type(err).__name__)
            except Exception as err:  # a network blip: the lease has LEASE_S to spare
                log.warning("could not refresh the lease on %s (%s); retrying", self.uri, type(err).__name__)

    def release(self) -> None:
        from botocore.exceptions import ClientError

        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.etag is None:
            return
        with contextlib.suppress(ClientError):  # taken over meanwhile: it is no longer ours to delete
            self._client().delete_object(Bucket=self.bucket, Key=self.key, IfMatch=self.etag)


def _precondition_failed(err) -> bool:
    meta = getattr(err, "response", {}) or {}
    return (meta.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict")
            or meta.get("ResponseMetadata", {}).get("HTTPStatusCode") in (409, 412))
