"""The encoder actors of one extraction pipeline, so that the driver, not the garbage collector, ends them.

Ray Data releases an actor pool by dropping its handles (`shutdown(force=False)`), so a failed pipeline's actors
live on while anything still refers to them: the exception's traceback does, until a garbage collection happens
to run. They hold their CPU and GPU shares meanwhile, and an immediate rerun on a full node starved (its loading
tasks never scheduled; the suite hung). Every encoder actor therefore signs a `Roster` as it starts, and the
driver kills every signed actor when its pipeline ends, failed or finished; an actor that starts after the roster
closed exits at once. Killing is safe after the stream ends: the driver owns the batches it has read.
One roster actor serves every pipeline of a driver (each pipeline signs under its own key), so an extraction
does not start (and end) a worker process of its own for it.
`run_pipeline` is that lifetime around one extraction (raybench.encoders.extract), with Ray Data's no-progress
and minimum-actor timeouts so that a pipeline that cannot get its resources fails instead of waiting forever.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the Roster actor's worker imports this module: it stays light (no pandas, no torch)
    from raybench.core.config import EncoderConfig


class Roster:
    """A zero-resource Ray actor holding, per pipeline key, the handles of that pipeline's encoder actors."""

    def __init__(self) -> None:
        self.handles: dict[int, list[Any]] = {}
        self.closed: set[int] = set()

    def open(self, key: int) -> int:
        """Start signing for pipeline `key` (also a liveness check for the driver); returns `key`."""
        self.handles.setdefault(key, [])
        return key

    def sign(self, key: int, handle: Any) -> bool:
        """Record an encoder actor of pipeline `key`; False once that pipeline has ended (the actor should exit)."""
        if key in self.closed:
            return False
        self.handles.setdefault(key, []).append(handle)
        return True

    def close(self, key: int) -> list[Any]:
        """End signing for pipeline `key`; the handles signed for it so far."""
        self.closed.add(key)
        return self.handles.pop(key, [])


@dataclass(frozen=True)
class PipelineRoster:
    """What one pipeline's encoder actors get: the driver's roster actor and the pipeline's key on it."""

    actor: Any
    key: int


_SHARED: dict[tuple[str, str], Any] = {}  # (Ray job id, node id) -> this driver's roster actor
_KEYS = itertools.count()


def open_roster() -> PipelineRoster:
    """A new pipeline's roster: the driver's roster actor (started once per Ray session: no CPU, so it schedules
    on a full node and on a head with `CPU: 0`) under a new key."""
    import ray

    ctx = ray.get_runtime_context()
    session = (ctx.get_job_id(), ctx.get_node_id())
    key = next(_KEYS)
    actor = _SHARED.get(session)
    if actor is not None:
        try:
            ray.get(actor.open.remote(key), timeout=30)
            return PipelineRoster(actor, key)
        except Exception:  # it is gone (killed, or its node died): start another
            _SHARED.pop(session, None)
    actor = ray.remote(num_cpus=0, max_restarts=0)(Roster).remote()
    _SHARED[session] = actor
    actor.open.remote(key)
    return PipelineRoster(actor, key)


def close_roster(roster: PipelineRoster, timeout_s: float = 30.0) -> list[Any]:
    """End signing for `roster`'s pipeline: the handles of the encoder actors that signed it."""
    import ray

    return ray.get(roster.actor.close.remote(roster.key), timeout=timeout_s)


def sign_or_exit(roster: PipelineRoster | None) -> None:
    """Called in an encoder actor's constructor: sign `roster`, or exit if its pipeline already ended."""
    if roster is None:
        return
    import ray

    if not ray.get(roster.actor.sign.remote(roster.key, ray.get_runtime_context().current_actor)):
        ray.actor.exit_actor()


def end_pipeline(roster: Any, baseline: dict[str, float], timeout_s: float = 30.0) -> dict[str, float]:
    """Kill every actor signed on `roster` (the roster actor stays for the driver's next pipeline), then wait,
    bounded, until the node's free CPU and GPU are back to `baseline` (what was free before the pipeline
    started). Returns the free resources seen last."""
    import ray

    try:
        handles = close_roster(roster, timeout_s)
    except Exception:  # the roster itself is gone: nothing signed can be found any more
        handles = []
    for handle in handles:
        ray.kill(handle, no_restart=True)
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


# ---------------------------------------------------------------- one pipeline's run

def run_pipeline(body, names: list[str], writers, enc_cfg: EncoderConfig, progress: bool, credentialed: bool):
    """`body(roster)` (build the pipeline with `roster`, stream it into the writers, finalize them) under the
    DataContext extraction needs; returns what it returns. Whatever happens, the pipeline's encoder actors are
    killed when it ends (raybench.encoders.roster), so their CPU and GPU shares are free for whatever runs next;
    a pipeline that cannot get its resources fails after `encoders.stall_timeout_s` instead of waiting forever.
    Raises ExtractionError (the cause first; text withheld as raybench.core.privacy says for a credentialed cohort)."""
    import ray

    from raybench.encoders.loading import ExtractionError

    ctx = ray.data.DataContext.get_current()
    saved = (ctx.execution_options.preserve_order, ctx.enable_progress_bars, ctx.execution_no_progress_timeout_s,
             ctx.wait_for_min_actors_s)
    baseline = free_resources()
    roster = open_roster()
    failure: str | None = None
    try:
        ctx.execution_options.preserve_order = True
        ctx.enable_progress_bars = progress
        ctx.execution_no_progress_timeout_s = float(enc_cfg.stall_timeout_s)
        ctx.wait_for_min_actors_s = max(1, math.ceil(enc_cfg.stall_timeout_s))
        result = body(roster)
    except Exception as err:  # re-raised below, once the pipeline's actors are gone
        failure = _failure(err, enc_cfg, baseline, credentialed)
        del err
    finally:
        for w in writers:
            w.abort()
        (ctx.execution_options.preserve_order, ctx.enable_progress_bars, ctx.execution_no_progress_timeout_s,
         ctx.wait_for_min_actors_s) = saved
    # A failed run waits (bounded) until the shares its actors held are free again, so that an immediate rerun on
    # a full node can schedule its loading tasks; a finished one only ends its actors.
    end_pipeline(roster, baseline if failure is not None else {})
    if failure is not None:
        raise ExtractionError(f"{', '.join(names)}: extraction failed; no partial store was kept, rerun to finish "
                              f"the remaining layers. Cause: {failure}")
    return result


def _failure(err: Exception, enc_cfg: EncoderConfig, baseline: dict[str, float], credentialed: bool) -> str:
    """What to tell the user about a failed pipeline."""
    from ray.data.exceptions import ExecutionTimeoutError
    from ray.exceptions import GetTimeoutError

    from raybench.core.privacy import failure_text
    from raybench.encoders.loading import ExtractionError

    if isinstance(err, ExecutionTimeoutError | GetTimeoutError):
        return (f"no progress for {enc_cfg.stall_timeout_s:g} s (encoders.stall_timeout_s): the pipeline could not "
                f"get its resources. Free before it started: {_fmt(baseline)}; each encoder actor asks for "
                f"{enc_cfg.num_gpus:g} GPU. Check `ray status` for other work holding CPUs or GPUs, add nodes, or "
                "raise encoders.stall_timeout_s (an autoscaler still starting nodes)")
    if isinstance(err, ExtractionError):
        return failure_text(err, True) if credentialed else str(err)
    return failure_text(err, True) if credentialed else _describe(err)


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items())) or "nothing"


def _describe(err: BaseException) -> str:
    """What the user's code raised inside a Ray worker (the first `Type: message` line of the remote traceback
    that is not a Ray wrapper) first, then the full text."""
    text = f"{type(err).__name__}: {err}"
    for line in str(err).splitlines():
        if re.match(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt): ", line) and not line.startswith("ray."):
            return f"{line.strip()}\n{text}"
    return text
