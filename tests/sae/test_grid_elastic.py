"""Elasticity and faults on real Ray clusters: nodes added and killed mid-grid, a SIGKILLed driver,
retries exhausted, unwritable outputs.

Multi-node scenarios run in their own driver process (this file run as a script, see `__main__`), so
they never touch the pytest process's Ray; every process they start is killed by process group.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # when run as the scenario driver script
    sys.path.insert(0, str(ROOT))

from raybench.core.config import RunConfig, dump_run_config  # noqa: E402
from raybench.core.paths import RunLayout  # noqa: E402
from tests.small_run import small_config  # noqa: E402

METRICS = ["cell_id", "status", "val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass",
           "test_accessibility", "test_coverage"]
ELASTIC_STEPS = 100  # the add/kill scenario: 4 checkpoint reports per trial keep it running while the worker joins
N_CELLS = 12  # csfm: 2 depths x 2 E x 2 seeds + sensitivity 2 E x 2 seeds; 6 stacks
N_PRIMARY = 8  # without the sensitivity arm: 4 stacks


def elastic_config(run_dir: Path, steps: int = 60, sensitivity: bool = True, **resources) -> RunConfig:
    """One model, 12 cells in 6 one-CPU stack trials (8 in 4 without the sensitivity arm), checkpoints every 20
    steps."""
    cfg = small_config(run_dir, models=("csfm",), steps=steps)
    if not sensitivity:  # the arm's stacks are trials like any other: scenarios about scheduling do not need them
        grid = replace(cfg.protocol.grid, sensitivity_depth=None)
        cfg = replace(cfg, protocol=replace(cfg.protocol, grid=grid))
    res = replace(cfg.resources, trial_unit="stack", trial_cpus=1.0, max_failures=2, **resources)
    return replace(cfg, resources=res).validate()


@pytest.fixture
def encoded(encoded_small_run) -> RunConfig:
    """The session's encoded small run (conftest; both demo encoders, the same cohort and manifest): the scenarios
    train csfm on copies (_fresh), shared with tests/sae/test_grid.py."""
    return encoded_small_run


def _fresh(encoded: RunConfig, dest: Path, **kw) -> RunConfig:
    """A copy of the encoded run folder (no training outputs) under `dest`."""
    shutil.copytree(encoded.run_dir, dest, ignore=shutil.ignore_patterns("cells", "tune", "tables"))
    return elastic_config(dest, **kw)


def _done_cells(layout: RunLayout) -> dict[str, str]:
    """cell_id -> node id of every finished cell folder."""
    out = {}
    if layout.cells_dir.exists():
        for d in layout.cells_dir.iterdir():
            with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
                out[d.name] = json.loads((d / "metrics.json").read_text())["node_id"]
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


_RAY_TMP_DIRS: list[str] = []


@pytest.fixture(autouse=True, scope="module")
def _remove_ray_tmp_dirs():
    yield
    for d in _RAY_TMP_DIRS:
        shutil.rmtree(d, ignore_errors=True)


def ray_env(base: dict | None = None) -> dict[str, str]:
    """Environment for a process that starts its own Ray: a local instance, in a private temp dir.

    Ray records the last started cluster in <temp dir>/ray/ray_current_cluster, and every later
    `ray.init()` on the machine connects there (failing once it is gone); a private RAY_TMPDIR keeps
    these clusters invisible to other processes.
    """
    tmp = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    _RAY_TMP_DIRS.append(tmp)
    return {**(base or os.environ), "RAY_ADDRESS": "", "RAY_TMPDIR": tmp}


def _run_script(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a driver in its own session; whatever it started dies with its process group."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env or ray_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"driver timed out after {timeout} s:\n{out[-4000:]}")
    finally:
        _kill_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


# ---------------------------------------------------------------- multi-node: add and kill a worker

@pytest.mark.slow
def test_added_worker_receives_trials_and_killed_worker_is_retried_elsewhere(encoded, tmp_path):
    # 6 stack trials (keeps the sensitivity arm): with 4 no trial is left for the worker after its first one
    cfg = _fresh(encoded, tmp_path / "run", steps=ELASTIC_STEPS)
    out = tmp_path / "elastic.json"
    proc = _run_script([__file__, "elastic", cfg.run_dir, str(out), str(tmp_path / "hold")], timeout=420)
    assert proc.returncode == 0 and out.exists(), proc.stdout[-4000:]
    info = json.loads(out.read_text())
    assert info["error"] is None, info["error"]

    table = pd.read_parquet(RunLayout.at(cfg.run_dir).cells_table)
    assert len(table) == N_CELLS and table["cell_id"].is_unique
    assert (table["status"] == "ok").all(), table["status"].tolist()
    done = _done_cells(RunLayout.at(cfg.run_dir))
    assert sorted(done) == sorted(table["cell_id"]), "every cell exactly once"
    head, worker = info["head"], info["worker"]
    assert set(done.values()) <= {head, worker}
    assert worker in done.values(), "the node added mid-grid trained no cell"
    assert info["worker_busy_at_kill"], "the worker was not running a trial when it was killed"
    # the worker's trial held after persisting a checkpoint (test hook), so the kill landed mid-training:
    # Tune must have counted the failure, and the retry (on the head, the only node left) finished its cells
    killed = info["killed_trial"]
    assert killed and all(done.get(c) == head for c in killed), (killed, done)
    assert _max_failures_recorded(Path(cfg.run_dir) / "tune") >= 1, "Tune recorded no trial failure"
    assert len(info["done_at_add"]) < N_CELLS, "the worker must join mid-grid"


def _elastic_main(run_dir: str, out_path: str, hold_dir: str) -> None:
    """Driver: head (1 CPU) runs the grid; a worker joins once training started, trains a cell, then its next
    trial holds after a checkpoint (run_grid's hold_dir test hook) and the worker is killed."""
    import ray
    from ray._private.state import available_resources_per_node
    from ray.cluster_utils import Cluster

    from raybench.sae.grid import run_grid

    cfg = elastic_config(Path(run_dir), steps=ELASTIC_STEPS)
    layout = RunLayout.at(run_dir)
    node_args = {"num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "object_store_memory": 80 << 20}
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    ray.init(address=cluster.address, log_to_driver=False)
    info: dict = {"head": ray.get_runtime_context().get_node_id(), "error": None}
    finished = threading.Event()

    def grid() -> None:
        try:
            run_grid(cfg, hold_dir=hold_dir)
        except BaseException as err:  # reported to the test
            info["error"] = repr(err)
        finally:
            finished.set()

    def wait(cond, what: str, deadline: float = 300) -> None:
        t_end = time.time() + deadline
        while not cond():
            if finished.is_set() or time.time() > t_end:
                raise RuntimeError(f"grid ended (or timed out) before: {what}")
            time.sleep(0.1)

    threading.Thread(target=grid, daemon=True).start()
    try:  # cluster changes from the main thread (ray.cluster_utils installs signal handlers)
        wait(lambda: _done_cells(layout) or any(layout.tune_dir.rglob("checkpoint_*")), "training started")
        info["done_at_add"] = sorted(_done_cells(layout))
        worker = cluster.add_node(**node_args)
        info["worker"] = worker.node_id
        wait(lambda: worker.node_id in _done_cells(layout).values(), "the new worker finished a cell")
        Path(hold_dir).mkdir(parents=True, exist_ok=True)
        (Path(hold_dir) / "node_id").write_text(worker.node_id)
        held = Path(hold_dir) / "held.json"
        wait(held.exists, "a trial on the worker held after a checkpoint")
        info["killed_trial"] = json.loads(held.read_text())
        info["worker_busy_at_kill"] = available_resources_per_node().get(worker.node_id, {}).get("CPU", 0) < 1
        info["done_at_kill"] = sorted(_done_cells(layout))
        cluster.remove_node(worker, allow_graceful=False)
        finished.wait(300)
    except RuntimeError as err:
        info["error"] = info["error"] or str(err)
    Path(out_path).write_text(json.dumps(info))
    ray.shutdown()
    os._exit(0)  # the process group (every node of this cluster) is killed by the test


def _max_failures_recorded(tune_dir: Path) -> int:
    """The largest per-trial failure count in Tune's experiment state."""
    counts = [int(n) for state in tune_dir.glob("*/experiment_state-*.json")
              for n in re.findall(r'num_failures\\?"\s*:\s*(\d+)', state.read_text())]
    return max(counts, default=0)


# ---------------------------------------------------------------- SIGKILL of the driver

def _checkpointed_unfinished(layout: RunLayout) -> bool:
    """Some trial has persisted an in-trial checkpoint but not finished its stack (2 seeds) yet."""
    with_checkpoint = {p.parent.name for p in layout.tune_dir.glob("*/*/checkpoint_*")}
    done = _done_cells(layout)
    stacks_done = sum(1 for c in done if c.endswith("-s4311") and c[:-1] + "2" in done)
    return len(with_checkpoint) > stacks_done


@pytest.mark.slow
def test_killed_driver_resumes_only_the_rest_and_matches_an_uninterrupted_run(encoded, tmp_path, ray_cluster,
                                                                             ray_address):
    from raybench.sae.grid import run_grid

    # one reused trial process per driver runs its trials one after another (1 CPU, 1 thread each, as ever): a trial
    # process start per driver, not one per trial
    one_process = {"reuse_trial_processes": True, "max_concurrent_trials": 1}
    # no sensitivity arm: resuming does not depend on a trial's arm (4 stacks, 8 cells); 60 steps: checkpoints at 20, 40
    cfg = _fresh(encoded, tmp_path / "killed", steps=60, sensitivity=False, **one_process)
    layout = RunLayout.at(cfg.run_dir)
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(dump_run_config(cfg))
    # up to train: the claim is about training (analyze after a resume is the same stage as ever, and costs here)
    cmd = [sys.executable, "-m", "raybench.app.cli", "grid", "--config", str(cfg_path), "--until", "train"]
    # both drivers attach to the session's Ray (2 CPUs) as Ray jobs instead of each starting a local instance: a
    # SIGKILLed driver's job ends and Ray kills its trial processes, so the resumed driver finds only what the killed
    # one persisted (its cells and in-trial checkpoints)
    env = {**os.environ, "RAY_ADDRESS": ray_address}

    t0 = time.perf_counter()
    log = tmp_path / "killed_driver.log"  # its output, shown when it did not get as far as the test needs
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and proc.poll() is None:
            if len(_done_cells(layout)) >= 2 and _checkpointed_unfinished(layout):
                break
            time.sleep(0.2)
    finally:
        mid_checkpoint = _checkpointed_unfinished(layout)
        _kill_group(proc)
    t_killed = time.perf_counter() - t0
    deadline = time.time() + 60  # Ray ends the dead driver's job: its trial process is killed, its CPUs come back
    while ray_cluster.available_resources().get("CPU", 0) < 2 and time.time() < deadline:
        time.sleep(0.2)
    assert ray_cluster.available_resources().get("CPU", 0) >= 2, "the killed driver's trials still hold CPUs"
    before = {c: (layout.cell_dir(c) / "metrics.json").stat().st_mtime_ns for c in _done_cells(layout)}
    assert 0 < len(before) < N_PRIMARY, (f"the driver should have been killed mid-grid (after {t_killed:.0f} s, exit "
                                       f"{proc.returncode}); its output ends:\n{log.read_text()[-3000:]}")
    assert mid_checkpoint, "no trial had a checkpoint when the driver was killed"

    t0 = time.perf_counter()
    resumed = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    t_resumed = time.perf_counter() - t0
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    for stage in ("cohort", "manifest", "encode"):
        assert f"{stage:<9} complete, skipped" in resumed.stdout
    after = {c: (layout.cell_dir(c) / "metrics.json").stat().st_mtime_ns for c in _done_cells(layout)}
    assert len(after) == N_PRIMARY
    assert all(after[c] == t for c, t in before.items()), "finished cells were retrained"
    assert "stopped after train" in resumed.stdout and not layout.report.exists()

    ref = _fresh(encoded, tmp_path / "reference", steps=60, sensitivity=False, **one_process)
    # the uninterrupted run trains its 4 stacks in 1 trial (trial_unit model: one per arm; still 1 CPU, 1 thread),
    # in one process: 1 trial process start instead of 4, and the cells must not depend on how stacks are grouped
    # in trials
    ref = replace(ref, resources=replace(ref.resources, trial_unit="model"))
    t0 = time.perf_counter()
    expected = run_grid(ref)
    t_ref = time.perf_counter() - t0
    got = pd.read_parquet(layout.cells_table)
    pd.testing.assert_frame_equal(got[METRICS], expected[METRICS])
    for cell in expected["cell_id"]:  # resume from an in-trial checkpoint gives bit-identical weights
        a = (layout.cell_dir(cell) / "sae.safetensors").read_bytes()
        b = (RunLayout.at(ref.run_dir).cell_dir(cell) / "sae.safetensors").read_bytes()
        assert a == b, f"{cell}: weights differ from the uninterrupted run"
    print(f"\nkilled after {t_killed:.1f} s with {len(before)}/{N_PRIMARY} cells; resumed `raybench grid` "
          f"{t_resumed:.1f} s; uninterrupted run_grid {t_ref:.1f} s")


# ---------------------------------------------------------------- retries exhausted

def test_a_trial_that_exhausts_its_retries_is_failed_in_the_table_and_the_audit(encoded, tmp_path):
    from raybench.analysis.release_audit.run import release_audit
    from raybench.encoders.store import ActivationStore
    from raybench.sae.cells import build_cells, group_trials
    from raybench.sae.grid import run_grid

    cfg = _fresh(encoded, tmp_path / "run", steps=20)
    cfg = replace(cfg, resources=replace(cfg.resources, trial_unit="model", max_failures=0))  # no retry left
    cells = build_cells(cfg.protocol, ActivationStore.for_run(cfg.run_dir).model_dims(cfg.protocol.grid.models))
    primary, sens = group_trials(cells, "model").values()
    markers = tmp_path / "fail-once"
    markers.mkdir()  # the hook fails a trial's first attempt unless its marker exists: only primary fails
    (markers / f"{sens[0][0].stack_id}.failed-once").write_text("pre-armed\n")
    table = run_grid(cfg, fail_once_dir=str(markers))
    failed = table[table["status"] != "ok"]
    n_primary = sum(len(s) for s in primary)
    assert len(table) == N_CELLS and len(failed) == n_primary, "failed cells stay in the table"
    assert failed["status"].str.startswith("failed: ").all()
    assert failed["status"].str.contains("injected failure").all()
    assert set(failed["arm"]) == {"primary"}

    audit = release_audit(cfg.run_dir, cfg.protocol)
    assert not audit.passed and audit.summary.endswith("INCOMPLETE")
    assert audit.primary.expected_cells == n_primary and audit.primary.ok_cells == 0, "kept in the denominator"
    assert sorted(f["cell_id"] for f in audit.primary.failed) == sorted(failed["cell_id"])
    assert all("injected" in f["reason"] for f in audit.primary.failed)
    assert audit.sensitivity is not None and audit.sensitivity.complete
    written = json.loads((RunLayout.at(cfg.run_dir).tables_dir / "audit.json").read_text())
    assert written["passed"] is False and len(written["primary"]["failed"]) == n_primary


# ---------------------------------------------------------------- unwritable outputs

def _grid_cli(run_dir: str, tmp_path: Path, preexec=None, env: dict | None = None) -> subprocess.CompletedProcess:
    cfg = small_config(tmp_path / "unused", models=("csfm",))
    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(dump_run_config(cfg))
    return subprocess.run([sys.executable, "-m", "raybench.app.cli", "grid", "--config", str(cfg_path), "--run-dir",
                           run_dir], cwd=ROOT, env=ray_env(env), capture_output=True,
                          text=True, timeout=120, preexec_fn=preexec)


def test_unwritable_run_dir_fails_before_any_stage(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = _grid_cli(str(blocker / "run"), tmp_path)
    assert proc.returncode != 0
    assert "cannot write to run folder" in proc.stderr and "choose a writable --run-dir" in proc.stderr
    assert str(blocker / "run") in proc.stderr
    assert "[1/5]" not in proc.stdout and "Traceback" not in proc.stderr


def test_a_failing_write_is_caught_before_any_stage(tmp_path):
    """Writes that fail (here: a 0-byte file-size limit, as on a full disk or quota) stop the run up front."""

    def no_writes() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    proc = _grid_cli(str(tmp_path / "run"), tmp_path, preexec=no_writes)
    assert proc.returncode != 0
    assert "cannot write to run folder" in proc.stderr, proc.stderr[-2000:]
    assert "[1/5]" not in proc.stdout and not (tmp_path / "run" / "run.yaml").exists()


def test_unwritable_bucket_fails_before_any_stage(tmp_path):
    from tests.s3_server import s3_server

    with s3_server():
        proc = _grid_cli("s3://no-such-bucket/run", tmp_path, env=dict(os.environ))
    assert proc.returncode != 0
    assert "cannot write to s3://no-such-bucket/run" in proc.stderr, proc.stderr[-2000:]
    assert "[1/5]" not in proc.stdout


if __name__ == "__main__":
    if sys.argv[1] == "elastic":
        _elastic_main(*sys.argv[2:5])
    else:
        raise SystemExit(f"unknown scenario {sys.argv[1]!r}")
