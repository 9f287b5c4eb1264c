"""The sparsity-arm figure as published (Figure 5c-e): one point per model, its common-scale AUC under each arm."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.collections import PathCollection

from raybench.analysis.atlas.figures import FIGURES, fig_sensitivity_arm

MODELS = ["cardiac_fm", "csfm", "ecg_fm"]


def arm_aucs() -> pd.DataFrame:
    rows = []
    for k, metric in enumerate(("reconstruction", "accessibility", "coverage", "dead_fraction")):
        for i, m in enumerate(MODELS):
            p = 0.5 + 0.1 * k + 0.01 * i
            rows.append((metric, m, p, p - 0.02 * (i + 1), -0.02 * (i + 1)))
    return pd.DataFrame(rows, columns=["metric", "model", "primary_auc", "sensitivity_auc", "diff"])


def test_one_point_per_model_at_its_two_arm_aucs():
    table = arm_aucs()
    fig = fig_sensitivity_arm({"arm_auc_differences": table})
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert len(axes) == 3  # reconstruction, accessibility, coverage: the published panels (no dead fraction)
    for ax, metric in zip(axes, ("reconstruction", "accessibility", "coverage"), strict=True):
        pts = np.vstack([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
        sub = table[table.metric == metric]
        assert pts.shape == (len(MODELS), 2)  # one point per model, not one per E or seed
        np.testing.assert_allclose(pts, sub[["primary_auc", "sensitivity_auc"]].to_numpy())
        lo = min(sub.primary_auc.min(), sub.sensitivity_auc.min())
        hi = max(sub.primary_auc.max(), sub.sensitivity_auc.max())
        pad = max((hi - lo) * 0.08, 1e-4)  # square limits padded as published, the diagonal across them
        np.testing.assert_allclose(ax.get_xlim(), (lo - pad, hi + pad))
        np.testing.assert_allclose(ax.get_ylim(), ax.get_xlim())
        (diag,) = ax.lines
        np.testing.assert_allclose(diag.get_xdata(), diag.get_ydata())


def test_drawn_from_the_arm_auc_table_only():
    spec = next(s for s in FIGURES if s.stem == "sensitivity_arm")
    assert spec.needs == ("arm_auc_differences",)
    assert fig_sensitivity_arm({"arm_auc_differences": arm_aucs()[lambda d: d.metric == "dead_fraction"]}) is None
