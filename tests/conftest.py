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
def ptbxl_sample() -> Path:
    if not (PTBXL_SAMPLE / "ptbxl_database.csv").exists():
        pytest.skip(f"PTB-XL sample not found at {PTBXL_SAMPLE}")
    return PTBXL_SAMPLE
