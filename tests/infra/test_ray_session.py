"""raybench.infra.ray_session: the local Ray instance that `raybench grid` starts for itself listens on loopback only.

Ray 2.60 turns a 127.0.0.1 node address into the machine's network address and then binds its servers (GCS,
raylet, object manager, workers, agents) to every interface, so anyone on the network could submit work to a
laptop's `raybench grid`. The check runs in a subprocess: the pytest process already holds the session's Ray.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = """
import json, os
import psutil, ray
import ray._private.ray_constants as constants
from raybench.core.config import ResourceConfig
from raybench.infra.ray_session import init_ray, owns_local_instance

before = constants.ENABLE_RAY_CLUSTER
init_ray(ResourceConfig(num_cpus=1, num_gpus=0))

@ray.remote(num_cpus=1)
class Probe:
    def ip(self):
        return ray.util.get_node_ip_address()

actor_ip = ray.get(Probe.remote().ip.remote())
me = psutil.Process()
pids = {p.pid for p in (me, *me.children(recursive=True))}
listen = sorted({c.laddr.ip for c in psutil.net_connections("inet")
                 if c.status == psutil.CONN_LISTEN and c.pid in pids})
print("PROBE", json.dumps({"nodes": [n["NodeManagerAddress"] for n in ray.nodes()], "actor": actor_ip,
                           "listen": listen, "owns": owns_local_instance(),
                           "constant_restored": constants.ENABLE_RAY_CLUSTER == before}))
ray.shutdown()
"""


def test_a_local_instance_listens_on_loopback_only(tmp_path):
    pytest.importorskip("psutil")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")}
    proc = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert proc.returncode == 0 and line, proc.stdout + proc.stderr
    got = json.loads(line.split(" ", 1)[1])
    assert got["nodes"] == ["127.0.0.1"] and got["actor"] == "127.0.0.1" and got["owns"], got
    assert got["listen"] and all(ip in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for ip in got["listen"]), got
    assert got["constant_restored"], "a later ray.init(address=<cluster>) must see Ray's own setting again"
