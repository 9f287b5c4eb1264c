"""GPU shares (raybench.infra.resources): the memory estimates and packing by hand, then `auto` on Ray logical GPUs."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from torch import nn

import raybench.infra.resources as rr
from raybench.core.config import ConfigError, EncoderConfig, ResourceConfig, load_run_config, paper_run
from raybench.core.paths import RunLayout
from raybench.sae.grid import run_trial_gpus

GIB = 1 << 30


def test_sae_trial_bytes_by_hand():
    # d 2, N 4, one SAE, B 1, 3 training rows: params 2*2*4 + 4 + 2 = 22 (x4: value, grad, two Adam moments),
    # batch 1 * (3 * 4 + 4 * 2) = 20, data 3 * 2 = 6 -> 88 + 20 + 6 = 114 floats
    assert rr.sae_trial_bytes(2, 4, 1, 1, n_train=3) == 114 * 4
    # the paper's E = 32 stack: d 768, N 24,576, 3 seeds, B 256
    params = 3 * (2 * 768 * 24576 + 24576 + 768)
    assert params == 113_322_240
    batch = 3 * 256 * (3 * 24576 + 4 * 768)
    assert rr.sae_trial_bytes(768, 24576, 3, 256) == 4 * (4 * params + batch) == 2_049_085_440


def test_encoder_bytes_by_hand():
    # 10 weights; batch 2 of 3 input values, each with 32 values of working memory; 2 layers of width 4
    assert rr.encoder_bytes(10, 2, 3, 2, 4) == 4 * (10 + 2 * (3 * 33 + 2 * 4))


def test_packing_fits_usable_memory_and_caps():
    assert rr.per_gpu(1 * GIB, 16 * GIB, 4) == 4  # 12 fit in 12.8 GiB usable, capped at 4
    assert rr.per_gpu(1 * GIB, 16 * GIB, 8) == 8
    assert rr.per_gpu(5 * GIB, 16 * GIB, 4) == 2  # floor(12.8 / 5)
    assert rr.per_gpu(20 * GIB, 16 * GIB, 4) == 1  # does not fit: a whole GPU
    assert rr.per_gpu(0, 16 * GIB, 4) == 4
    assert [rr.share(n) for n in (1, 2, 3, 4)] == [1.0, 0.5, 0.3333, 0.25]
    assert 3 * rr.share(3) <= 1.0 and 7 * rr.share(7) <= 1.0


def test_inventory_memory_from_config_then_accelerator_type_then_assumed():
    cluster = {"CPU": 8.0, "GPU": 3.0, "accelerator_type:H100": 2.0, "accelerator_type:T4": 1.0}
    assert rr.inventory(cluster) == rr.GpuInventory(3.0, 16 * GIB, "accelerator_type:T4")  # the smallest
    assert rr.inventory(cluster, memory_gb=40) == rr.GpuInventory(3.0, 40 * GIB, "resources.gpu_memory_gb")
    assert rr.inventory({"GPU": 1.0, "accelerator_type:XYZ": 1.0}) == rr.GpuInventory(1.0, 16 * GIB, "assumed")
    assert rr.inventory({"CPU": 2.0}).count == 0.0


def test_gpus_the_autoscaler_may_add_count():
    now = {"CPU": 0.0, "memory": 8.0}  # a CPU head; GPU workers scale from zero
    potential = {"CPU": 32.0, "GPU": 4.0, "accelerator_type:A10G": 4.0}
    merged = rr.with_potential(now, potential)
    assert merged == {"CPU": 32.0, "memory": 8.0, "GPU": 4.0, "accelerator_type:A10G": 4.0}
    assert rr.inventory(merged) == rr.GpuInventory(4.0, 24 * GIB, "accelerator_type:A10G")
    assert rr.with_potential({"GPU": 2.0}, None) == {"GPU": 2.0}


LOCAL_YAML = Path(__file__).resolve().parents[2] / "cluster" / "local.yaml"


def test_node_types_count_each_worker_type_up_to_its_max_workers():
    config = {"max_workers": 5, "head_node_type": "head", "available_node_types": {
        "head": {"resources": {"CPU": 0}, "max_workers": 0},
        "gpu": {"resources": {"CPU": 8, "GPU": 1, "accelerator_type:A10G": 1}, "min_workers": 0, "max_workers": 8},
        "cpu": {"resources": {"CPU": 16}, "max_workers": 2},
        "auto": {"resources": {}, "max_workers": 4}}}  # resources detected at start: unknown here
    assert rr.node_type_potential(config) == {"CPU": 5 * 8 + 2 * 16, "GPU": 5.0, "accelerator_type:A10G": 5.0}
    local = rr.node_type_potential(yaml.safe_load(LOCAL_YAML.read_text()))
    assert local["GPU"] == 2.0 and local["CPU"] == 1 + 2 * 2  # cluster/local.yaml: a 1-CPU head, 2 GPU workers


class _Proc:
    def __init__(self, *args: str, uid: int | None = None, cwd: str = "/"):
        self.info = {"cmdline": list(args), "cwd": cwd}
        self.uid = os.getuid() if uid is None else uid

    def uids(self):
        return SimpleNamespace(real=self.uid)


def test_the_autoscaling_config_is_the_one_the_clusters_own_monitor_reads(monkeypatch, tmp_path):
    psutil = pytest.importorskip("psutil")
    monitor = str(rr.ray_monitor_scripts()[0])
    procs = [_Proc("python3", "-u", monitor, "--gcs-address=10.0.0.9:6379", "--autoscaling-config=/other.yaml"),
             _Proc("python3", "-u", monitor, "--gcs-address=10.0.0.1:6379", f"--autoscaling-config={LOCAL_YAML}"),
             _Proc("python3", "train.py", "--gcs-address=10.0.0.1:6379", "--autoscaling-config=/not-a-monitor"),
             _Proc()]  # a process whose command line cannot be read
    monkeypatch.setattr(psutil, "process_iter", lambda attrs=None: iter(procs))
    assert rr.monitor_config_path("10.0.0.1:6379") == LOCAL_YAML
    assert rr.monitor_config_path("10.0.0.2:6379") is None


@pytest.mark.parametrize("fake", [
    ("python3", "-c", "pass", "/tmp/x/ray/autoscaler/_private/monitor.py"),  # code that only names a monitor.py
    ("python3", "-u", "/tmp/x/ray/autoscaler/_private/monitor.py"),  # another file called monitor.py
    ("python3", "-c", "pass", "{monitor}"),  # naming Ray's own script is not running it
    ("python3", "-u", "{monitor}", "uid"),  # Ray's script, but another user's process
])
def test_a_process_that_only_looks_like_rays_monitor_is_not_believed(monkeypatch, fake):
    """A fake monitor's config gave 0.25 GPU per trial on a cluster without GPUs."""
    psutil = pytest.importorskip("psutil")
    monitor = str(rr.ray_monitor_scripts()[0])
    args = [a.replace("{monitor}", monitor) for a in fake if a != "uid"]
    proc = _Proc(*args, "--gcs-address=10.0.0.1:6379", f"--autoscaling-config={LOCAL_YAML}",
                 uid=os.getuid() + 1 if "uid" in fake else None)
    monkeypatch.setattr(psutil, "process_iter", lambda attrs=None: iter([proc]))
    assert rr.monitor_config_path("10.0.0.1:6379") is None


@pytest.mark.parametrize("text", ["available_node_types: [gpu, cpu]\n", "max_workers: {a: 1\n",
                                  "available_node_types: {gpu: 3}\n",
                                  "available_node_types: {gpu: {max_workers: lots, resources: {GPU: 1}}}\n"])
def test_a_malformed_autoscaling_config_counts_the_gpus_running_now(monkeypatch, tmp_path, text):
    from ray._private.state import state

    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    monkeypatch.setattr(state, "get_max_resources_from_cluster_config", lambda: None)
    monkeypatch.setattr(rr, "monitor_config_path", lambda address, script=None: bad)
    monkeypatch.setattr(rr, "head_autoscaling_config", lambda: rr.read_autoscaling_config("x"))
    assert rr.autoscaler_potential() is None


def test_auto_counts_gpu_workers_the_autoscaler_starts_from_zero(ray_cluster, monkeypatch, tmp_path):
    """A CPU head whose autoscaler (Ray 2.60's, which records no node types in the GCS) may start GPU workers:
    auto still gives a GPU share, so the GPU request is what makes the autoscaler add them."""
    import ray
    from ray._private.state import state

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 1.0, "memory": 1e9})
    monkeypatch.setattr(state, "get_max_resources_from_cluster_config", lambda: None)
    gcs = ray.get_runtime_context().gcs_address
    monkeypatch.setattr(rr, "monitor_config_path", lambda address, script=None: LOCAL_YAML if address == gcs else None)
    res = ResourceConfig()
    assert rr.connected_inventory(res).count == 2.0
    assert rr.declared_gpus("auto", res) == 0.25
    assert 0 < rr.with_encoder_gpus(EncoderConfig(), _Enc(), (3,), tmp_path, res).num_gpus < 1
    monkeypatch.setattr(rr, "monitor_config_path", lambda address, script=None: None)  # off the head: nothing to read
    assert rr.declared_gpus("auto", res) == 0.0


def test_a_driver_off_the_head_reads_the_autoscaling_config_on_the_head(ray_cluster, monkeypatch, tmp_path):
    """The config is read where the autoscaler runs: a 0-CPU task pinned to the head finds its monitor process
    (here a stand-in with the monitor's command line, for the session cluster) and parses the file it names,
    relative to the monitor's working directory (`ray start --autoscaling-config=cluster/local.yaml`)."""
    import subprocess
    import sys

    import ray
    from ray._private.state import state

    monkeypatch.setattr(state, "get_max_resources_from_cluster_config", lambda: None)
    monkeypatch.setattr(rr, "driver_node_id", lambda: "a-worker-node")  # as for a job's driver on a worker
    monkeypatch.setattr(rr, "_HEAD_CONFIGS", {})
    config = yaml.safe_load(LOCAL_YAML.read_text())
    config["max_workers"] = config["available_node_types"]["gpu_worker"]["max_workers"] = 3
    (tmp_path / "cluster").mkdir()
    (tmp_path / "cluster" / "mine.yaml").write_text(yaml.safe_dump(config))
    gcs = ray.get_runtime_context().gcs_address
    stand_in = tmp_path / "ray" / "autoscaler" / "_private" / "monitor.py"  # the installed one would autoscale
    stand_in.parent.mkdir(parents=True)
    stand_in.write_text("import time\ntime.sleep(120)\n")
    monkeypatch.setattr(rr, "MONITOR_SCRIPT", str(stand_in))
    monitor = subprocess.Popen([sys.executable, "-u", str(stand_in), f"--gcs-address={gcs}",
                                "--autoscaling-config=cluster/mine.yaml"], cwd=tmp_path)
    try:
        assert rr.autoscaler_potential() == {"CPU": 7.0, "GPU": 3.0, "object_store_memory": 1.5e9}
    finally:
        monitor.kill()
        monitor.wait()
    assert rr._HEAD_CONFIGS, "read once per cluster: the head's answer is kept"


def test_resolve_auto_and_explicit_numbers():
    paper_e32 = rr.sae_trial_bytes(768, 24576, 3, 256)  # 1.91 GiB
    h100 = rr.inventory({"GPU": 1.0, "accelerator_type:H100": 1.0})
    cpus = rr.inventory({"CPU": 16.0})
    assert rr.resolve("auto", h100, paper_e32, 4).gpus == 0.25  # 4 per GPU
    assert rr.resolve("auto", cpus, paper_e32, 4).gpus == 0.0  # no GPU: CPU
    small = rr.inventory({"GPU": 1.0}, memory_gb=8)  # 6.4 GiB usable: 3 fit
    assert rr.resolve("auto", small, paper_e32, 4).gpus == 0.3333
    assert rr.resolve("auto", rr.inventory({"GPU": 1.0}, memory_gb=2), paper_e32, 4).gpus == 1.0
    assert rr.resolve(0.5, cpus, paper_e32, 4).gpus == 0.5  # numbers as given
    assert rr.resolve(0.0, h100, paper_e32, 4).gpus == 0.0
    choice = rr.resolve("auto", h100, paper_e32, 4)
    assert (choice.need_gib, choice.gpu_memory_gib, choice.per_gpu) == (1.908, 80.0, 4)


def test_largest_stack_counts_the_seeds_of_a_stack():
    assert rr.largest_stack_bytes([(4, 8, 3), (4, 32, 3), (8, 8, 1)], 2) == rr.sae_trial_bytes(4, 32, 3, 2)
    assert rr.largest_stack_bytes([], 2) == 0


def test_config_accepts_auto_or_a_number(tmp_path):
    assert paper_run().encoders.num_gpus == "auto" and paper_run().resources.trial_gpus == "auto"
    path = tmp_path / "c.yaml"
    path.write_text("preset: paper\nencoders: {num_gpus: 0.5}\nresources: {trial_gpus: auto, gpu_memory_gb: 24}\n")
    cfg = load_run_config(path)
    assert cfg.encoders.num_gpus == 0.5 and cfg.resources.trial_gpus == "auto" and cfg.resources.gpu_memory_gb == 24
    for bad, msg in [("encoders: {num_gpus: lots}", "encoders.num_gpus must be a number or 'auto', got 'lots'"),
                     ("resources: {trial_gpus: -1}", "resources.trial_gpus must be a number >= 0 or 'auto'"),
                     ("resources: {max_per_gpu: 0}", "resources.max_per_gpu must be > 0"),
                     ("resources: {gpu_memory_gb: 0}", "resources.gpu_memory_gb must be > 0 or null")]:
        path.write_text(f"preset: paper\n{bad}\n")
        with pytest.raises(ConfigError, match=msg.replace("(", r"\(").replace(")", r"\)")):
            load_run_config(path)
    with pytest.raises(ConfigError, match="encoders.num_gpus must be a number >= 0 or 'auto'"):
        EncoderConfig(num_gpus="half").validate()


class _Enc(nn.Module):
    name, n_layers, d = "toy", 2, 4

    def __init__(self):
        super().__init__()
        self.w = nn.Linear(3, 4)  # 16 parameters


def test_auto_on_a_logical_gpu_gives_fractions_and_records_them(ray_cluster, tmp_path):
    """The session cluster has one logical GPU (no memory figure: 16 GiB assumed): auto packs 4 per GPU."""
    res = ResourceConfig()
    assert rr.connected_inventory(res).count == 1.0
    assert rr.declared_gpus("auto", res) == 0.25 and rr.declared_gpus(0.0, res) == 0.0
    enc = rr.with_encoder_gpus(EncoderConfig(batch_size=2), _Enc(), (3,), tmp_path, res)
    assert enc.num_gpus == 0.25
    assert rr.with_encoder_gpus(EncoderConfig(num_gpus=0.0), _Enc(), (3,), tmp_path, res).num_gpus == 0.0
    record = json.loads(RunLayout.at(tmp_path).resources_resolved.read_text())
    assert record["encode"]["toy"]["requested"] == 0.0 and record["encode"]["toy"]["cluster_gpus"] == 1.0
    assert record["encode"]["toy"]["need_gib"] == round(4 * (16 + 2 * (3 * 33 + 2 * 4)) / GIB, 3)

    cfg = replace(paper_run(str(tmp_path)), resources=replace(res, max_per_gpu=2))
    assert run_trial_gpus(cfg, tmp_path) == 0.5  # no stores yet: need unknown, max_per_gpu per GPU
    assert json.loads(RunLayout.at(tmp_path).resources_resolved.read_text())["train"]["trial"]["gpus"] == 0.5

    @ray_cluster.remote
    def assigned() -> list:
        return ray_cluster.get_gpu_ids()

    # what a worker with that share is given: the logical GPU, on which the trial and actor code fall back to CPU
    assert ray_cluster.get(assigned.options(num_gpus=enc.num_gpus).remote()) == [0]


def test_auto_on_a_cpu_only_cluster_gives_zero(ray_cluster, tmp_path, monkeypatch):
    import ray

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0, "memory": 1e9})
    res = ResourceConfig()
    assert rr.declared_gpus("auto", res) == 0.0
    assert rr.with_encoder_gpus(EncoderConfig(), _Enc(), (3,), tmp_path, res).num_gpus == 0.0
    assert run_trial_gpus(paper_run(str(tmp_path)), tmp_path) == 0.0
    assert rr.resolve(0.25, rr.connected_inventory(res), 0, 4).gpus == 0.25  # an explicit share is still asked for


def test_trial_need_comes_from_the_runs_stores(ray_cluster, tmp_path):
    """run_trial_gpus reads each model's width and train rows from the activation stores' index files."""
    from raybench.encoders.store import INDEX

    cfg = paper_run(str(tmp_path))
    cfg = replace(cfg, protocol=replace(cfg.protocol, grid=replace(cfg.protocol.grid, models=("csfm", "ecg_fm"))),
                  resources=ResourceConfig(gpu_memory_gb=4.0))
    for model, d, rows in (("csfm", 64, 1000), ("ecg_fm", 128, 3000)):
        layer_dir = RunLayout.at(tmp_path).activation_dir(model, 0)
        layer_dir.mkdir(parents=True)
        (layer_dir / INDEX).write_text(json.dumps({"n_layers": 12, "d": d, "splits": {"train": rows}}))
    # the largest stack: ecg_fm at E 32 (N 4096), 3 seeds, B 256, its 3000 train rows: 0.085 GiB
    need = rr.sae_trial_bytes(128, 32 * 128, 3, 256, 3000)
    assert need == 4 * (4 * 3 * (2 * 128 * 4096 + 4096 + 128) + 3 * 256 * (3 * 4096 + 4 * 128) + 3000 * 128)
    assert run_trial_gpus(cfg, tmp_path) == 0.25  # 3.2 GiB usable / 0.085 GiB: capped at 4 per GPU
    trial = json.loads(RunLayout.at(tmp_path).resources_resolved.read_text())["train"]["trial"]
    assert trial["need_gib"] == round(need / GIB, 3) and trial["memory_source"] == "resources.gpu_memory_gb"
    tight = replace(cfg, resources=ResourceConfig(gpu_memory_gb=0.25))  # 0.2 GiB usable: 2 fit
    assert run_trial_gpus(tight, tmp_path) == 0.5


def test_reuse_trial_processes_auto_is_on_only_for_a_local_instance_raybench_started(ray_cluster, monkeypatch):
    import raybench.infra.ray_session as session

    monkeypatch.setattr(session, "_OWNS_LOCAL", False)  # the tests' session cluster: started by conftest
    assert not rr.resolve_reuse_trial_processes("auto")
    assert rr.resolve_reuse_trial_processes(True) and not rr.resolve_reuse_trial_processes(False)
    monkeypatch.setattr(session, "_OWNS_LOCAL", True)  # as after init_ray started a local instance
    assert rr.resolve_reuse_trial_processes("auto") and not rr.resolve_reuse_trial_processes(False)
    for bad in ("yes", "on", 1):
        with pytest.raises(ConfigError, match="reuse_trial_processes"):
            ResourceConfig(reuse_trial_processes=bad).validate()


def test_reuse_trial_processes_reads_yaml_booleans(tmp_path):
    import yaml

    from raybench.core.config import demo_run, dump_run_config

    text = dump_run_config(demo_run(str(tmp_path / "run")))
    assert "reuse_trial_processes: auto" in text
    for word, value in (("off", False), ("true", True), ("auto", "auto")):
        path = tmp_path / f"{word}.yaml"
        path.write_text(text.replace("reuse_trial_processes: auto", f"reuse_trial_processes: {word}"))
        assert yaml.safe_load(path.read_text())["resources"]["reuse_trial_processes"] == value
        assert load_run_config(path).resources.reuse_trial_processes == value


def test_init_ray_owns_a_local_instance_but_not_a_cluster_it_joins(monkeypatch):
    """Which of init_ray's two ways of starting Ray it took decides `auto` (ray.init itself is not called)."""
    import ray

    import raybench.infra.ray_session as session

    calls = []
    monkeypatch.setattr(session, "_OWNS_LOCAL", False)  # restored after the test
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(calls))
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    session.init_ray(ResourceConfig(num_cpus=1))
    assert calls[-1]["address"] == "local" and session.owns_local_instance()
    calls.clear()
    session.init_ray(ResourceConfig(address="ray://head:10001"))
    assert calls[-1]["address"] == "ray://head:10001" and not session.owns_local_instance()
