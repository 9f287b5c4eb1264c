"""Independent CPU jobs (drawing figures, dashboard images) shared between Ray tasks and this process.

With Ray up, all but one CPU of the cluster run jobs as tasks, taken from the front of the list, while this
process runs jobs itself from the back: on two cores the demo's base figures took 6.0-6.9 s instead of 8.1-10.7 s
(not half: two concurrent matplotlib renders each ran ~1.5x slower there), and since Ray's workers run niced, this
process's own share keeps the work going on a shared machine. A job's
result comes back to this process, which writes the files (so tasks need no access to the run folder).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

Job = tuple[Callable[..., Any], tuple]

_REMOTE: dict[Callable, Any] = {}  # job functions as Ray remote functions, made once per process


def _remote(fn: Callable) -> Any:
    import ray

    if fn not in _REMOTE:
        _REMOTE[fn] = ray.remote(num_cpus=1)(fn)
    return _REMOTE[fn]


def run_jobs(jobs: Sequence[Job], remote: bool, steal_tail: bool = True) -> Iterator[tuple[int, Any]]:
    """Yield (index, fn(*args)) once for every job, in the order they finish.

    remote False: every job here, in order. remote True: tasks plus this process, as the module says. When no
    job is left to hand out, `steal_tail` runs a still-pending task's job here as well (its task's result, the
    same value, is then dropped): right when tasks may be starved of CPU (many small jobs on a busy machine),
    wasteful when they are few and long, where waiting is better. Arguments may be Ray object refs (one copy
    shared by the tasks); a job run here gets their values."""
    if not remote:
        for i, (fn, args) in enumerate(jobs):
            yield i, fn(*args)
        return
    import ray

    slots = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)) - 1)  # a job queued behind each running one:
    # results are collected only between this process's own jobs, and a worker must not idle until then
    todo = list(enumerate(jobs))
    pending: dict[Any, tuple[int, Job]] = {}
    while todo or pending:
        while todo and len(pending) < slots:
            i, (fn, args) = todo.pop(0)
            pending[_remote(fn).remote(*args)] = (i, (fn, args))
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            yield pending.pop(ref)[0], ray.get(ref)
        if todo:
            i, (fn, args) = todo.pop()
        elif pending and steal_tail:
            i, (fn, args) = pending.pop(next(iter(pending)))
        elif pending:
            ref = ray.wait(list(pending), num_returns=1)[0][0]
            yield pending.pop(ref)[0], ray.get(ref)
            continue
        else:
            break
        yield i, fn(*(ray.get(a) if isinstance(a, ray.ObjectRef) else a for a in args))
