"""Laptop -> cluster, end to end: `raybench submit` (the real Ray Jobs client) to a cluster started with
`ray start --head` (token auth on, dashboard on loopback), running `raybench grid` with an `s3://` run folder
on a real S3-compatible server (moto on loopback); then `status`, `logs`, `stop`.

One node, whose 2 CPUs hold the whole grid: the path under test is the job's and the bucket's, not where its parts
run. Worker nodes joining a token-auth head, and trials on nodes other than the driver's, are
tests/infra/test_autoscaling.py's (Ray's autoscaler adds them) and tests/sae/test_grid_elastic.py's.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from raybench.core.analysis_config import SecondaryConfig
from raybench.core.config import dump_run_config
from tests.s3_server import s3_server
from tests.small_run import small_config

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_start(args: list[str], env: dict) -> int:
    """`ray start ...` in a new session; returns the process group its daemons stay in."""
    proc = subprocess.Popen(["ray", "start", "--disable-usage-stats", "--node-ip-address=127.0.0.1",
                             f"--dashboard-agent-listen-port={_free_port()}",
                             f"--dashboard-agent-grpc-port={_free_port()}",
                             f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
                             f"--object-store-memory={100 << 20}", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out, _ = proc.communicate(timeout=180)
    if proc.returncode != 0:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out[-3000:]}")
    return proc.pid


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """moto S3 + a head (2 CPUs), token auth on."""
    import ray._private.utils

    dep_error = ray._private.utils.get_dashboard_dependency_error()
    assert dep_error is None, f"Ray Jobs needs the dashboard: pip install 'ray[default]==2.60.0' ({dep_error})"
    from tests.sae.test_grid_elastic import ray_env

    tmp = tmp_path_factory.mktemp("remote")
    token = secrets.token_hex(16)
    with s3_server() as bucket:
        # no usage stats (Ray Data's collection actor: a worker process of its own), no workers prestarted for
        # the first driver (a submitted job's tasks need workers with its working_dir: those stay idle)
        env = {**ray_env(), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
               "RAYBENCH_CACHE": str(tmp / "node-cache"), "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_prestart_worker_first_driver": "0"}
        gcs, dash = _free_port(), _free_port()
        groups = []
        try:
            groups.append(_ray_start(["--head", f"--port={gcs}", "--num-cpus=2", "--num-gpus=0",
                                      "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                                      f"--dashboard-port={dash}", f"--ray-client-server-port={_free_port()}"], env))
            # the laptop side: only the address and the token, a private HOME (last-job file)
            client_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
            client_env.update(HOME=str(tmp / "home"), RAY_AUTH_TOKEN=token)
            (tmp / "home").mkdir()
            yield {"address": f"http://127.0.0.1:{dash}", "bucket": bucket, "env": client_env, "tmp": tmp,
                   "token": token}
        finally:
            for pgid in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
            shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


def _raybench(cluster, *args: str, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raybench.app.cli", *args], cwd=cluster["tmp"],
                          env=env or cluster["env"], capture_output=True, text=True, timeout=timeout)


def _tiny_config(run_dir: str):
    """2 cells (1 model x 1 depth x 2 E, the fewest the common-scale AUC takes, x 1 seed) in one Tune trial
    (trial_unit model: its process adopts the driver's lease and uploads its cells to the bucket as each trial's
    would; several trials spread over nodes are tests/sae/test_grid_elastic.py's and tests/infra/test_autoscaling.py's),
    from a fresh synthetic cohort of 48 records of 24 patients (each of its files is a lease check and an upload to
    the bucket; its training split holds 38, SAE batches of 32 fit it); no feature dashboards or secondary analyses,
    and one bootstrap chunk of each kind (the path under test is the submitted job's and the bucket's, not the
    analyses': tests/app/test_pipeline.py's finished run has them)."""
    cfg = small_config(Path("unused"), models=("csfm",), steps=40)
    p = cfg.protocol
    return replace(cfg, run_dir=run_dir,
                   protocol=replace(p, grid=replace(p.grid, depths=(1.0,), expansions=(1, 4), seeds=(4311,),
                                                     sensitivity_depth=None),
                                    sae=replace(p.sae, batch_size=32),
                                    inference=replace(p.inference, patient_draws=100, crossed_draws=100)),
                   cohort=replace(cfg.cohort, records=48, patients=24),
                   resources=replace(cfg.resources, trial_unit="model", max_failures=2),
                   features=replace(cfg.features, enabled=False), secondary=SecondaryConfig(analyses=())).validate()


@pytest.mark.slow
def test_submit_runs_the_grid_on_the_cluster_with_an_s3_run_folder(cluster):
    import s3fs

    run_uri = f"{cluster['bucket']}/runs/tiny"
    wd = cluster["tmp"] / "job"
    wd.mkdir()
    (wd / "run.yaml").write_text(dump_run_config(_tiny_config(run_uri)))
    t0 = time.perf_counter()
    sub = _raybench(cluster, "submit", "--address", cluster["address"], "--working-dir", str(wd), "--",
                    "grid", "--config", "run.yaml", "--trust-config-destinations")
    wall = time.perf_counter() - t0
    assert sub.returncode == 0, sub.stdout[-4000:] + sub.stderr[-4000:]
    job_id = sub.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    assert f"{job_id}: SUCCEEDED" in sub.stdout
    assert "[5/5] analyze   done" in sub.stdout and "2/2 cells ok" in sub.stdout
    assert f"report: {run_uri}/report.html" in sub.stdout, "the final line names the run URI"

    status = _raybench(cluster, "status", "--address", cluster["address"])  # the last submitted job
    assert status.returncode == 0 and f"{job_id}: SUCCEEDED" in status.stdout, status.stderr[-2000:]
    logs = _raybench(cluster, "logs", "--address", cluster["address"], job_id)
    assert logs.returncode == 0 and "[4/5] train" in logs.stdout and "audit: 2/2 cells" in logs.stdout

    fs = s3fs.S3FileSystem()
    root = run_uri.removeprefix("s3://")
    for rel in ("tables/cells.parquet", "report.html", "run.yaml", "manifest/manifest.parquet"):
        assert fs.exists(f"{root}/{rel}"), f"{rel} missing in the bucket"
    assert fs.glob(f"{root}/activations/csfm/*/index.json")
    assert fs.glob(f"{root}/tune/grid-*/experiment_state-*.json"), "Tune state lives in the bucket"
    with fs.open(f"{root}/tables/cells.parquet", "rb") as fh:
        table = pd.read_parquet(fh)
    assert len(table) == 2 and (table["status"] == "ok").all() and table["cell_id"].is_unique
    nodes = {json.loads(fs.cat(f"{root}/{cell}/metrics.json"))["node_id"] for cell in table["cell_dir"]}
    assert all(nodes), nodes
    print(f"\nsubmit -> SUCCEEDED in {wall:.1f} s; cells trained on {len(nodes)} node(s)")


def _job_state(cluster, job_id: str) -> str:
    """The job's status from the dashboard's Jobs API, read with the token in this process."""
    import urllib.request

    req = urllib.request.Request(f"{cluster['address']}/api/jobs/{job_id}",
                                 headers={"Authorization": f"Bearer {cluster['token']}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.load(resp)["status"]


@pytest.mark.slow
def test_stop_and_a_wrong_token(cluster):
    wd = cluster["tmp"] / "job-stop"
    wd.mkdir()
    (wd / "run.yaml").write_text(dump_run_config(_tiny_config(f"{cluster['bucket']}/runs/stopped")))
    sub = _raybench(cluster, "submit", "--no-wait", "--address", cluster["address"], "--working-dir", str(wd), "--",
                    "grid", "--config", "run.yaml", "--trust-config-destinations")
    assert sub.returncode == 0, sub.stderr[-3000:]
    job_id = sub.stdout.split("submitted ", 1)[1].split(":", 1)[0]
    stop = _raybench(cluster, "stop", "--address", cluster["address"])
    assert stop.returncode == 0 and job_id in stop.stdout
    deadline = time.time() + 120  # waited for through the Jobs API (a `raybench status` process per poll costs
    while time.time() < deadline and _job_state(cluster, job_id) != "STOPPED":  # ~0.5 CPU-s), then shown by it
        time.sleep(0.5)
    status = _raybench(cluster, "status", "--address", cluster["address"], job_id)
    assert f"{job_id}: STOPPED" in status.stdout, status.stdout + status.stderr[-2000:]

    bad = _raybench(cluster, "status", "--address", cluster["address"], job_id,
                    env={**cluster["env"], "RAY_AUTH_TOKEN": "not-the-token"})
    assert bad.returncode != 0 and "token" in (bad.stdout + bad.stderr).lower()
