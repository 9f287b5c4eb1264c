"""Shared fixtures: one local Ray cluster per session (fixed CPUs, 1 logical GPU, dashboard off)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
# Tests mirror the package tree (tests/<package>/test_<module>.py) and share helpers (fake_run, small_run, a
# fixture writer in another test module): every test folder is importable by module name; basenames are unique.
for _folder in sorted({TESTS, *(p.parent for p in TESTS.rglob("test_*.py"))}, reverse=True):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

from tests.suite_env import MATH_THREAD_VARS, QUIET_RAY  # noqa: E402


def _one_math_thread_per_xdist_worker() -> None:
    """Under `-n 2` the two workers share the machine's cores: each runs its own numpy/torch math on one thread,
    so they do not oversubscribe the cores (subprocesses and Ray workers started from here inherit it; raybench sets
    its own threads per encoder actor and trial). A single-process run keeps the libraries' defaults."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for var in MATH_THREAD_VARS:
        os.environ.setdefault(var, "1")
    from threadpoolctl import threadpool_limits  # BLAS a plugin already loaded (numpy) ignores the variables

    threadpool_limits(limits=1)


_one_math_thread_per_xdist_worker()


def pytest_configure(config) -> None:
    """Compile raybench's bytecode once, before any test: the suite starts hundreds of Python processes (drivers,
    Ray workers, actors) that each import part of the package, and where PYTHONDONTWRITEBYTECODE is set (as on
    some machines) none of them writes what it compiled, so each compiled its modules again. Run in the controller
    only (xdist workers have `workerinput`); an unwritable tree just leaves them compiling."""
    if hasattr(config, "workerinput"):
        return
    import compileall

    compileall.compile_dir(TESTS.parent / "raybench", quiet=2, workers=1)


def _quiet_background_ray() -> None:
    """Every Ray the suite starts (the session's, and those of the clusters and drivers it starts as subprocesses,
    which inherit this environment) runs for minutes, mostly idle between tests: its daemons' metrics export and the
    log monitor's file-name scan every 0.1 s cost 4.3 CPU-s a minute per idle instance (measured on
    the 2-core VM), 2.9 without them. Nothing here reads Ray's metrics; the log monitor still forwards every line, it
    only looks for new log files every 2 s. The other four settings took an idle instance from 3.4 to 2.9 CPU-s per
    90 s (both measured side by side; what is left is mostly each worker's 10 ms signal check, not configurable):
    - REPORTER_UPDATE_INTERVAL_MS: the dashboard agent samples every Ray process (psutil) for the dashboard's node
      view every 5 s; nothing here opens a dashboard or reads those stats (the autoscaler reads the GCS, not them).
    - RAY_task_events_report_interval_ms=0: every worker and the driver stop sending task state events to the GCS,
      which stores them for `ray list tasks`, `ray.util.state` and timelines; nothing in tests/ or raybench uses
      those (task results, errors and actor deaths do not travel that way).
    - RAY_event_stats=0: no per-handler timing of every event-loop callback in the raylet, GCS and workers; it only
      feeds the debug_state files and logs.
    - AUTOSCALER_UPDATE_INTERVAL_S: the monitor of a `ray.init` or `ray start` without an autoscaling config has no
      node to add; tests/infra/test_autoscaling.py, whose autoscaler must act, sets its own (1 s).
    Liveness checks, heartbeats and timeouts are left as they are: tests kill nodes and drivers and wait for Ray to
    notice. A variable already set wins."""
    for var, value in QUIET_RAY.items():
        os.environ.setdefault(var, value)


_quiet_background_ray()

SHARED = Path(__file__).resolve().parents[2] / "shared"
PTBXL_SAMPLE = Path(os.environ.get("RAYBENCH_PTBXL_SAMPLE", SHARED / "ptbxl-sample"))


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray instance shared by every test that needs Ray.

    num_gpus=1 is a *logical* GPU: fractional requests (0.25) schedule on this CPU box, which is how
    the GPU code paths are exercised without hardware.
    """
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    yield ray
    # left running for the remaining tests; pytest's process exit shuts it down


@pytest.fixture(scope="session")
def ray_address(ray_cluster) -> str:
    """The session Ray's GCS address: a driver started as a subprocess attaches there through RAY_ADDRESS, as
    raybench's init_ray does, instead of starting (and paying for) a Ray of its own."""
    return ray_cluster.get_runtime_context().gcs_address


@pytest.fixture(scope="session")
def finished_small_run(tmp_path_factory, ray_cluster):
    """One small run through every stage of `raybench grid` (tests/small_run.py finished_config), built once per
    session: (config, stage timings, printed lines). Read it as it is; change a copy (small_run.copy_run)."""
    from raybench.app.pipeline import run_pipeline
    from tests.small_run import finished_config

    cfg = finished_config(tmp_path_factory.mktemp("finished") / "run")
    lines: list[str] = []
    timings = run_pipeline(cfg, echo=lines.append)
    return cfg, timings, lines


@pytest.fixture(scope="session")
def encoded_small_run(tmp_path_factory, ray_cluster):
    """tests/small_run.py's small_config encoded (cohort, manifest, both demo encoders' activations), built once per
    session for the grid tests (tests/sae/test_grid.py, test_grid_elastic.py): read it, train on a copy."""
    from tests.small_run import build_encoded_run, small_config

    return build_encoded_run(small_config(tmp_path_factory.mktemp("encoded") / "run"))


@pytest.fixture(scope="session")
def ptbxl_sample() -> Path:
    if not (PTBXL_SAMPLE / "ptbxl_database.csv").exists():
        pytest.skip(f"PTB-XL sample not found at {PTBXL_SAMPLE}")
    return PTBXL_SAMPLE


# session-scoped built runs: the modules using one of them share one xdist worker (one group per fixture)
SHARED_RUN_FIXTURES = ("finished_small_run", "encoded_small_run")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, the README's command): the tests that share a built fixture go
    to one worker, so it is still built once: a module's tests that use a module-scoped fixture (a built run, an
    encoded cohort) stay together, and every module using a shared session run joins one group. Every other
    test goes to whichever worker is free."""
    shared_by_module: dict[str, str] = {}
    grouped = []
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        shared = next((name for name in SHARED_RUN_FIXTURES if name in info.name2fixturedefs), None)
        if shared:
            shared_by_module.setdefault(item.module.__name__, shared)
        if shared or any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs):
            grouped.append(item)
    for item in grouped:
        module = item.module.__name__
        item.add_marker(pytest.mark.xdist_group(shared_by_module.get(module, module)))
    _longest_first(items)


# modules whose tests run longest (whole seconds on the 2-core box, two workers: --durations), started first
LONG_MODULES = ("tests/sae/test_grid_elastic.py",  # ~110: clusters with nodes added and killed, a killed driver
                "tests/app/test_remote_run.py",  # ~60: a `ray start` cluster, Ray Jobs, S3
                "tests/infra/test_autoscaling.py",  # ~50: the autoscaler adds GPU workers from zero, removes them
                "tests/app/test_cluster_onprem.py",  # ~90 (520-576 at load 35-50): `ray up` over SSH, a submitted grid
                "tests/test_discrimination.py", "tests/infra/test_progress.py", "tests/test_gpu_check.py",
                "tests/analysis/secondary/test_calibration.py", "tests/test_bench.py")


def _longest_first(items: list) -> None:
    """The longest modules first (each module's tests stay together and in order, so module fixtures are still
    built once), then the rest with the most slow tests first: the workers start on the long end-to-end tests
    and fill the end with short ones, instead of one worker finishing a long test alone."""
    modules: dict[str, list] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)

    def weight(path: str) -> tuple[int, int]:
        long = LONG_MODULES.index(path) if path in LONG_MODULES else len(LONG_MODULES)
        return long, -sum(1 for i in modules[path] if i.get_closest_marker("slow"))

    items[:] = [i for path in sorted(modules, key=weight) for i in modules[path]]  # stable sort
