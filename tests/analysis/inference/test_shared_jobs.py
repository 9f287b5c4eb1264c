"""run_jobs: every job's result exactly once, the same with and without Ray, object-ref arguments resolved."""

from __future__ import annotations

import os
import sys

import pytest
import ray.cloudpickle

from raybench.analysis.inference.shared_jobs import run_jobs

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this test module


def _square_and_pid(x: int, scale: int = 1) -> tuple[int, int]:
    return x * x * scale, os.getpid()


def test_without_ray_jobs_run_here_in_order():
    out = list(run_jobs([(_square_and_pid, (i,)) for i in range(5)], remote=False))
    assert [i for i, _ in out] == list(range(5))
    assert [r[0] for _, r in out] == [0, 1, 4, 9, 16] and {r[1] for _, r in out} == {os.getpid()}


@pytest.mark.parametrize("steal_tail", [True, False])
def test_with_ray_tasks_and_this_process_share_the_jobs(ray_cluster, steal_tail):
    scale = ray_cluster.put(3)  # a shared argument: tasks get its value, and so does a job run here
    jobs = [(_square_and_pid, (i, scale)) for i in range(12)]
    out = list(run_jobs(jobs, remote=True, steal_tail=steal_tail))
    assert sorted(i for i, _ in out) == list(range(12)), "every job exactly once"
    assert all(r[0] == 3 * i * i for i, r in out)
    pids = {r[1] for _, r in out}
    assert os.getpid() in pids, "this process ran jobs from the back"
    if not steal_tail:  # the first job went to a task and is never taken back (stealing may take every job)
        assert len(pids) > 1, "a task ran a job"
