"""BCa and basic intervals against scipy.stats.bootstrap; interval-bias detection in finished tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from raybench.analysis.reliability.intervals import (
    basic_interval,
    bca_interval,
    outside_rows,
    quantile_mc_sd,
    shifted_interval,
)


def _draws(x: np.ndarray, b: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return x[rng.integers(0, x.size, size=(b, x.size))].mean(axis=1)


def test_bca_and_basic_match_scipy():
    x = np.random.default_rng(0).exponential(size=60)
    b = 40000
    draws = _draws(x, b, 1)[:, None]
    point = np.array([x.mean()])
    jack = np.array([(x.sum() - v) / (x.size - 1) for v in x])[:, None]
    lo, hi = bca_interval(draws, point, jack)
    ref = stats.bootstrap((x,), np.mean, n_resamples=b, method="BCa", random_state=2).confidence_interval
    width = ref.high - ref.low
    assert lo[0] == pytest.approx(ref.low, abs=0.03 * width) and hi[0] == pytest.approx(ref.high, abs=0.03 * width)
    blo, bhi = basic_interval(draws, point)
    ref = stats.bootstrap((x,), np.mean, n_resamples=b, method="basic", random_state=2).confidence_interval
    assert blo[0] == pytest.approx(ref.low, abs=0.03 * width) and bhi[0] == pytest.approx(ref.high, abs=0.03 * width)


def test_bca_is_undefined_when_every_draw_is_on_one_side_and_the_shift_recentres():
    draws = np.linspace(1.0, 2.0, 101)[:, None]
    lo, hi = bca_interval(draws, np.array([0.5]), np.linspace(0.4, 0.6, 10)[:, None])
    assert np.isnan(lo[0]) and np.isnan(hi[0])
    slo, shi = shifted_interval(draws, np.array([0.5]))
    assert slo[0] < 0.5 < shi[0]


def test_quantile_mc_sd_tracks_reseeds():
    x = np.random.default_rng(0).normal(size=80)
    ends = [np.percentile(_draws(x, 2000, s), 2.5) for s in range(40)]
    est = quantile_mc_sd(_draws(x, 2000, 99)[:, None], 2.5)[0]
    assert est == pytest.approx(np.std(ends, ddof=1), rel=0.5)


def test_outside_rows_finds_points_outside_their_interval():
    prof = pd.DataFrame({"model": ["a", "b"], "metric": ["accessibility"] * 2, "auc": [0.05, 0.2],
                         "ci_low": [0.051, 0.1], "ci_high": [0.07, 0.3]})
    rep = pd.DataFrame({"model": ["a"], "measure": ["excess"], "auc": [0.5], "ci_low": [0.6], "ci_high": [0.7]})
    got = outside_rows({"profiles": prof, "reproducibility_auc": rep, "cells": pd.DataFrame({"x": [1]})})
    assert list(got.table) == ["profiles", "reproducibility_auc"]
    assert list(got.metric) == ["accessibility", "reproducibility"] and got.row.iloc[0].startswith("model=a")
