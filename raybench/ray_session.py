"""Start or attach to Ray: the one place that calls `ray.init`.

Inside a Ray job (or with RAY_ADDRESS set) we attach to that cluster; otherwise we start a local
instance with the dashboard off and nothing bound to a public address.
"""

from __future__ import annotations

import os

import ray

from raybench.config import ResourceConfig


def quiet_ray_logs() -> None:
    """raybench prints one progress display; keep Ray Data / Tune INFO chatter out of the terminal."""
    import logging

    for name in ("ray.data", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")


def init_ray(resources: ResourceConfig | None = None) -> None:
    quiet_ray_logs()
    if ray.is_initialized():
        return
    resources = resources or ResourceConfig()
    address = resources.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
        return
    ray.init(
        address="local",  # never attach by accident to a `ray start` cluster on this machine
        num_cpus=resources.num_cpus,
        num_gpus=resources.num_gpus,
        include_dashboard=False,
        log_to_driver=False,
    )
