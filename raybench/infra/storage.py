"""Run folders on local disk or object storage (`s3://bucket/prefix`), through fsspec.

Stages compute in a node-local *mirror* of the run folder and synchronise it with the run URI at
stage boundaries (and trials sync the one activation store they read and the one cell they write),
so every node of a multi-node cluster shares one place without any stage speaking S3 itself.
Completion markers (`index.json`, `metrics.json`, `report.html`) are uploaded last, so a half-synced
folder never looks complete. The S3 endpoint follows the usual AWS variables (AWS_ENDPOINT_URL, ...).

What the mirror knows about the prefix (its stamp, and the ETag/size/mtime/MD5 of each file as last
synced) is raybench.infra.mirror_state; with it re-written files of equal size are noticed in both directions
and a mirror of a deleted (or re-created) prefix is wiped first. Keys that would land outside the mirror
(`..`, empty or absolute parts) are skipped with a warning. Downloads go to a unique temp file, are checked
(size, MD5 where the ETag is one) and renamed into place atomically.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from raybench.infra.mirror_state import LocalFile, StorageError, is_md5, save_entries, tie
from raybench.infra.s3_lease import check_lease

MARKERS = ("index.json", "metrics.json", "summary.json", "report.html")

log = logging.getLogger(__name__)


def is_remote(uri: str | os.PathLike) -> bool:
    s = str(uri)
    return "://" in s and not s.startswith("file://")


def _fs(uri: str):
    import fsspec

    # no instance cache: a cached S3 client would keep an old endpoint/credentials from the environment
    fs, path = fsspec.core.url_to_fs(uri, skip_instance_cache=True)
    return fs, path.rstrip("/")


class ArrowLocation(NamedTuple):
    """A remote URI as pyarrow sees it."""

    fs: Any
    """The pyarrow filesystem (pyarrow.fs.FileSystem)."""
    path: str
    """The path inside it, without a trailing slash."""


def arrow_filesystem(uri: str) -> ArrowLocation:
    """The pyarrow filesystem and path of a remote URI, e.g. for Ray Tune's `storage_filesystem`.

    pyarrow's S3FileSystem ignores AWS_ENDPOINT_URL(_S3), so an S3-compatible endpoint (MinIO, moto,
    ...) is passed explicitly. `allow_delayed_open` sends small objects in one PUT instead of a
    multipart upload (fewer round trips; also sidesteps moto 5.2.1's malformed
    CompleteMultipartUpload reply, getmoto/moto#10055).
    """
    from pyarrow import fs as pafs

    scheme, _, rest = str(uri).partition("://")
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if scheme in ("s3", "s3a") and endpoint:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
        return ArrowLocation(pafs.S3FileSystem(endpoint_override=endpoint, region=region, allow_delayed_open=True),
                             rest.rstrip("/"))
    fs, path = pafs.FileSystem.from_uri(str(uri))
    return ArrowLocation(fs, path.rstrip("/"))


def local_mirror(uri: str | os.PathLike) -> Path:
    """The node-local folder that mirrors a run URI (the folder itself for local paths)."""
    if not is_remote(uri):
        return Path(uri)
    base = Path(os.environ.get("RAYBENCH_CACHE", Path.home() / ".cache" / "raybench"))
    return base / "mirror" / hashlib.sha256(str(uri).encode()).hexdigest()[:16]


def _files(local: Path) -> list[Path]:
    files = [p for p in local.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.name in MARKERS, str(p)))  # markers last


# ---------------------------------------------------------------- helpers for both directions

def _etag(info: dict) -> str | None:
    tag = info.get("ETag") or info.get("etag")
    return str(tag).strip('"').lower() if tag else None


def _listing(fs, prefix: str) -> dict[str, dict]:
    """{path: info} of the objects at/under `prefix` (one LIST; {} when there are none)."""
    try:
        info = fs.info(prefix)
    except FileNotFoundError:
        return {}
    if info.get("type") == "directory":
        return fs.find(prefix, detail=True)
    return {prefix: info}


def _inside(base: Path, rel: str) -> Path | None:
    """`base/rel` when that stays inside `base` (no empty, `.`, `..` or absolute parts, no symlink out)."""
    parts = rel.split("/")
    if not rel or any(part in ("", ".", "..") for part in parts):
        return None
    dest = base.joinpath(*parts)
    resolved = dest.resolve()
    return dest if resolved != base and resolved.is_relative_to(base) else None


# ---------------------------------------------------------------- the two directions

def sync_up(local: Path, uri: str, sub: str = "") -> int:
    """Upload new or changed files of `local/sub` to `uri/sub` (markers last). Returns files sent.

    A file is sent when its content differs from the object's: MD5 against the ETag, or against the
    record of the last sync (multipart ETags). A local file untouched since the last sync whose object was
    re-written since is the older copy and is not sent back. Markers are re-sent unless the object is newer.
    Before each upload the run's lease is re-checked (raybench.infra.s3_lease.check_lease): a process that lost
    it raises LeaseLost instead of writing beside the new holder.
    """
    if not is_remote(uri):
        return 0
    local = Path(local)
    src = local / sub
    if not src.exists():
        return 0
    fs, root = _fs(uri)
    check_lease(uri)  # tie may write the prefix's stamp
    state = tie(fs, root, uri, local, may_wipe=False)
    remote = _listing(fs, f"{root}/{sub}".rstrip("/"))
    known, updates = state["files"], {}
    sent = 0
    try:
        for path in _files(src) if src.is_dir() else [src]:
            rel = path.relative_to(local).as_posix()
            dest = f"{root}/{rel}"
            lf, info = LocalFile(path, known.get(rel)), remote.get(dest)
            if info is not None:
                etag = _etag(info)
                if lf.as_synced():
                    in_sync = lf.entry.get("etag") == etag or lf.matches(etag, info.get("size"))
                    if not in_sync:
                        continue  # re-written there since the last sync, untouched here: the object is newer
                else:
                    in_sync = lf.matches(etag, info.get("size"))
                if in_sync:
                    if lf.hashed or (lf.entry or {}).get("etag") != etag:
                        updates[rel] = lf.record(etag)
                    if path.name not in MARKERS:
                        continue
            lf.md5()
            check_lease(uri)  # a holder that lost the run's lease (raybench.infra.s3_lease) stops here
            fs.put_file(str(path), dest)
            fs.invalidate_cache(dest)
            updates[rel] = lf.record(_etag(fs.info(dest)))
            sent += 1
    finally:
        save_entries(local, state["stamp"], updates)
    return sent


def _download(fs, path: str, dest: Path, etag: str | None, size: int | None) -> dict:
    """Fetch `path` into a temp file of its own next to `dest`, check it, rename it into place; its record."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    for attempt in (1, 2):
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.part")
        try:
            fs.get_file(path, str(tmp))
            lf = LocalFile(tmp, None)
            md5_differs = is_md5(etag) and lf.md5() != etag
            if lf.st.st_size == size and md5_differs and attempt == 2:
                log.warning("%s: MD5 %s differs from its ETag %s twice (an ETag that is no MD5, e.g. SSE-KMS?); "
                            "keeping the download", path, lf.md5(), etag)
            elif lf.st.st_size != size or md5_differs:
                fs.invalidate_cache(path)  # the object changed since it was listed, or the transfer came up short
                info = fs.info(path)
                etag, size = _etag(info), info.get("size")
                continue
            record = lf.record(etag)  # the rename keeps inode and mtime
            os.replace(tmp, dest)
            return record
        finally:
            tmp.unlink(missing_ok=True)
    raise StorageError(f"download of {path} into {dest} came back with {lf.st.st_size} bytes, expected {size}; "
                       "check the storage endpoint")


def sync_down(uri: str, local: Path, sub: str = "", skipped: list[str] | None = None) -> int:
    """Download files of `uri/sub` missing or stale locally (markers last). Returns files fetched.

    A local file is stale when its content differs from the object's (MD5 against the ETag, or the object
    was re-written since the last sync). A local file modified since the last sync whose object did not
    change is the newer copy and is kept. Keys that would land outside the mirror are skipped with a
    warning (and appended to `skipped`). A mirror of an earlier incarnation of the prefix is wiped first.
    """
    if not is_remote(uri):
        return 0
    local = Path(local)
    fs, root = _fs(uri)
    state = tie(fs, root, uri, local, may_wipe=True)
    remote = _listing(fs, f"{root}/{sub}".rstrip("/"))
    base = local.resolve()
    known, updates = state["files"], {}
    got = 0
    try:
        for path in sorted(remote, key=lambda p: (p.rsplit("/", 1)[-1] in MARKERS, p)):
            if path.endswith("/"):  # a "folder" placeholder object
                continue
            rel = path[len(root) + 1:] if path.startswith(f"{root}/") else ""
            dest = _inside(base, rel)
            if dest is None:
                log.warning("skipping %s: it would land outside the mirror %s", path, local)
                if skipped is not None:
                    skipped.append(path)
                continue
            if dest.name.startswith(".raybench-"):  # the stamp, a write probe
                continue
            info = remote[path]
            etag, size = _etag(info), info.get("size")
            if dest.is_file():
                lf = LocalFile(dest, known.get(rel))
                synced = lf.as_synced()
                if (synced and lf.entry.get("etag") == etag) or lf.matches(etag, size):
                    if lf.hashed or (lf.entry or {}).get("etag") != etag:
                        updates[rel] = lf.record(etag)
                    continue
                if not synced and lf.entry is not None and lf.entry.get("etag") == etag:
                    continue  # modified here since the last sync, unchanged there: the local copy is newer
            updates[rel] = _download(fs, path, dest, etag, size)
            got += 1
    finally:
        save_entries(local, state["stamp"], updates)
    return got


def check_writable(uri: str | os.PathLike, min_free_bytes: int = 1 << 30) -> None:
    """Fail before any work starts when the run location is unwritable or (locally) nearly full."""
    if is_remote(uri):
        fs, root = _fs(str(uri))
        probe = f"{root}/.raybench-write-probe"
        try:
            fs.pipe_file(probe, b"ok")
            fs.rm_file(probe)
        except Exception as err:
            raise StorageError(f"cannot write to {uri} ({type(err).__name__}: {err}); check the bucket name, "
                               "credentials (AWS_* variables) and endpoint") from err
        return
    path = Path(uri)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".raybench-write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise StorageError(f"cannot write to run folder {path} ({err.strerror}); choose a writable --run-dir") from err
    free = shutil.disk_usage(path).free
    if free < min_free_bytes:
        raise StorageError(f"run folder {path} has only {free / 2**20:.0f} MiB free, need at least "
                           f"{min_free_bytes / 2**20:.0f} MiB; free space or choose another --run-dir")
