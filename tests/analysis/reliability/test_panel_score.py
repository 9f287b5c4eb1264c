"""Panel scores without Ray: task metrics by family and task seed by hand, and the oracle against a
trained SAE scored by the grid's own evaluator."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.analysis.reliability.ground_truth import SyntheticSpec, in_sae_features, synthetic_data
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


def test_the_oracle_has_a_members_width_as_the_papers():
    spec = SyntheticSpec(n_records=1500)
    data = synthetic_data(spec)
    p = demo_protocol()
    y, fams, seeds = tasks(data, 2 * spec.d, (0, 1))
    res = train_stack(data.x[splits(1500)["train"]], _cfgs(p.sae, spec.d, 2 * spec.d, 12, 60, PanelSpec()),
                      implementation="auto")
    rows = score_stack(res.sae, res.normalizer, data, y, fams, seeds, p.eval)
    orc = oracle_scores(data, res.normalizer, y, fams, seeds, p.eval, 2 * spec.d)
    full = oracle_scores(data, res.normalizer, y, fams, seeds, p.eval, spec.n_features)
    assert len(rows) == len(SEEDS)
    test_fires = (data.acts[splits(1500)["test"]][:, in_sae_features(data.acts, 2 * spec.d)] > 0).any(axis=0)
    assert orc["gt_mcc"] == pytest.approx(1.0) and orc["gt_f1"] == pytest.approx(test_fires.mean())  # dead: 0
    assert orc["gt_f1"] > max(r["gt_f1"] for r in rows)
    # the 192 in-SAE directions leave the out-of-SAE features unexplained; all 384 leave only the noise (sd 0.02)
    assert full["reconstruction"] > 0.98 > orc["reconstruction"]
    assert orc["l0"] < full["l0"] and orc["l0"] > 0.5 * full["l0"]  # most firing is by the most frequent features
