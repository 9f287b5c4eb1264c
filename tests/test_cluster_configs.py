"""Every cluster config parses, has what its launcher needs, keeps the dashboard private, and pins our Ray."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = sorted((ROOT / "cluster").glob("*.yaml"))
KUBERAY = sorted((ROOT / "cluster" / "kuberay").glob("*.yaml"))


def _ray_pin() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if d.startswith("ray["))
    return pin.split("==")[1]


def _images(obj) -> list[str]:
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "image" and isinstance(v, str):
                found.append(v)
            found += _images(v)
    elif isinstance(obj, list):
        for v in obj:
            found += _images(v)
    return found


def test_there_are_configs():
    assert {p.name for p in LAUNCHER} >= {"aws.yaml", "gcp.yaml"}
    assert {p.name for p in KUBERAY} >= {"raycluster.yaml", "rayjob.yaml"}


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_launcher_config(path):
    cfg = yaml.safe_load(path.read_text())
    for key in ("cluster_name", "provider", "available_node_types", "head_node_type", "head_start_ray_commands",
                "worker_start_ray_commands", "idle_timeout_minutes"):
        assert key in cfg, f"{path.name} lacks {key}"
    types = cfg["available_node_types"]
    assert cfg["head_node_type"] in types
    gpu = types["gpu_worker"]
    assert gpu["min_workers"] == 0 and gpu["max_workers"] >= 1, "GPU workers must scale from zero"
    assert "--shm-size" in " ".join(cfg["docker"]["run_options"])
    head = " ".join(cfg["head_start_ray_commands"])
    assert "RAY_AUTH_MODE=token" in head
    assert "--dashboard-host=0.0.0.0" not in head, "the dashboard is reached by port-forwarding, never exposed"
    for image in _images(cfg):
        assert f":{_ray_pin()}" in image, f"{path.name}: image {image} does not match ray=={_ray_pin()}"


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_manifest(path):
    doc = yaml.safe_load(path.read_text())
    assert doc["apiVersion"] == "ray.io/v1" and doc["kind"] in ("RayCluster", "RayJob")
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    assert spec["rayVersion"] == _ray_pin()
    assert spec["enableInTreeAutoscaling"] is True
    assert spec.get("authOptions", {}).get("mode") == "token"
    head = spec["headGroupSpec"]["rayStartParams"]
    assert head.get("dashboard-host", "127.0.0.1") != "0.0.0.0"
    gpu = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu"]
    assert gpu and gpu[0]["minReplicas"] == 0
    for image in _images(doc):
        assert re.search(rf":{re.escape(_ray_pin())}\b", image), f"{path.name}: image {image} is not ray {_ray_pin()}"
    if doc["kind"] == "RayJob":
        assert doc["spec"]["entrypoint"].startswith("raybench grid")
