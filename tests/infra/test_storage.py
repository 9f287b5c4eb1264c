"""Run folders on a real S3-compatible server (moto on loopback) and preflight write checks."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import pytest

from raybench.infra.storage import StorageError, check_writable, is_remote, local_mirror, sync_down, sync_up
from tests.s3_server import s3_server


def test_local_paths_are_their_own_mirror(tmp_path):
    assert not is_remote(tmp_path) and local_mirror(tmp_path) == tmp_path
    assert is_remote("s3://b/run") and local_mirror("s3://b/run") != local_mirror("s3://b/other")


def test_round_trip_through_s3(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYBENCH_CACHE", str(tmp_path / "cache"))
    with s3_server() as bucket:
        uri = f"{bucket}/runs/demo"
        check_writable(uri)
        a = tmp_path / "a"
        (a / "cells" / "c1").mkdir(parents=True)
        (a / "cells" / "c1" / "weights.bin").write_bytes(os.urandom(1000))
        (a / "cells" / "c1" / "metrics.json").write_text("{}")
        assert sync_up(a, uri) == 2
        assert sync_up(a, uri) == 1  # unchanged data skipped; the marker is always re-sent last
        b = tmp_path / "b"
        assert sync_down(uri, b, "cells") == 2
        assert (b / "cells" / "c1" / "weights.bin").read_bytes() == (a / "cells" / "c1" / "weights.bin").read_bytes()
        assert sync_down(uri, b, "cells") == 0


def test_unwritable_bucket_is_a_clear_error(tmp_path):
    with s3_server(), pytest.raises(StorageError, match="no-such-bucket"):
        check_writable("s3://no-such-bucket/run")


def test_unwritable_local_folder_is_a_clear_error(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permission bits
            blocker = tmp_path / "file"
            blocker.write_text("x")
            with pytest.raises(StorageError, match="choose a writable"):
                check_writable(blocker / "run")
        else:
            with pytest.raises(StorageError, match="choose a writable"):
                check_writable(ro / "run")
    finally:
        ro.chmod(0o700)


def test_nearly_full_disk_is_refused_before_work(tmp_path):
    with pytest.raises(StorageError, match="free"):
        check_writable(tmp_path, min_free_bytes=1 << 62)


# ---------------------------------------------------------------- hardening: containment, content, races, stale mirrors

def _s3():
    import boto3

    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def _put(key: str, body: bytes, bucket: str = "raybench-test") -> None:
    _s3().put_object(Bucket=bucket, Key=key, Body=body)


def _get(key: str, bucket: str = "raybench-test") -> bytes:
    return _s3().get_object(Bucket=bucket, Key=key)["Body"].read()


def _keys(prefix: str, bucket: str = "raybench-test") -> set[str]:
    return {o["Key"] for o in _s3().list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])}


def test_sync_down_never_writes_outside_the_mirror(tmp_path, caplog):
    """Keys with `..`, empty (absolute) parts or through a symlink are skipped and reported, not written."""
    mirror = tmp_path / "a" / "b" / "mirror"
    outside = tmp_path / "outside"
    outside.mkdir()
    with s3_server() as bucket:
        sync_down(f"{bucket}/run", mirror)  # a new run: the mirror is tied to it (and may hold a link)
        mirror.mkdir(parents=True, exist_ok=True)
        (mirror / "link").symlink_to(outside, target_is_directory=True)
        bad = ["run/cells/../../../escaped.txt", f"run/{tmp_path}/abs.txt", "run/link/through.txt"]
        assert bad[1].startswith("run//")  # tmp_path is absolute: an empty part, i.e. an absolute local path
        for key in [*bad, "run/cells/ok.txt"]:
            _put(key, b"payload")
        with caplog.at_level(logging.WARNING, logger="raybench.infra.storage"):
            sync_down(f"{bucket}/run", mirror)
        assert (mirror / "cells" / "ok.txt").read_bytes() == b"payload"
        assert not (tmp_path / "a" / "escaped.txt").exists() and not (tmp_path / "abs.txt").exists()
        assert not (outside / "through.txt").exists()
        assert [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes() == b"payload"] == \
            [mirror / "cells" / "ok.txt"]
        assert caplog.text.count("outside the mirror") == 3
        skipped: list[str] = []
        sync_down(f"{bucket}/run", mirror, skipped=skipped)
        assert sorted(skipped) == sorted(f"raybench-test/{k}" for k in bad)


def test_rewritten_files_of_equal_size_sync_both_ways(tmp_path, monkeypatch):
    """Same size, new content: found by checksum, up and down, and a stale copy never overwrites a newer one."""
    monkeypatch.setenv("RAYBENCH_CACHE", str(tmp_path / "cache"))
    old, new, newer = (os.urandom(4096) for _ in range(3))
    with s3_server() as bucket:
        uri = f"{bucket}/runs/eq"
        a, b = tmp_path / "a", tmp_path / "b"
        arrays = a / "cells" / "c1" / "sae.safetensors"
        arrays.parent.mkdir(parents=True)
        arrays.write_bytes(old)
        (arrays.parent / "metrics.json").write_text('{"v": 1}')
        assert sync_up(a, uri) == 2
        assert sync_down(uri, b) == 2

        arrays.write_bytes(new)  # node a re-trains the cell: same size, new bytes, new marker
        (arrays.parent / "metrics.json").write_text('{"v": 2}')
        assert sync_up(a, uri) == 2
        assert _get("runs/eq/cells/c1/sae.safetensors") == new
        assert sync_down(uri, b) == 2  # node b: the arrays next to the new marker are the new ones
        assert (b / "cells" / "c1" / "sae.safetensors").read_bytes() == new
        assert sync_down(uri, b) == 0 and sync_up(b, uri) == 1  # in sync; only the marker is re-sent

        (b / "cells" / "c1" / "sae.safetensors").write_bytes(newer)  # the other direction
        assert sync_up(b, uri) == 2 and _get("runs/eq/cells/c1/sae.safetensors") == newer
        assert sync_up(a, uri) == 1  # the identical marker only: a's older arrays do not overwrite newer ones
        assert _get("runs/eq/cells/c1/sae.safetensors") == newer
        assert sync_down(uri, a) == 1 and arrays.read_bytes() == newer


def test_concurrent_downloads_of_one_key_do_not_share_a_temp_file(tmp_path, monkeypatch):
    """Two trials on one node fetching the same store at once: both see the full bytes, no temp left over."""
    import s3fs

    payload = os.urandom(3 << 20)
    real_get_file = s3fs.S3FileSystem.get_file
    both_fetched = threading.Barrier(2, timeout=10)

    def get_file(self, rpath, lpath, **kw):  # both downloads are in flight before either lands
        out = real_get_file(self, rpath, lpath, **kw)
        with contextlib.suppress(threading.BrokenBarrierError):
            both_fetched.wait()
        return out

    monkeypatch.setattr(s3fs.S3FileSystem, "get_file", get_file)
    mirror = tmp_path / "mirror"
    with s3_server() as bucket:
        _put("run/activations/m/0/acts.npy", payload)
        results, errors = [], []

        def trial():
            try:
                sync_down(f"{bucket}/run", mirror, "activations")
                results.append((mirror / "activations" / "m" / "0" / "acts.npy").read_bytes())
            except Exception as err:  # noqa: BLE001 - reported below
                errors.append(err)

        threads = [threading.Thread(target=trial) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len(results) == 2 and all(r == payload for r in results)
        assert [p.name for p in (mirror / "activations" / "m" / "0").iterdir()] == ["acts.npy"]


def test_a_deleted_prefix_starts_over_instead_of_resurrecting_the_mirror(tmp_path, monkeypatch):
    """The user deletes the run prefix to start over: the old mirror is wiped, nothing old goes back up."""
    monkeypatch.setenv("RAYBENCH_CACHE", str(tmp_path / "cache"))
    with s3_server() as bucket:
        uri = f"{bucket}/runs/again"
        mirror = local_mirror(uri)
        sync_down(uri, mirror)  # the run starts: a new prefix
        (mirror / "cells" / "old").mkdir(parents=True)
        (mirror / "cells" / "old" / "metrics.json").write_text("{}")
        sync_up(mirror, uri)
        assert "runs/again/cells/old/metrics.json" in _keys("runs/again/")

        _s3().delete_objects(Bucket="raybench-test",
                             Delete={"Objects": [{"Key": k} for k in _keys("runs/again/")]})
        sync_down(uri, mirror)  # the next run at the same URI, on the same node
        assert not (mirror / "cells" / "old").exists()
        (mirror / "cells" / "new").mkdir(parents=True)
        (mirror / "cells" / "new" / "metrics.json").write_text("{}")
        sync_up(mirror, uri)
        cells = {k for k in _keys("runs/again/") if "/cells/" in k}
        assert cells == {"runs/again/cells/new/metrics.json"}

        other = tmp_path / "other-node"  # a node whose mirror is of the deleted incarnation
        (other / "cells" / "old").mkdir(parents=True)
        (other / "cells" / "old" / "metrics.json").write_text("{}")
        (other / ".raybench-sync.json").write_text('{"stamp": "an earlier run", "files": {}}')
        with pytest.raises(StorageError, match="earlier run"):
            sync_up(other, uri)
        assert sync_down(uri, other) == 1
        assert not (other / "cells" / "old").exists() and (other / "cells" / "new" / "metrics.json").exists()
