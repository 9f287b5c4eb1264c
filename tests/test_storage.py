"""Run folders on a real S3-compatible server (moto on loopback) and preflight write checks."""

from __future__ import annotations

import os

import pytest

from raybench.storage import StorageError, check_writable, is_remote, local_mirror, sync_down, sync_up
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
