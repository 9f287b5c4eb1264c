"""The s3:// run lease (raybench.infra.s3_lease) against moto's S3 server: a holder that lost its lease stops
uploading, and expiry is judged by the store's clock, never a local one."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from raybench.infra.run_lock import LOCK_NAME, S3Lease, run_lock
from raybench.infra.s3_lease import LeaseLost
from raybench.infra.storage import sync_up
from tests.s3_server import s3_server

TAKER = """
import sys
from raybench.infra.run_lock import S3Lease

S3Lease(sys.argv[1], "grid").acquire()  # a second machine's run: it keeps the lease it took (no release)
print("took")
"""


@pytest.fixture(scope="module")
def bucket():
    with s3_server() as uri:
        yield uri


def _objects(bucket: str, prefix: str) -> list[str]:
    import boto3

    listed = boto3.client("s3").list_objects_v2(Bucket=bucket.removeprefix("s3://"), Prefix=prefix)
    return sorted(o["Key"] for o in listed.get("Contents", []))


@pytest.fixture
def short_lease(monkeypatch):
    """A 2 s lease (refreshed every 0.3 s), so the tests need not sleep past 120 s."""
    import raybench.infra.s3_lease as s3_lease

    monkeypatch.setattr(s3_lease, "LEASE_S", 2.0)
    monkeypatch.setattr(s3_lease, "REFRESH_S", 0.3)


def test_a_holder_that_slept_past_its_lease_and_lost_it_stops_before_its_next_upload(bucket, tmp_path, short_lease):
    uri = f"{bucket}/runs/sleeper"
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "cells.csv").write_text("cell_id\nx\n")
    with run_lock(uri, "grid"):
        from raybench.infra.s3_lease import _leases

        holder = _leases[uri]
        holder._stop.set()  # the laptop sleeps: its refresh thread no longer runs
        holder._thread.join()
        time.sleep(3.5)  # past the lease by the store's clock (whole seconds)
        took = subprocess.run([sys.executable, "-c", TAKER, uri], capture_output=True, text=True, timeout=120)
        assert took.stdout.strip() == "took", took.stderr  # the lease expired: a second machine took it over
        with pytest.raises(LeaseLost, match=rf"lost the lease on {uri} \(taken over by another run\)"):
            sync_up(tmp_path, uri)  # the sleeper wakes and would upload its tables
        assert _objects(bucket, "runs/sleeper/") == [f"runs/sleeper/{LOCK_NAME}"], "nothing was uploaded"


def test_a_live_holder_keeps_uploading_and_a_lease_it_slept_past_untaken_is_refreshed(bucket, tmp_path, short_lease):
    uri = f"{bucket}/runs/napper"
    (tmp_path / "a.txt").write_text("a")
    with run_lock(uri, "grid"):
        from raybench.infra.s3_lease import _leases

        holder = _leases[uri]
        holder._stop.set()
        holder._thread.join()
        time.sleep(3.5)  # expired, but nobody took it over: still this run's
        before = holder.etag
        assert sync_up(tmp_path, uri) == 1
        assert holder.etag != before, "refreshed (conditionally) before the upload"
    assert LOCK_NAME not in " ".join(_objects(bucket, "runs/napper/")), "released after the run"
    assert "runs/napper/a.txt" in _objects(bucket, "runs/napper/")


SKEWED_TAKER = """
import sys
import time

real = time.time
time.time = lambda: real() + 300.0  # this machine's clock runs 300 s ahead of the store's and the holder's
from raybench.infra.run_lock import RunLocked, S3Lease

try:
    S3Lease(sys.argv[1], "train").acquire()
except RunLocked as err:
    print("refused:", err)
else:
    print("took")
"""


def test_a_machine_whose_clock_runs_300_s_ahead_does_not_take_over_a_live_lease(bucket):
    uri = f"{bucket}/runs/skew"
    first = S3Lease(uri, "grid", refresh_s=60)
    first.acquire()
    try:
        out = subprocess.run([sys.executable, "-c", SKEWED_TAKER, uri], capture_output=True, text=True, timeout=120)
        assert out.stdout.startswith(f"refused: the run folder {uri} is in use by `raybench grid`"), out
        first.check()  # still the first run's
    finally:
        first.release()
    assert _objects(bucket, "runs/skew/") == []


def test_a_worker_uploading_for_the_driver_checks_the_drivers_token(bucket):
    from raybench.infra.s3_lease import _verify_adopted

    uri = f"{bucket}/runs/worker"
    driver = S3Lease(uri, "grid", refresh_s=60)
    driver.acquire()
    try:
        _verify_adopted(uri, driver.holder["token"])  # still the driver's: the worker goes on
        with pytest.raises(LeaseLost, match="taken over by another run"):
            _verify_adopted(uri, "another-token")
    finally:
        driver.release()
    with pytest.raises(LeaseLost, match=r"\(deleted\)"):
        _verify_adopted(uri, driver.holder["token"])
