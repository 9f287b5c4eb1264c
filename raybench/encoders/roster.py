"""The encoder actors of one extraction pipeline, so that the driver, not the garbage collector, ends them.

Ray Data releases an actor pool by dropping its handles (`shutdown(force=False)`), so a failed pipeline's actors
live on while anything still refers to them: the exception's traceback does, until a garbage collection happens
to run. They hold their CPU and GPU shares meanwhile, and an immediate rerun on a full node starved (its loading
tasks never scheduled; the suite hung). Every encoder actor therefore signs a `Roster` as it starts, and the
driver kills every signed actor when its pipeline ends, failed or finished; an actor that starts after the roster
closed exits at once. Killing is safe after the stream ends: the driver owns the batches it has read.
"""

from __future__ import annotations

import time
from typing import Any


class Roster:
    """A zero-resource Ray actor holding the handles of one pipeline's encoder actors."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self.closed = False

    def sign(self, handle: Any) -> bool:
        """Record an encoder actor; False once the pipeline has ended (the actor should exit)."""
        if self.closed:
            return False
        self.handles.append(handle)
        return True

    def close(self) -> list[Any]:
        """End signing; the handles signed so far."""
        self.closed = True
        return self.handles


def open_roster() -> Any:
    """A new roster actor (no CPU, so it schedules on a full node and on a head with `CPU: 0`)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=0)(Roster).remote()


def sign_or_exit(roster: Any) -> None:
    """Called in an encoder actor's constructor: sign `roster`, or exit if its pipeline already ended."""
    if roster is None:
        return
    import ray

    if not ray.get(roster.sign.remote(ray.get_runtime_context().current_actor)):
        ray.actor.exit_actor()


def end_pipeline(roster: Any, baseline: dict[str, float], timeout_s: float = 30.0) -> dict[str, float]:
    """Kill every actor signed on `roster` (and the roster), then wait, bounded, until the node's free CPU and GPU
    are back to `baseline` (what was free before the pipeline started). Returns the free resources seen last."""
    import ray

    try:
        handles = ray.get(roster.close.remote(), timeout=timeout_s)
    except Exception:  # the roster itself is gone: nothing signed can be found any more
        handles = []
    for handle in handles:
        ray.kill(handle, no_restart=True)
    ray.kill(roster, no_restart=True)
    deadline = time.monotonic() + timeout_s
    while True:
        free = free_resources()
        if all(free.get(k, 0.0) >= v - 1e-9 for k, v in baseline.items()) or time.monotonic() > deadline:
            return free
        time.sleep(0.1)


def free_resources() -> dict[str, float]:
    """The cluster's free CPU and GPU."""
    import ray

    return {k: float(v) for k, v in ray.available_resources().items() if k in ("CPU", "GPU")}
