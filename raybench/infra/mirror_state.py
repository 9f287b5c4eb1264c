"""The mirror's record of a run prefix: which incarnation it belongs to, and what was last synced.

The run prefix carries a stamp (`STAMP`, written when the prefix is first used); the mirror records which
stamp it belongs to in `STATE_FILE`, with the ETag/size/mtime/MD5 of each file as last synced, so
re-written files of equal size are noticed in both directions (raybench.infra.storage), and a mirror left over from
a deleted (or re-created) prefix is wiped instead of resurrecting old results (`tie`). Trials and nodes
sharing one mirror serialise their updates of the record through `LOCK_FILE`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from raybench.core.errors import RaybenchError

STAMP = ".raybench-run.json"  # in the run prefix: which incarnation of the run this is
STATE_FILE = ".raybench-sync.json"  # in the mirror: the stamp it belongs to + what was synced (key -> etag, ...)
LOCK_FILE = ".raybench-sync.lock"  # in the mirror: serialises state updates of trials/nodes sharing it
_MD5 = re.compile(r"[0-9a-f]{32}")
_RACY_NS = 2_000_000_000  # a recorded MD5 is trusted for an unchanged stat only if the file was older than this then

log = logging.getLogger(__name__)


class StorageError(RaybenchError, RuntimeError):
    """An output location cannot be used; the message names it and the fix."""


def is_md5(etag: str | None) -> bool:
    """The ETag has the form of an MD5 (a single-part upload's ETag is the object's MD5)."""
    return _MD5.fullmatch(etag or "") is not None


@contextlib.contextmanager
def _locked(local: Path) -> Iterator[None]:
    """Exclusive lock on the mirror's state (processes and threads alike: one open file each)."""
    local.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        fcntl = None
    with open(local / LOCK_FILE, "a+b") as fh:
        if fcntl:
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _read_state(local: Path) -> dict:
    try:
        state = json.loads((local / STATE_FILE).read_text())
        if isinstance(state, dict) and isinstance(state.get("files"), dict):
            return state
    except (OSError, ValueError):
        pass
    return {"stamp": None, "files": {}}


def _write_state(local: Path, state: dict) -> None:
    tmp = local / f"{STATE_FILE}.{os.getpid()}.{uuid.uuid4().hex[:12]}.part"
    tmp.write_text(json.dumps(state, sort_keys=True))
    os.replace(tmp, local / STATE_FILE)


def save_entries(local: Path, stamp: str, updates: dict[str, dict]) -> None:
    """Merge what this sync transferred into the mirror state (re-read under the lock: others write too)."""
    if not updates:
        return
    with _locked(local):
        state = _read_state(local)
        if state.get("stamp") != stamp:  # re-tied to another incarnation meanwhile: these entries are moot
            return
        state["files"].update(updates)
        _write_state(local, state)


def _has_content(local: Path) -> bool:
    return local.is_dir() and any(p.name not in (LOCK_FILE, STATE_FILE) for p in local.iterdir())


def _wipe(local: Path) -> None:
    for p in local.iterdir():
        if p.name == LOCK_FILE:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def _read_stamp(fs, root: str) -> str | None:
    try:
        return fs.cat_file(f"{root}/{STAMP}").decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return None


def _create_stamp(fs, root: str) -> str:
    text = json.dumps({"run_stamp": uuid.uuid4().hex, "created": datetime.now(UTC).isoformat(timespec="seconds")})
    fs.pipe_file(f"{root}/{STAMP}", text.encode())
    return _read_stamp(fs, root) or text  # another node may have written its stamp just now: adopt that one


def tie(fs, root: str, uri: str, local: Path, *, may_wipe: bool) -> dict:
    """Tie the mirror to the run prefix's stamp (creating the stamp on a new prefix); returns mirror state.

    A mirror holding files of another incarnation (the prefix was deleted or re-created since) is wiped
    before a download (`may_wipe`), so deleted results do not come back; an upload from it is refused.
    """
    with _locked(local):
        state = _read_state(local)
        remote = _read_stamp(fs, root)
        recorded = state.get("stamp")
        if remote is not None and remote == recorded:
            return state
        if recorded is not None or (may_wipe and _has_content(local)):
            if not may_wipe:
                raise StorageError(f"the mirror {local} belongs to an earlier run at {uri} (the prefix was deleted or "
                                   "re-created since); sync it down first, which starts it over")
            log.warning("run prefix %s %s: wiping the local mirror %s (old results must not come back)", uri,
                        "has no stamp" if remote is None else "has another stamp than the mirror", local)
            _wipe(local)
            state = {"stamp": None, "files": {}}
        # else: a folder never synced with a stamp is uploaded as it is (it becomes this run's mirror)
        state["stamp"] = remote if remote is not None else _create_stamp(fs, root)
        _write_state(local, state)
        return state


def file_md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class LocalFile:
    """A local file against its sync record: MD5 computed at most once, taken from the record when safe.

    The recorded MD5 stands for the file while size, mtime and inode are unchanged, unless the file was
    written within `_RACY_NS` of being recorded (a rewrite right after could keep the same coarse mtime;
    such a file is hashed again, as git does with racily clean index entries).
    """

    def __init__(self, path: Path, entry: dict | None, st: os.stat_result | None = None, seen_ns: int | None = None):
        self.path, self.entry = path, entry
        self.seen_ns = time.time_ns() if seen_ns is None else seen_ns  # before stat and hash
        self.st = path.stat() if st is None else st
        self.hashed = False
        self._md5: str | None = None

    def md5(self) -> str:
        if self._md5 is None:
            e, st = self.entry or {}, self.st
            same_stat = (e.get("size"), e.get("mtime_ns"), e.get("ino")) == (st.st_size, st.st_mtime_ns, st.st_ino)
            if e.get("md5") and same_stat and st.st_mtime_ns < e.get("seen_ns", 0) - _RACY_NS:
                self._md5 = e["md5"]
            else:
                self._md5, self.hashed = file_md5(self.path), True
        return self._md5

    def as_synced(self) -> bool:
        """The content is what it was at the last sync."""
        e = self.entry
        return e is not None and e.get("size") == self.st.st_size and self.md5() == e.get("md5")

    def matches(self, etag: str | None, size: int | None) -> bool:
        """The content is the object's (a single-part ETag is the MD5 of the object)."""
        return size == self.st.st_size and bool(etag) and is_md5(etag) and self.md5() == etag

    def record(self, etag: str | None) -> dict:
        return {"etag": etag, "md5": self.md5(), "size": self.st.st_size, "mtime_ns": self.st.st_mtime_ns,
                "ino": self.st.st_ino, "seen_ns": self.seen_ns}
