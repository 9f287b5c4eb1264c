"""Seed profiles, their noise and the contrast flags, by hand."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.reliability.mrd import mrd
from raybench.analysis.reliability.seeds import contrast_flags, profile_noise, seed_profiles


def _long() -> pd.DataFrame:
    rows = []
    for m, base in (("a", 0.5), ("b", 0.3)):
        for s, off in (("1", 0.0), ("2", 0.02), ("3", -0.02)):
            for q in (0.0, 1.0):
                rows += [("accessibility", m, q, 1, s, base + off), ("accessibility", m, q, 4, s, base + off + 0.1)]
    rows.append(("accessibility", "a", 0.5, 1, "1", 9.0))  # a depth without every E: left out
    return pd.DataFrame(rows, columns=["metric", "model", "q", "expansion", "seed", "value"])


def test_seed_profiles_are_the_per_seed_common_scale_auc():
    prof = seed_profiles(_long(), [1, 4])
    got = prof.set_index(["model", "seed"]).value
    assert got[("a", "1")] == pytest.approx(0.55) and got[("b", "2")] == pytest.approx(0.37)  # mean of the two ends
    noise = profile_noise(prof).iloc[0]
    assert noise.s_seed_profile == pytest.approx(0.02) and noise.df_seed_profile == 4 and noise.n_seeds == 3
    assert noise.spread_models == pytest.approx(np.std([0.55, 0.35], ddof=1)) and noise.tau_seeds == 1.0


def test_one_model_has_no_model_order_to_agree_on_and_no_warning(recwarn):
    """A one-model grid (auditing a single encoder): tau_seeds is NaN, quietly; the other columns are as usual."""
    prof = seed_profiles(_long().query("model == 'a'"), [1, 4])
    noise = profile_noise(prof).iloc[0]
    assert np.isnan(noise.tau_seeds) and np.isnan(noise.spread_models)
    assert noise.s_seed_profile == pytest.approx(0.02) and noise.n_seeds == 3
    assert not recwarn.list, [str(w.message) for w in recwarn.list]


def test_contrast_flags_compare_each_difference_with_the_mrd():
    con = pd.DataFrame({"metric": ["accessibility"] * 2, "model_a": ["a", "a"], "model_b": ["b", "c"],
                        "diff": [0.2, -0.01]})
    d3 = mrd(0.02, 3)
    got = contrast_flags({"contrasts": con}, {"accessibility": d3})
    assert list(got.below_mrd_3) == [False, True] and got.mrd_3.iloc[0] == pytest.approx(d3)
