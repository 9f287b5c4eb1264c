"""What the two kinds of run lock share (raybench.infra.run_lock: a local lock file; raybench.infra.s3_lease: an
s3:// lease object): the lock's name, who holds it, and the one-line refusal naming the holder."""

from __future__ import annotations

import datetime
import os
import secrets
import socket
from typing import Any

from raybench.core.errors import RaybenchError

LOCK_NAME = ".raybench-lock.json"  # a dot name: never synced up or down with the run (raybench.infra.storage)


class RunLocked(RaybenchError, RuntimeError):
    """Another raybench command writes into this run folder."""


def is_remote_uri(uri: str | os.PathLike) -> bool:
    """As raybench.infra.storage.is_remote (which imports the locks to guard its uploads)."""
    s = str(uri)
    return "://" in s and not s.startswith("file://")


def now() -> str:
    """The holder's start time as written into a lock (UTC, seconds): shown to whoever is refused."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def holder_record(command: str) -> dict[str, Any]:
    """Who holds a lock: enough to name it in a refusal and to tell (by pid, locally) whether it is still alive;
    the token tells this holder's lock from a later one of the same process."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": now(), "command": command,
            "token": secrets.token_hex(8)}


def refusal(where: str, holder: dict[str, Any] | None, how_to_clear: str) -> RunLocked:
    who = ("an unreadable holder" if not isinstance(holder, dict) else
           f"`raybench {holder.get('command', '?')}` on host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, "
           f"started {holder.get('started', '?')}")
    return RunLocked(f"the run folder {where} is in use by {who}; two writers on one folder would replace each other's "
                     f"files. Wait for it to finish, or use another --run-dir. {how_to_clear}")


