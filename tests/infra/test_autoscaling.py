"""The cluster path under Ray's real autoscaler, on this machine: cluster/local.yaml (Ray's fake multi-node provider,
the file a user rehearses with before paying for a cloud) started with `ray start --autoscaling-config`, a head
without GPUs and GPU workers from zero; `raybench grid` attached to it must make the autoscaler add GPU workers,
resolve `auto` to a GPU share from the node types before any GPU exists, run its encoder actors and trials on the
added workers, and leave them idle so the autoscaler removes them.

This is what `ray.cluster_utils.AutoscalingCluster.start` runs (`RAY_FAKE_CLUSTER=1 ray start --head
--autoscaling-config=...`, AUTOSCALER_UPDATE_INTERVAL_S=1), without the class: in Ray 2.60 it builds its config
from fake_multi_node/example.yaml, which the wheel does not ship, and its start and shutdown run
`ray stop --force`, which ends every Ray on the machine (the session `ray_cluster` and other tests' too). The
cluster lives in its own process group and temp dir instead, killed by group; the drivers are subprocesses, this
file run as a script for the probe.
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
import tempfile
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # when run as the probe script
    sys.path.insert(0, str(ROOT))

LOCAL_YAML = ROOT / "cluster" / "local.yaml"
README = ROOT / "cluster" / "README.md"
GPU_TYPE = "gpu_worker"
IDLE_WAIT_S = 150  # idle_timeout_minutes (0.25) + the autoscaler's rounds + node shutdown, on 2 loaded cores


def _local_config() -> dict:
    return yaml.safe_load(LOCAL_YAML.read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the file a user starts

def test_local_yaml_is_a_fake_multinode_config_with_gpu_workers_from_zero():
    jsonschema = pytest.importorskip("jsonschema")
    import ray.autoscaler

    cfg = _local_config()
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    assert cfg["provider"]["type"] == "fake_multinode"
    # Ray's monitor uses the file as written (the fake provider ships no defaults file to fill it out)
    for key in ("file_mounts", "cluster_synced_files", "worker_setup_commands", "worker_start_ray_commands", "auth"):
        assert key in cfg, f"local.yaml lacks {key}: Ray's monitor reads it"
    types = cfg["available_node_types"]
    head = types[cfg["head_node_type"]]
    assert cfg["head_node_type"] == "ray.head.default", "the fake provider names its head ray.head.default"
    assert not head["resources"].get("GPU") and head["max_workers"] == 0, "no trial may fit the head"
    gpu = types[GPU_TYPE]
    assert gpu["min_workers"] == 0 and gpu["max_workers"] >= 1 and gpu["resources"]["GPU"] >= 1
    assert gpu["resources"]["CPU"] >= 2, "a trial (1 CPU) beside an encoder actor's loading task"


def _readme_section() -> str:
    parts = README.read_text().split("## Rehearse on a laptop: cluster/local.yaml", 1)
    assert len(parts) == 2, "cluster/README.md lacks the section 'Rehearse on a laptop: cluster/local.yaml'"
    return parts[1].split("\n## ", 1)[0]


def _rehearsal_yaml() -> dict:
    """The run config the README's rehearsal submits (its one yaml block)."""
    return yaml.safe_load(_readme_section().split("```yaml\n", 1)[1].split("```", 1)[0])


def test_readme_gives_the_commands_and_the_run_this_file_runs(tmp_path):
    from raybench.core.config import load_run_config

    body = _readme_section()
    head = _local_config()["available_node_types"]["ray.head.default"]["resources"]
    start = (f"RAY_FAKE_CLUSTER=1 ray start --head --num-cpus={head['CPU']} --num-gpus={head.get('GPU', 0)} "
             "--dashboard-host=127.0.0.1 --autoscaling-config=cluster/local.yaml")
    assert start in " ".join(body.replace("\\\n", " ").split()), f"the README must show: {start}"
    for command in ("RAY_ADDRESS=127.0.0.1:6379 raybench grid --config rehearsal.yaml", "ray status", "ray stop",
                    "export RAY_AUTH_MODE=token"):
        assert command in body
    raw = _rehearsal_yaml()
    assert Path(raw["run_dir"]).is_absolute(), "every node reads and writes the same run_dir: absolute"
    (tmp_path / "rehearsal.yaml").write_text(yaml.safe_dump(raw))
    cfg = load_run_config(tmp_path / "rehearsal.yaml")
    assert cfg.encoders.num_gpus == "auto" and cfg.resources.trial_gpus == "auto", "the rehearsal is of auto shares"
    assert len(cfg.protocol.grid.models) == 1


# ---------------------------------------------------------------- the rehearsal

def _start_head(cfg_path: Path, env: dict, gcs: int) -> int:
    """`ray start --head` with cluster/local.yaml's head resources and its autoscaler, in a new session;
    returns the process group every process of the cluster (fake workers included) stays in."""
    head = _local_config()["available_node_types"]["ray.head.default"]["resources"]
    proc = subprocess.Popen(
        ["ray", "start", "--head", "--disable-usage-stats", "--node-ip-address=127.0.0.1", f"--port={gcs}",
         f"--num-cpus={head['CPU']}", f"--num-gpus={head.get('GPU', 0)}", f"--autoscaling-config={cfg_path}",
         "--include-dashboard=false", f"--dashboard-port={_free_port()}", f"--ray-client-server-port={_free_port()}",
         f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
         f"--metrics-export-port={_free_port()}", f"--runtime-env-agent-port={_free_port()}",
         f"--object-store-memory={100 << 20}"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        out = "(timed out after 180 s)"
    if proc.returncode != 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"ray start --head failed:\n{out[-3000:]}")
    return proc.pid


def _run(args: list[str], env: dict, timeout: float, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_grid_makes_rays_autoscaler_add_gpu_workers_from_zero_and_remove_them(tmp_path):
    from raybench.core.paths import RunLayout

    tmp = Path(tempfile.mkdtemp(prefix="rbas", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    gcs = _free_port()
    cfg = _local_config()
    cfg["provider"]["gcs_address"] = f"127.0.0.1:{gcs}"  # where the fake workers join (default: port 6379)
    cfg_path = tmp / "local.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    token = secrets.token_hex(16)
    # no usage stats (Ray Data's collection actor: a worker process of its own) and no prestarted workers (on
    # every node, the fake workers inherit the head's environment: workers start when a task or actor needs one)
    env = {**os.environ, "RAY_TMPDIR": str(tmp), "RAY_ADDRESS": "", "RAY_FAKE_CLUSTER": "1",
           "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_prestart_worker_first_driver": "0", "RAY_enable_worker_prestart": "0"}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "rehearsal.yaml").write_text(yaml.safe_dump({**_rehearsal_yaml(), "run_dir": str(run_dir)}))
    driver_env = {**env, "RAY_ADDRESS": f"127.0.0.1:{gcs}"}
    pgid = probe = None
    try:
        t0 = time.perf_counter()
        pgid = _start_head(cfg_path, env, gcs)
        started = time.perf_counter() - t0
        # the probe watches while the grid runs: a worker left idle for idle_timeout_minutes is removed (and then
        # lists no resources) before the grid ends when the grid is quick, or before a probe started after it is up
        out, done = tmp_path / "probe.json", tmp_path / "grid.done"
        with open(tmp_path / "probe.log", "w") as log:  # a file: nobody reads a pipe while the grid runs
            probe = subprocess.Popen([sys.executable, __file__, "probe", str(out), str(done)], cwd=tmp_path,
                                     env=driver_env, stdout=log, stderr=subprocess.STDOUT)
        grid = _run(["-m", "raybench.app.cli", "grid", "--config", "rehearsal.yaml"], driver_env, 420, tmp_path)
        grid_s = time.perf_counter() - t0 - started
        done.touch()
        assert grid.returncode == 0, grid.stdout[-4000:] + grid.stderr[-4000:]
        probe.wait(timeout=IDLE_WAIT_S + 60)
        assert probe.returncode == 0 and out.exists(), (tmp_path / "probe.log").read_text()[-3000:]
        info = json.loads(out.read_text())
        monitor_log = "".join(p.read_text(errors="replace") for p in tmp.glob("ray/session_*/logs/monitor.*"))
    finally:
        if probe is not None and probe.poll() is None:
            probe.kill()
            probe.wait()
        if pgid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        shutil.rmtree(tmp, ignore_errors=True)

    workers = info["workers"]  # every node but the head
    assert workers, f"the autoscaler added no worker: {info['nodes']}"
    # a worker the autoscaler removed as idle before the probe saw it alive (it looks every 2 s) lists no resources:
    # the type of those is the monitor's, below
    listed = [w["resources"] for w in workers.values() if w["resources"]]
    assert listed and all(r.get("GPU") == 1 for r in listed), f"the added workers are GPU workers: {info['nodes']}"
    assert f"type {GPU_TYPE}" in monitor_log or f"'{GPU_TYPE}'" in monitor_log, "the monitor launched no GPU worker"

    resolved = json.loads(RunLayout.at(run_dir).resources_resolved.read_text())
    enc, trial = resolved["encode"]["csfm"], resolved["train"]["trial"]
    max_gpus = _local_config()["available_node_types"][GPU_TYPE]["max_workers"]
    # resolved while only the head was up: the GPUs counted are those of the node types, not of running nodes
    assert enc["cluster_gpus"] == max_gpus and 0 < enc["gpus"] < 1, enc
    assert 0 < trial["gpus"] < 1, trial

    table_nodes = {json.loads((Path(d) / "metrics.json").read_text())["node_id"] for d in _cell_dirs(run_dir)}
    assert len(table_nodes) and table_nodes <= set(workers), f"trials ran off the GPU workers: {table_nodes}"
    encoders = [a for a in info["actors"] if "MapWorker" in a["class"] or "Encoder" in a["class"]]
    assert encoders, f"no encoder actor in the actor table: {sorted({a['class'] for a in info['actors']})}"
    assert {a["node"] for a in encoders} <= set(workers), "encoder actors ran on the head"
    assert info["idle_removed_s"] is not None, f"idle workers still up after {IDLE_WAIT_S} s: {info['alive']}"
    print(f"\nhead up {started:.0f} s; grid {grid_s:.0f} s on {len(workers)} added GPU worker(s); idle workers "
          f"gone {info['idle_removed_s']:.0f} s after the grid")


def _cell_dirs(run_dir: Path) -> list[str]:
    import pandas as pd

    from raybench.core.paths import RunLayout

    table = pd.read_parquet(RunLayout.at(run_dir).cells_table)
    assert len(table) == 2 and (table["status"] == "ok").all(), table[["cell_id", "status"]]
    return [str(Path(run_dir) / d) if not Path(d).is_absolute() else d for d in table["cell_dir"]]


def _probe(out_path: str, done_path: str) -> None:
    """Driver, started with the grid: the resources of every node seen alive while the grid runs; once it is done
    (`done_path` exists), the nodes that ever joined, the actors that ran (class, node), then the wait until only the
    head is alive (the idle workers removed) or IDLE_WAIT_S passed."""
    import ray
    from ray._private.state import actors

    ray.init(log_to_driver=False)  # RAY_ADDRESS
    seen: dict[str, dict] = {}  # node id -> its resources while alive (a dead node lists none)

    def look() -> list[dict]:
        nodes = ray.nodes()
        for n in nodes:
            if n["Alive"] and n["Resources"]:
                seen.setdefault(n["NodeID"], n["Resources"])
        return nodes

    deadline = time.time() + 600
    while not Path(done_path).exists() and time.time() < deadline:
        look()
        time.sleep(2)
    t0 = time.time()
    nodes = look()
    head = next(n["NodeID"] for n in nodes if "node:__internal_head__" in n["Resources"])
    info = {"head": head, "nodes": [{k: n[k] for k in ("NodeID", "Alive", "Resources")} for n in nodes],
            "workers": {n["NodeID"]: {"resources": seen.get(n["NodeID"], {})} for n in nodes if n["NodeID"] != head},
            "actors": [{"class": a["ActorClassName"], "node": a["Address"]["NodeID"]} for a in actors().values()],
            "idle_removed_s": None, "alive": []}
    while time.time() - t0 < IDLE_WAIT_S:
        info["alive"] = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        if info["alive"] == [head]:
            info["idle_removed_s"] = time.time() - t0
            break
        time.sleep(2)
    Path(out_path).write_text(json.dumps(info))
    ray.shutdown()


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "probe":
    _probe(sys.argv[2], sys.argv[3])
