"""Start or attach to Ray: the one place that calls `ray.init`.

Inside a Ray job (or with RAY_ADDRESS set) we attach to that cluster; otherwise we start a local
instance with the dashboard off and every server bound to 127.0.0.1 (`_loopback_node`). Ray is imported and started only
when a stage has work (a rerun with nothing to do never pays its start-up).

Quiet by default: raybench draws its own progress (raybench.infra.progress), so Ray's, Tune's and Ray Data's INFO
and WARNING chatter and the workers' stdout stay out of the terminal (the C++ core worker logs only errors
there; the encoder actors give it no cause, see raybench.encoders.extract);
`set_verbose(True)` (`raybench --verbose ...`) lets all of it through. Errors of the work itself reach the
user through raybench's own messages, naming the cell or record.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

from raybench.core.config import ResourceConfig

RAY_LOGGERS = ("ray", "ray.data", "ray.tune", "ray.train")
_VERBOSE = False


def set_verbose(verbose: bool) -> None:
    """`raybench --verbose`: show Ray's own log lines and the workers' output (before Ray starts)."""
    global _VERBOSE
    _VERBOSE = bool(verbose)


def is_verbose() -> bool:
    return _VERBOSE


def quiet_ray_logs() -> None:
    """Keep Ray / Ray Data / Tune chatter out of the terminal unless verbose (errors still pass). Call again
    after the first `import ray.data`, which configures its logger afresh."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    if _VERBOSE:
        return
    for name in RAY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    # Tune logs a failed trial's whole traceback; raybench's display names the trial's cells instead
    logging.getLogger("ray.tune").setLevel(logging.CRITICAL)


_OWNS_LOCAL = False  # init_ray started a local instance of its own (nothing else can join it)
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def _loopback_node() -> Iterator[None]:
    """Keep a local instance's node address at 127.0.0.1, so its servers bind to loopback only.

    Ray 2.60's ray.init replaces a 127.0.0.1 `_node_ip_address` with the machine's network address unless
    multi-node clusters are off (ray_constants.ENABLE_RAY_CLUSTER, what RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 sets
    at import), and GCS, raylet, workers and agents then listen on every interface. The switch is flipped only
    for this call: a later ray.init(address=<cluster>) in the process sees Ray's own setting again.
    """
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def owns_local_instance() -> bool:
    """Whether the Ray this process uses is a local instance that init_ray started (not a cluster it joined)."""
    import ray

    return _OWNS_LOCAL and ray.is_initialized()


def init_ray(resources: ResourceConfig | None = None) -> None:
    global _OWNS_LOCAL
    import ray

    quiet_ray_logs()
    if ray.is_initialized():
        return
    resources = resources or ResourceConfig()
    address = resources.address or os.environ.get("RAY_ADDRESS")
    level = logging.INFO if _VERBOSE else logging.ERROR
    _OWNS_LOCAL = not address
    if address:
        ray.init(address=address, log_to_driver=_VERBOSE, logging_level=level)
    else:
        with _loopback_node():
            ray.init(
                address="local",  # never attach by accident to a `ray start` cluster on this machine
                num_cpus=resources.num_cpus,
                num_gpus=resources.num_gpus,
                include_dashboard=False,
                log_to_driver=_VERBOSE,
                logging_level=level,
                _node_ip_address=LOOPBACK,
            )
    if not _VERBOSE:  # ray.init configures its own loggers again
        quiet_ray_logs()
