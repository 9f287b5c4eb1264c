"""Every cluster config parses, has what its launcher needs, keeps the dashboard private, and pins our Ray."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# the cloud launchers (cluster/local.yaml, the laptop rehearsal on the fake multi-node provider, is tested by
# tests/infra/test_autoscaling.py); which raybench they install: tests/app/test_cluster_launchers.py
LAUNCHER = [ROOT / "cluster" / "aws.yaml", ROOT / "cluster" / "gcp.yaml"]
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
    assert all(p.exists() for p in LAUNCHER)
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
    assert spec["headGroupSpec"].get("serviceType") == "ClusterIP", "the head Service is never published"
    gpu = [g for g in spec["workerGroupSpecs"] if g["groupName"] == "gpu"]
    assert gpu and gpu[0]["minReplicas"] == 0
    for image in _images(doc):
        assert re.search(rf":{re.escape(_ray_pin())}\b", image), f"{path.name}: image {image} is not ray {_ray_pin()}"
    if doc["kind"] == "RayJob":
        assert doc["spec"]["entrypoint"].startswith("raybench grid")


# ---------------------------------------------------------------- launcher: schema, pinned install, token on every node


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_launcher_config_matches_rays_schema(path):
    """The cluster launcher's own JSON schema, shipped inside the installed ray package."""
    jsonschema = pytest.importorskip("jsonschema")
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(yaml.safe_load(path.read_text()), schema)


@pytest.mark.parametrize("path", LAUNCHER, ids=lambda p: p.name)
def test_launcher_gives_every_node_the_token(path):
    cfg = yaml.safe_load(path.read_text())
    mounts = cfg.get("file_mounts") or {}
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = " ".join(cfg[key])
        assert "RAY_AUTH_MODE=token" in start, f"{path.name}: {key} without token auth"
        m = re.search(r"RAY_AUTH_TOKEN_PATH=(\S+?)[;\s]", start)
        assert m, f"{path.name}: {key} never tells Ray where the token is"
        token_path = m.group(1).replace("$HOME", "~")
        remote = [r for r in mounts if token_path.startswith(r.rstrip("/") + "/") or token_path == r]
        assert remote, f"{path.name}: {token_path} is not provided by file_mounts {mounts}"
        assert mounts[remote[0]].startswith("~/"), "the token comes from the laptop's home, never from the repo"
    assert "RAY_AUTH_TOKEN=" not in path.read_text(), "no token value in a config file"
    readme = (ROOT / "cluster" / "README.md").read_text()
    assert all(local in readme for local in mounts.values()), "cluster/README.md says how to create the token file"


# ---------------------------------------------------------------- KubeRay: token from a Secret, pinned, dashboard reach


def _ray_containers(doc) -> list[dict]:
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [c for g in groups for c in g["template"]["spec"]["containers"]]


@pytest.mark.parametrize("path", KUBERAY, ids=lambda p: p.name)
def test_kuberay_token_comes_from_a_secret(path):
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
    secret = spec["authOptions"].get("secretName")
    assert secret, f"{path.name}: authOptions.secretName names the Secret the operator uses too"
    containers = _ray_containers(doc)
    assert len(containers) >= 2
    for c in containers:
        env = {e["name"]: e for e in c.get("env", [])}
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{path.name}: {c['name']}"
        token = env.get("RAY_AUTH_TOKEN", {})
        assert "value" not in token, f"{path.name}: a literal token in {c['name']}"
        assert token.get("valueFrom", {}).get("secretKeyRef") == {"name": secret, "key": "auth_token"}, c["name"]
    assert f"create secret generic {secret}" in (ROOT / "cluster" / "README.md").read_text()


def test_kuberay_image_recipe_is_the_pinned_ray():
    """cluster/kuberay/Dockerfile adds raybench to Ray's own image of the pinned version (what the manifests run:
    tests/app/test_cluster_launchers.py)."""
    docker = (ROOT / "cluster" / "kuberay" / "Dockerfile").read_text()
    base = re.search(r"^FROM\s+(\S+)", docker, re.M).group(1)
    assert base.startswith(f"rayproject/ray:{_ray_pin()}-"), base
    for path in KUBERAY:
        for image in _images(yaml.safe_load(path.read_text())):
            assert image.endswith(base.split(":", 1)[1]), f"{path.name}: {image} is not built FROM {base}"


def test_dashboard_reach():
    """RayJob: the submitter pod reaches the dashboard through the head Service, so it listens on the pod
    network, behind a ClusterIP Service. RayCluster: loopback, reached by kubectl port-forward."""
    job = yaml.safe_load((ROOT / "cluster" / "kuberay" / "rayjob.yaml").read_text())["spec"]["rayClusterSpec"]
    assert job["headGroupSpec"]["rayStartParams"].get("dashboard-host", "0.0.0.0") == "0.0.0.0"
    assert job["headGroupSpec"]["serviceType"] == "ClusterIP"
    cluster = yaml.safe_load((ROOT / "cluster" / "kuberay" / "raycluster.yaml").read_text())["spec"]
    assert cluster["headGroupSpec"]["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    assert cluster["headGroupSpec"]["serviceType"] == "ClusterIP"
    readme = (ROOT / "cluster" / "README.md").read_text()
    assert "ClusterIP" in readme and "raybench export" in readme
    assert "s3 sync" not in readme, "the README must not suggest syncing the whole run folder"
