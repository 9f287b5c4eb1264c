"""The audit's summary from its tables (no Ray): every criterion's state, the verdict, the closing note."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from raybench.analysis.reliability import seeds
from raybench.analysis.reliability.reseed import per_cell
from raybench.analysis.reliability.run import SUMMARY_COLUMNS, _summary, closing_note
from raybench.core.config import ReliabilityConfig


def _tables(rng: np.random.Generator) -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    models = [f"m{i}" for i in range(6)]
    long = pd.DataFrame([("reconstruction", m, q, e, str(s), 0.9 + 0.02 * i + 0.002 * rng.normal())
                         for (i, m), q, e, s in itertools.product(enumerate(models), (0.0, 1.0), (1, 8), (1, 2, 3))],
                        columns=seeds.LONG_COLUMNS)
    fractions = np.linspace(0, 1, 9)
    training = pd.DataFrame([(m, 0.0, 8, s, f, int(f * 80), "reconstruction",
                              0.9 + 0.02 * i - 0.3 * (1 - f) ** 2 + 0.002 * rng.normal())
                             for (i, m), s, f in itertools.product(enumerate(models), (1, 2, 3), fractions)],
                            columns=["model", "q", "expansion", "seed", "fraction", "step", "metric", "value"])
    reseed = pd.DataFrame([("selection_subset", m, 0.0, 8, s, r, "reconstruction", 0.9)
                           for m, s, r in itertools.product(models, (1, 2, 3), range(5))],
                          columns=["source", "model", "q", "expansion", "seed", "reseed", "metric", "value"])
    out = {"reliability_training": training, "reliability_reseed": reseed,
           "reliability_reseed_cells": per_cell(reseed, selection_drawn=False),
           "reliability_panel_rho": pd.DataFrame({"metric": ["reconstruction"], "rho_gt_mcc": [0.8],
                                                  "p_gt_mcc": [1e-5], "rho_gt_f1": [0.2], "p_gt_f1": [0.2],
                                                  "n_gt": [20]}),
           "reliability_outside": pd.DataFrame(columns=["metric"])}
    return out, long


def test_summary_states_and_verdict_of_a_clean_metric():
    out, long = _tables(np.random.default_rng(0))
    noise = seeds.profile_noise(seeds.seed_profiles(long, [1, 8])).set_index("metric")
    summary, mrd3 = _summary(out, noise, long, {}, ReliabilityConfig())
    row = summary.set_index("metric").loc["reconstruction"]
    assert list(summary.columns) == SUMMARY_COLUMNS[:-1]
    assert row.state_share_snapshots == "pass" and row.state_share_cells == "pass" and row.state_snr == "pass"
    assert row.state_training == "pass" and row.state_ground_truth == "pass" and row.state_rank_agreement == "pass"
    assert row.state_reseed == "not assessed"  # R^2 involves no draw: its zero spread is no evidence
    assert row.winners == 1 and row.snr > 2  # the trend stays in V_snap (paper S.4) but leaves SNR alone
    assert row.share_snapshots > 0.2 and row.share_cells > 0.9
    assert row.verdict == "reliable" and np.isfinite(mrd3["reconstruction"])
    note = closing_note(summary)
    assert "reconstruction" in note and "reliable" in note


def test_too_few_snapshots_leave_the_papers_design_not_assessed():
    out, long = _tables(np.random.default_rng(1))
    noise = seeds.profile_noise(seeds.seed_profiles(long, [1, 8])).set_index("metric")
    summary, _ = _summary(out, noise, long, {}, ReliabilityConfig(warmup_fraction=0.5))  # 5 post-warmup snapshots
    row = summary.iloc[0]
    assert row.state_share_snapshots == "not assessed" and row.state_snr == "not assessed"
    assert row.state_share_cells == "pass" and row.state_training == "pass"


def test_reproducibility_keeps_its_training_series_and_its_pair_aware_null():
    """Reproducibility's snapshots are per stack (seed -1) and its cells are seed pairs: the trend is assessed
    from those series, and the pairs are read by the pair-aware null."""
    rng = np.random.default_rng(2)
    models = [f"m{i}" for i in range(6)]
    long = pd.DataFrame([("reproducibility", m, q, e, pair, 0.1 * i + 0.01 * rng.normal())
                         for (i, m), q, e, pair in itertools.product(enumerate(models), (0.0, 1.0), (1, 8),
                                                                      ("1-2", "1-3", "2-3"))],
                        columns=seeds.LONG_COLUMNS)
    training = pd.DataFrame([(m, 0.0, 8, -1, f, int(f * 80), "reproducibility", 0.1 * i + 0.2 * f)
                             for (i, m), f in itertools.product(enumerate(models), np.linspace(0, 1, 9))],
                            columns=["model", "q", "expansion", "seed", "fraction", "step", "metric", "value"])
    out = {"reliability_training": training, "reliability_outside": pd.DataFrame(columns=["metric"])}
    noise = seeds.profile_noise(seeds.seed_profiles(long, [1, 8])).set_index("metric")
    row = _summary(out, noise, long, {}, ReliabilityConfig())[0].iloc[0]
    assert row.metric == "reproducibility" and row.state_training == "pass" and row.rho_step == 1.0
    assert row.pairs == 1.0 and "pair-aware" in row.null_share_cells and row.share_cells_df == 12  # V (S - 1)
    assert row.class_stability == "pass" and row.verdict == "incomplete"  # no ground-truth panel here
