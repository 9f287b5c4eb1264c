"""One writer per run folder: a second `raybench grid` / `train` on a folder (or s3:// prefix) in use refuses."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raybench.infra.run_lock import LOCK_NAME, RunLocked, S3Lease, run_lock
from tests.small_run import small_config

ROOT = Path(__file__).resolve().parents[2]

HOLDER = """
import sys
from raybench.infra.run_lock import run_lock

with run_lock(sys.argv[1], "grid"):
    print("held", flush=True)
    sys.stdin.readline()  # until the test lets go
"""


class Holder:
    """Another process holding the run's lock, as a concurrent `raybench grid` would."""

    def __init__(self, run_dir: str | Path):
        self.proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(HOLDER), str(run_dir)], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.strip() == "held", line

    def release(self) -> None:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.wait(timeout=60) == 0


def test_a_second_grid_on_a_folder_in_use_refuses_naming_the_holder(tmp_path):
    from raybench.app.pipeline import run_pipeline

    cfg = small_config(tmp_path / "run")
    holder = Holder(cfg.run_dir)
    try:
        with pytest.raises(RunLocked) as err:
            run_pipeline(cfg, until="cohort")  # Ray-free: without the lock it would run the cohort stage
        text = str(err.value)
        assert str(Path(cfg.run_dir).resolve()) in text and f"pid {holder.proc.pid}" in text
        assert socket.gethostname() in text and "started 20" in text
        assert f"delete {Path(cfg.run_dir).resolve() / LOCK_NAME}" in text
        assert not (Path(cfg.run_dir) / "cohort").exists() and not (Path(cfg.run_dir) / "run.yaml").exists()
    finally:
        holder.release()
    assert not (Path(cfg.run_dir) / LOCK_NAME).exists(), "the holder released its lock"
    run_pipeline(cfg, until="cohort")  # free again
    assert not (Path(cfg.run_dir) / LOCK_NAME).exists(), "released after the run"


def test_a_second_train_on_a_folder_in_use_refuses(tmp_path):
    from raybench.sae.grid import run_grid

    cfg = small_config(tmp_path / "run")
    holder = Holder(cfg.run_dir)
    try:
        with pytest.raises(RunLocked, match="in use by `raybench grid`"):
            run_grid(cfg)
    finally:
        holder.release()


def test_a_lock_whose_process_is_gone_is_taken_over_and_the_lock_is_reentrant_and_released_on_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "command": "grid",
                                             "started": "2026-01-01T00:00:00+00:00", "token": "x"}))
    with pytest.raises(ValueError, match="boom"), run_lock(run):
        held = json.loads((run / LOCK_NAME).read_text())
        assert held["pid"] == os.getpid()
        with run_lock(str(run) + "/", "train"):  # the train stage inside `raybench grid`
            assert (run / LOCK_NAME).exists()
        assert (run / LOCK_NAME).exists(), "the outer holder still holds it"
        raise ValueError("boom")
    assert not (run / LOCK_NAME).exists()


def test_a_lock_of_another_host_is_not_taken_over(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 1, "command": "train",
                                             "started": "2026-01-01T00:00:00+00:00", "token": "x"}))
    with pytest.raises(RunLocked, match="on host elsewhere, pid 1"), run_lock(run):
        pass
    assert (run / LOCK_NAME).exists()


def test_an_s3_prefix_in_use_refuses_while_its_lease_is_refreshed_and_is_taken_over_once_expired():
    from tests.s3_server import s3_server

    with s3_server() as bucket:
        uri = f"{bucket}/runs/a"
        first = S3Lease(uri, "grid", lease_s=2.0, refresh_s=0.3)
        first.acquire()
        try:
            time.sleep(3.0)  # longer than the lease: only the refresh keeps it
            with pytest.raises(RunLocked, match=rf"{uri} is in use by `raybench grid` on host"):
                S3Lease(uri, "train").acquire()
            with pytest.raises(RunLocked, match=f"delete {uri}/{LOCK_NAME}"), run_lock(uri, "train"):
                pass
        finally:
            first.release()
        with run_lock(uri, "train"):  # released: free again
            pass
        import boto3

        s3 = boto3.client("s3")
        key = f"runs/a/{LOCK_NAME}"
        assert s3.list_objects_v2(Bucket=bucket.removeprefix("s3://"), Prefix=key).get("KeyCount") == 0

        stale = S3Lease(uri, "grid", lease_s=1.0, refresh_s=60)  # a driver that died: no refresh
        stale.acquire()
        stale._stop.set()
        time.sleep(2.5)  # past the lease by the store's clock, whose timestamps are whole seconds
        taker = S3Lease(uri, "train")
        taker.acquire()
        taker.release()
        stale.release()  # too late: the lease is no longer its own, nothing is deleted


# ---------------------------------------------------------------- every writer takes the lock

WRITERS = {  # command -> its arguments on the run folder R (O: a second run, for compare)
    "analyze": ["analyze", "--run-dir", "R"],
    "report": ["report", "--run-dir", "R"],
    "encode": ["encode", "--run-dir", "R"],
    "compare": ["compare", "R", "O"],
    "features": ["features", "--run-dir", "R", "--model", "ecg_fm", "--concept", "qrs_duration"],
    "provenance": ["provenance", "--run-dir", "R"],
    "reliability": ["reliability", "--run-dir", "R"],
}


@pytest.fixture(scope="module")
def live_pid():
    """A live process of this host other than the test's: the holder a planted lock names."""
    proc = subprocess.Popen(["sleep", "300"])
    time.sleep(0.05)
    yield proc.pid
    proc.kill()
    proc.wait()


def _hold(run: Path, pid: int) -> None:
    import datetime

    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    (run / LOCK_NAME).write_text(json.dumps({"host": socket.gethostname(), "pid": pid, "command": "grid",
                                             "started": started, "token": "x"}))


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_every_command_that_writes_into_a_run_is_refused_while_another_holds_its_lock(tmp_path, live_pid, command):
    from click.testing import CliRunner

    from raybench.app.cli import main

    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    _hold(run, live_pid)
    args = [str(run) if a == "R" else str(other) if a == "O" else a for a in WRITERS[command]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert "in use by `raybench grid`" in result.output and f"pid {live_pid}" in result.output
    assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME], "nothing written while the lock is held"


def test_a_command_writing_outside_every_run_takes_no_lock(tmp_path):
    from raybench.infra.run_lock import run_holding

    run_a, run_b = tmp_path / "a", tmp_path / "b"
    assert run_holding(run_a / "compare" / "b", (run_a, run_b)) == str(run_a)
    assert run_holding(run_b / "x", (run_a, run_b)) == str(run_b)
    assert run_holding(tmp_path / "elsewhere", (run_a, run_b)) is None
    assert run_holding(tmp_path / "a-sibling", (run_a, "s3://bucket/a")) is None


def test_two_processes_taking_over_one_empty_stale_lock_do_not_both_hold_it(tmp_path, monkeypatch):
    """B judged the empty lock (a writer killed between create and write) stale; before B moves it aside, A takes
    it over and creates its own lock, still empty. Content alike, so B must tell the files apart (inode, mtime)."""
    from raybench.infra.run_lock import LocalLock

    run = tmp_path / "run"
    run.mkdir()
    lock = run / LOCK_NAME
    lock.write_text("")
    old = time.time() - 120
    os.utime(lock, (old, old))  # stale: empty and older than a minute
    real_rename = os.rename
    raced = []

    def rename(src, dst):
        if not raced and Path(src) == lock:  # process A, between B's judgement and B's rename
            lock.unlink()
            os.close(os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            raced.append(os.stat(lock).st_ino)
        return real_rename(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(RunLocked, match="in use by an unreadable holder"):
        LocalLock(run, "grid").acquire()
    monkeypatch.undo()
    assert raced and lock.exists() and os.stat(lock).st_ino == raced[0], "A's lock is back in place"
    assert [p.name for p in run.iterdir()] == [LOCK_NAME], "nothing left aside"
