"""Run folders on local disk or object storage (`s3://bucket/prefix`), through fsspec.

Stages compute in a node-local *mirror* of the run folder and synchronise it with the run URI at
stage boundaries (and trials sync the one activation store they read and the one cell they write),
so every node of a multi-node cluster shares one place without any stage speaking S3 itself.
Completion markers (`index.json`, `metrics.json`, `report.html`) are uploaded last, so a half-synced
folder never looks complete. The S3 endpoint follows the usual AWS variables (AWS_ENDPOINT_URL, ...).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

MARKERS = ("index.json", "metrics.json", "summary.json", "report.html")


class StorageError(RuntimeError):
    """An output location cannot be used; the message names it and the fix."""


def is_remote(uri: str | os.PathLike) -> bool:
    s = str(uri)
    return "://" in s and not s.startswith("file://")


def _fs(uri: str):
    import fsspec

    # no instance cache: a cached S3 client would keep an old endpoint/credentials from the environment
    fs, path = fsspec.core.url_to_fs(uri, skip_instance_cache=True)
    return fs, path.rstrip("/")


def arrow_filesystem(uri: str):
    """(pyarrow filesystem, path inside it) for a remote URI, e.g. Ray Tune's `storage_filesystem`.

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
        return pafs.S3FileSystem(endpoint_override=endpoint, region=region, allow_delayed_open=True), rest.rstrip("/")
    fs, path = pafs.FileSystem.from_uri(str(uri))
    return fs, path.rstrip("/")


def local_mirror(uri: str | os.PathLike) -> Path:
    """The node-local folder that mirrors a run URI (the folder itself for local paths)."""
    if not is_remote(uri):
        return Path(uri)
    base = Path(os.environ.get("RAYBENCH_CACHE", Path.home() / ".cache" / "raybench"))
    return base / "mirror" / hashlib.sha256(str(uri).encode()).hexdigest()[:16]


def _files(local: Path) -> list[Path]:
    files = [p for p in local.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return sorted(files, key=lambda p: (p.name in MARKERS, str(p)))  # markers last


def sync_up(local: Path, uri: str, sub: str = "") -> int:
    """Upload new or changed files of `local/sub` to `uri/sub` (markers last). Returns files sent."""
    if not is_remote(uri):
        return 0
    fs, root = _fs(uri)
    src = local / sub
    if not src.exists():
        return 0
    sent = 0
    for path in _files(src) if src.is_dir() else [src]:
        rel = path.relative_to(local).as_posix()
        dest = f"{root}/{rel}"
        try:
            if fs.exists(dest) and fs.size(dest) == path.stat().st_size and path.name not in MARKERS:
                continue
        except FileNotFoundError:
            pass
        fs.put_file(str(path), dest)
        sent += 1
    return sent


def sync_down(uri: str, local: Path, sub: str = "") -> int:
    """Download files of `uri/sub` missing locally (markers last). Returns files fetched."""
    if not is_remote(uri):
        return 0
    fs, root = _fs(uri)
    prefix = f"{root}/{sub}".rstrip("/")
    if not fs.exists(prefix):
        return 0
    remote = [p for p in fs.find(prefix)] if fs.isdir(prefix) else [prefix]
    remote.sort(key=lambda p: (p.rsplit("/", 1)[-1] in MARKERS, p))
    got = 0
    for path in remote:
        rel = path[len(root) + 1:]
        dest = local / rel
        if dest.exists() and dest.stat().st_size == fs.size(path):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        fs.get_file(path, str(tmp))
        os.replace(tmp, dest)
        got += 1
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
