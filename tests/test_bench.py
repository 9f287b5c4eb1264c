"""The benchmark scripts still run and print their figures (tiny sizes; the figures themselves are not
asserted: performance claims live in bench/, not in tests)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sae.test_grid_elastic import ray_env

ROOT = Path(__file__).resolve().parents[1]


def _bench(args: list[str], timeout: float, ray_address: str | None = None) -> str:
    """Run a bench script; it starts its own local Ray, or with `ray_address` (the session's `ray_cluster`)
    attaches there through RAY_ADDRESS, as raybench's init_ray does (no second Ray start)."""
    env = ray_env() if ray_address is None else {**os.environ, "RAY_ADDRESS": ray_address}
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_sae_train_bench_prints_speed_targets_and_trajectory_rows():
    out = _bench(["bench/sae_train.py", "--threads", "1", "--expansions", "1", "--timed-steps", "1", "--rounds", "1",
                  "--warm-steps", "1", "--traj-steps", "3", "--traj-expansions", "1"], timeout=300)
    assert "published" in out and "raybench S=1" in out and "f64 published/raybench" in out
    rows = [line.split() for line in out.splitlines() if line.strip().startswith("1 ")]
    assert len(rows) == 2, out  # one speed row (published, raybench alone and as a stack) + one trajectory row
    assert rows[0][4].endswith("x") and rows[0][6].endswith("x")  # the two ratios
    targets = [line for line in out.splitlines() if line.strip().startswith("E=1 ")]
    assert len(targets) == 1 and ("PASS" in targets[0] or "FAIL" in targets[0]), out
    assert float(rows[1][1]) < 1e-4 and float(rows[1][5]) < 1e-6, out  # published loop vs raybench: f32, f64


def test_bootstrap_bench_names_the_gemm_kernel_and_matches_the_naive_recomputation():
    out = _bench(["bench/bootstrap.py", "--cells", "6", "--patients", "60", "--records", "80", "--draws", "40",
                  "--chunk-draws", "20", "--cells-per-block", "4", "--naive-draws", "1"], timeout=300)
    kernel = next(line for line in out.splitlines() if line.startswith("GEMM in the Ray workers: "))
    assert ", kernel " in kernel and ("forced by OPENBLAS_CORETYPE=" in kernel or "own choice" in kernel), kernel
    errors = re.search(r"R2 (\S+), accessibility (\S+), coverage (\S+)\)", out)
    assert errors and max(float(e) for e in errors.groups()) < 1e-12, out  # the packed GEMM = the record-level sums
    target = next(line for line in out.splitlines() if line.startswith("packing + bootstrap (pipelined): "))
    assert "target <= 12 s: " in target and "target <= 4 GiB: " in target, target


@pytest.mark.slow
def test_encode_bench_prints_both_paths_and_the_marginal_rate(tmp_path, ray_address):
    out = _bench(["bench/encode.py", "--records", "8", "12", "--models", "csfm", "--size", "demo",
                  "--batch-size", "4", "--workdir", str(tmp_path)], timeout=600,
                 ray_address=ray_address)
    assert out.count("ray/plain") == 3 and "marginal 8->12 records" in out, out
    assert "B/record/layer" in out


FAKE_GRID = """
import sys, time
from pathlib import Path
run = Path(sys.argv[sys.argv.index("--run-dir") + 1])
for i, stage in enumerate(("cohort", "train"), 1):
    if run.exists():
        print(f"[{i}/2] {stage:<9} complete, skipped")
    else:
        print(f"[{i}/2] {stage:<9} running ...")
        print(f"[{i}/2] {stage:<9} done in {0.5 * i:6.1f} s  (fake)")
run.mkdir(parents=True, exist_ok=True)
"""


def test_wall_targets_time_the_demo_its_rerun_and_the_suite(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    import wall_targets

    assert wall_targets.suite_command() == ["python3", "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup"]
    assert " ".join(wall_targets.suite_command()) in (ROOT / "README.md").read_text(), "README and .ci/run agree"
    script = tmp_path / "fake_grid.py"
    script.write_text(FAKE_GRID)
    out = _bench(["bench/wall_targets.py", "--workdir", str(tmp_path), "--grid", f"{sys.executable} {script}",
                  "--suite", f"{sys.executable} -c \"print('== 3 passed in 0.1s ==')\""], timeout=120)
    lines = out.splitlines()
    assert lines[0].startswith("demo end to end (fresh folder): ") and lines[0].endswith("(target <= 240 s): met")
    assert lines[1].startswith("  stages: cohort 0.5, train 1.0; outside the stages "), out
    assert lines[2].startswith("demo rerun, nothing to do: ") and "(2 stages skipped)" in lines[2], out
    assert lines[3].startswith("test suite (") and lines[3].endswith("(target <= 600 s): met; 3 passed in 0.1s")
    assert wall_targets.verdict(612.3, 600) == "612.3 s (target <= 600 s): MISSED"


@pytest.mark.slow  # a 12-record synthetic cohort in the session's Ray; 6 "real" records x 3 extractors
def test_concepts_validation_bench_prints_the_synthetic_and_the_statement_tables(tmp_path, ray_address):
    """Both tables and the speed line; the synthetic cohort's own database (NORM / AFIB statements, heart_axis)
    stands in for a PTB-XL folder with cardiologists' statements (6 records: the refined and published
    extractors measure each twice, ~0.2 s a record; 12 cost ~2 CPU-s more and print the same rows)."""
    from raybench.cohorts.panel import concept_names
    from raybench.cohorts.synth import generate_synth_cohort

    cohort = generate_synth_cohort(tmp_path / "cohort", 6, 3, seed=5)
    out = _bench(["bench/concepts_validation.py", "--synth-records", "12", "--synth-patients", "6", "--boot", "10",
                  "--cpus", "2", "--real", str(cohort)], timeout=600,
                 ray_address=ray_address)
    names = set(concept_names())
    rows = [line.split() for line in out.splitlines() if line.split() and line.split()[0] in names]
    assert len(rows) == 49 and all(row[1] in ("RATE_RHYTHM", "INTERVAL", "AXIS", "AMPLITUDE", "ST_T") for row in rows)
    assert re.search(r"short of r >= 0\.9: ", out)
    assert re.search(r"waveform49 manifest of 12 records in .* records/s", out)
    afib = [line for line in out.splitlines() if line.strip().startswith("AFIB vs NORM")]
    assert len(afib) == 2 and all("n/a" in line for line in afib), out  # rr_iqr, p_found: waveform49 only
    assert re.search(r"one process incl\. reading: waveform49 \d+ records/s, refined \d+ records/s", out)
