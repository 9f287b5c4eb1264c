"""Minimum reliable difference and pooled sd against hand-computed cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raybench.analysis.reliability.mrd import cv, mrd, pooled_sd


def test_mrd_matches_a_hand_computed_case():
    # t(0.975, 4) = 2.7764451; sqrt(2/3) = 0.8164966 -> 2.7764451 * 0.01 * 0.8164966
    assert mrd(0.01, 3) == pytest.approx(0.022669, abs=1e-6)
    # S = 2: t(0.975, 2) = 4.3026527, sqrt(1) -> 0.0430265
    assert mrd(0.01, 2) == pytest.approx(0.0430265, abs=1e-6)


def test_mrd_at_one_seed_needs_the_df_of_s():
    with pytest.raises(ValueError, match="df"):
        mrd(0.01, 1)
    # t(0.975, 10) = 2.2281389, sqrt(2) -> 0.0315108
    assert mrd(0.01, 1, df=10) == pytest.approx(0.0315108, abs=1e-6)
    assert math.isnan(mrd(float("nan"), 3))


def test_pooled_sd_and_cv_by_hand():
    s, df = pooled_sd([np.array([1.0, 2.0, 3.0]), np.array([4.0, 6.0]), np.array([9.0])])
    assert df == 3 and s == pytest.approx(math.sqrt(4.0 / 3.0))  # SS 2 + 2 over 2 + 1 df; a singleton adds nothing
    assert pooled_sd([np.array([1.0])]) == (pytest.approx(float("nan"), nan_ok=True), 0)
    assert cv(0.5, -2.0) == 0.25 and math.isnan(cv(1.0, 0.0))
