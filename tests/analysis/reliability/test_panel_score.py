"""Panel scores without Ray: task metrics by family and task seed by hand, and the exact oracle against a
trained SAE scored by the grid's own evaluator."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.analysis.reliability.ground_truth import SyntheticSpec, synthetic_data
from raybench.analysis.reliability.panel import SEEDS, PanelSpec, _cfgs
from raybench.analysis.reliability.panel_score import family_metrics, oracle_scores, score_stack, splits, tasks
from raybench.core.config import demo_protocol
from raybench.sae.train import train_stack


def test_family_metrics_by_hand():
    r = np.array([0.9, -0.5, 0.1, 0.3, 0.7, 0.2])
    fams = np.array(["in", "mixed", "out", "in", "mixed", "out"])
    seeds = np.array([0, 0, 0, 1, 1, 1])
    got = family_metrics(r, fams, seeds, threshold=0.4)
    assert got["accessibility"] == pytest.approx(np.mean([0.9, 0.5, 0.3, 0.7]))
    assert got["coverage"] == pytest.approx(0.75) and got["coverage_out"] == 0.0
    assert got["accessibility_out"] == pytest.approx(0.15)
    assert got["accessibility_task_sd"] == pytest.approx(np.std([0.7, 0.5], ddof=1))


def test_exact_oracle_bounds_a_trained_sae():
    spec = SyntheticSpec(n_records=1500)
    data = synthetic_data(spec)
    p = demo_protocol()
    y, fams, seeds = tasks(data, 2 * spec.d, (0, 1))
    res = train_stack(data.x[splits(1500)["train"]], _cfgs(p.sae, spec.d, 2 * spec.d, 12, 60, PanelSpec()),
                      implementation="auto")
    rows = score_stack(res.sae, res.normalizer, data, y, fams, seeds, p.eval)
    orc = oracle_scores(data, res.normalizer, y, fams, seeds, p.eval)
    assert len(rows) == len(SEEDS)
    assert orc["gt_mcc"] == pytest.approx(1.0) and orc["gt_f1"] == pytest.approx(1.0)
    assert orc["reconstruction"] >= max(r["reconstruction"] for r in rows)
    assert orc["reconstruction"] > 0.98  # only the noise (sd 0.02) is left
    assert orc["gt_f1"] > max(r["gt_f1"] for r in rows)
