"""The benchmark scripts still run and print their figures (tiny sizes; the figures themselves are not
asserted: performance claims live in bench/, not in tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.sae.test_grid_elastic import ray_env

ROOT = Path(__file__).resolve().parents[1]


def _bench(args: list[str], timeout: float) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=ray_env(), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_sae_train_bench_prints_speed_and_trajectory_rows():
    out = _bench(["bench/sae_train.py", "--threads", "1", "--expansions", "1", "--timed-steps", "1",
                  "--warm-steps", "1", "--traj-steps", "3"], timeout=300)
    assert "dense st/s" in out and "f64 sparse/dense" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("1 ")]
    assert len(rows) == 3, out  # two speed rows (single, stack of 3) + one trajectory row


@pytest.mark.slow
def test_encode_bench_prints_both_paths_and_the_marginal_rate(tmp_path):
    out = _bench(["bench/encode.py", "--records", "8", "12", "--models", "csfm", "--size", "demo",
                  "--batch-size", "4", "--workdir", str(tmp_path)], timeout=600)
    assert out.count("ray/plain") == 3 and "marginal 8->12 records" in out, out
    assert "B/record/layer" in out
