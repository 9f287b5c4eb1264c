"""bench/gpu_check.py: its projection and GPU-path bootstrap by hand and against raybench, and the whole check in
`--smoke` mode (CPU, one logical Ray GPU: the code path a CUDA machine runs). Its figures are not asserted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from raybench.core.config import ModelDims, paper_protocol

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402  (bench/ is not a package)


def test_projection_interpolates_in_e_and_counts_every_stack():
    dims = {m: ModelDims(n_layers=12, d=768) for m in paper_protocol().grid.models}
    step = {(768, "primary", 1): 0.01, (768, "primary", 8): 0.02, (768, "primary", 32): 0.05,
            (768, "sensitivity", 1): 0.01, (768, "sensitivity", 8): 0.02, (768, "sensitivity", 32): 0.06}
    total, wall, cells = gpu_check.projected_grid(paper_protocol(), dims, step, 4)
    # primary: 30 stacks per E at E 1, 4, 8, 16, 32 (E 4 and 16 interpolated linearly between measured E)
    primary = 30 * (0.01 + (0.01 + 3 / 7 * 0.01) + 0.02 + (0.02 + 8 / 24 * 0.03) + 0.05)
    sensitivity = 6 * (0.01 + (0.01 + 3 / 7 * 0.01) + 0.02 + (0.02 + 8 / 24 * 0.04) + 0.06)
    assert cells == 540
    assert total == pytest.approx(8000 * (primary + sensitivity)) and wall == pytest.approx(total / 4)
    # a width that was not measured scales with (d / d_measured)^2
    half = {m: ModelDims(n_layers=12, d=384) for m in dims}
    assert gpu_check.projected_grid(paper_protocol(), half, step, 4)[0] == pytest.approx(total / 4)


def test_max_overlap():
    assert gpu_check._max_overlap([(0, 2), (1, 3), (2.5, 4), (5, 6)]) == 2
    assert gpu_check._max_overlap([]) == 0


def test_torch_bootstrap_matches_raybench_cpu_bootstrap(ray_cluster):
    from raybench.analysis.inference.bootstrap import patient_bootstrap

    stats = gpu_check._packed(7, 40, 55, 5, 3)  # 3 cell blocks, the last one short
    want = patient_bootstrap(stats, 120, 99, 50)  # 3 chunks, the last one short
    got = gpu_check.torch_patient_bootstrap(stats, 120, 99, 50, "cpu")
    assert got.shape == (120, 7, 3)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.slow
def test_smoke_runs_every_part_on_the_fractional_gpu_path(tmp_path, ray_address):
    """In the session's Ray (2 CPUs, one logical GPU: what --smoke starts on its own), attached through RAY_ADDRESS as
    raybench's init_ray does: no second Ray start and stop. One expansion (smoke's default is 1 and 32): two Tune
    trials (one per arm), each in its own process since trial processes are reused only in a Ray raybench started
    (raybench.infra.resources.resolve_reuse_trial_processes), each with its share of the logical GPU; the
    projection's interpolation in E is test_projection_interpolates_in_e_and_counts_every_stack's."""
    env = {**os.environ, "RAY_ADDRESS": ray_address}
    proc = subprocess.run(["bash", "bench/gpu_check.sh", "--smoke", "--expansions", "1", "--workdir", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-4000:]
    assert "passed env, encode, train, bootstrap; failed -" in out, out
    assert "GPU per actor x 1 actors on cpu (gpu 0 assigned)" in out  # the actor got a share, fell back to CPU
    assert out.count("on cpu (gpu ids [0])") == 2  # 2 Tune trials, each with a share of the logical GPU
    assert "projection: the published grid" in out and "max |cpu - CPU Ray|" in out
