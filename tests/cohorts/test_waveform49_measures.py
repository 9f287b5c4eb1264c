"""waveform49 measures: the pure helpers on hand-made arrays, and all 49 concepts of hand-set records
against what the synthetic beat model says they are (raybench.cohorts.synth_truth)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from raybench.cohorts.panel import concept_names
from raybench.cohorts.waveform49 import measure_signal49, measure_signal49_reasons
from raybench.cohorts.waveform49.measures import frontal_axis, qrs_amplitudes, signed_extreme
from tests.cohorts.waveform49_records import record

HEX = {"I": 0.0, "II": 60.0, "III": 120.0}


@pytest.mark.parametrize("axis", [0.0, 45.0, -60.0, 120.0, 180.0, -150.0, 90.0])
def test_frontal_axis_recovers_the_direction_of_exact_projections(axis):
    limb3 = [2.0 * math.cos(math.radians(axis - a)) for a in HEX.values()]
    got = frontal_axis(np.array(limb3))
    assert abs(((got - axis + 180.0) % 360.0) - 180.0) < 1e-9
    assert -180.0 < got <= 180.0


def test_frontal_axis_of_nothing_is_nan():
    assert math.isnan(frontal_axis(np.zeros(3)))


def test_qrs_amplitudes_read_q_before_and_s_after_the_r_peak():
    y = np.array([[0.0, -0.1, 0.5, 1.0, 0.2, -0.4, -0.1, 0.0],   # qRs
                  [0.0, -0.2, -0.8, -0.5, -0.1, 0.0, 0.0, 0.0],  # QS: no R, the whole deflection is S or Q
                  [0.0, 0.3, 0.6, 0.2, 0.0, 0.0, 0.0, 0.0]])     # R only
    q, r, s = qrs_amplitudes(y, 0, 7)
    np.testing.assert_allclose(r, [1.0, 0.0, 0.6])
    np.testing.assert_allclose(q, [-0.1, 0.0, 0.0])
    np.testing.assert_allclose(s, [-0.4, -0.8, 0.0])


def test_a_terminal_st_elevation_higher_than_a_small_r_is_not_the_r_wave():
    # rS complex (r 0.1, S -1.2) ending in an ST elevation of 0.3 at the J point (V1 with anterior elevation)
    y = np.array([[0.0, 0.05, 0.1, 0.05, -0.6, -1.2, -0.6, 0.1, 0.3]])
    q, r, s = qrs_amplitudes(y, 0, 8)
    assert (q[0], r[0], s[0]) == (0.0, 0.1, -1.2)


def test_signed_extreme_keeps_the_sign_of_the_largest_deflection():
    y = np.array([[0.0, 0.2, -0.5, 0.1], [0.0, 0.3, -0.1, 0.0]])
    np.testing.assert_allclose(signed_extreme(y, 0, 3), [-0.5, 0.3])
    np.testing.assert_allclose(signed_extreme(y, 0, 1), [0.2, 0.3])


def test_every_concept_of_a_noiseless_sinus_record_is_close_to_its_truth():
    sig, truth = record()
    got = measure_signal49(sig, 500.0)
    assert list(got) == concept_names()
    assert got["hr_ventricular"] == pytest.approx(75.0, abs=0.05) and got["rr_iqr"] == pytest.approx(0.0, abs=2.1)
    assert got["p_found"] == 1.0 and got["hr_atrial"] == pytest.approx(75.0, abs=0.05)
    # boundaries: within a threshold convention of the exact support (docs/protocol.md §4.4)
    assert got["qrs_duration"] == pytest.approx(truth["qrs_duration"], abs=8)
    assert got["pr_interval"] == pytest.approx(truth["pr_interval"], abs=25)
    assert got["qt_interval"] == pytest.approx(truth["qt_interval"], abs=20)
    for c in ("qrs_axis_front", "t_axis_front", "p_axis_front", "qrst_angle"):
        assert got[c] == pytest.approx(truth[c], abs=1.0), c
    for c in ("r_amp_global", "s_amp_global", "t_amp_global", "t_amp_limb", "p_amp_global", "qrs_area_global"):
        assert got[c] == pytest.approx(truth[c], rel=0.03), c
    rr_s = got["rr_mean"] / 1000.0
    assert got["qtc_bazett"] == pytest.approx(got["qt_interval"] / math.sqrt(rr_s))
    assert got["qtc_fridericia"] == pytest.approx(got["qt_interval"] / rr_s ** (1 / 3))
    assert got["qtc_framingham"] == pytest.approx(got["qt_interval"] + 154.0 * (1.0 - rr_s))


def test_a_record_without_p_waves_has_no_p_timing_with_the_reason():
    sig, _ = record(p_present=False)
    got, why = measure_signal49_reasons(sig, 500.0)
    assert got["p_found"] == 0.0 and got["p_amp_global"] == 0.0 and got["p_area_global"] == 0.0
    for c in ("pr_interval", "pq_interval", "p_duration_global", "p_axis_front", "hr_atrial"):
        assert math.isnan(got[c]) and why[c] == "no_p_wave", c
    assert got["hr_ventricular"] == pytest.approx(75.0, abs=0.05)


@pytest.mark.parametrize("changes", [{"qrs": 130.0}, {"qrs_axis": -60.0}, {"hr": 50.0}, {"hr": 110.0},
                                     {"pr": 210.0}, {"t_invert_ant": True}])
def test_what_is_planted_is_what_is_measured(changes):
    sig, truth = record(**changes)
    got = measure_signal49(sig, 500.0)
    assert got["qrs_duration"] == pytest.approx(truth["qrs_duration"], abs=8)
    assert got["qrs_axis_front"] == pytest.approx(truth["qrs_axis_front"], abs=3.0)
    assert got["hr_ventricular"] == pytest.approx(truth["hr_ventricular"], abs=0.1)
    assert got["pr_interval"] == pytest.approx(truth["pr_interval"], abs=25)
    assert got["t_amp_precordial"] == pytest.approx(truth["t_amp_precordial"], rel=0.03)


def test_noise_and_other_rates_change_little():
    _, truth = record()
    clean = measure_signal49(record()[0], 500.0)
    for fs, noise in ((500.0, 0.015), (250.0, 0.0), (100.0, 0.0)):
        got = measure_signal49(record(fs=fs, noise=noise, seed=3)[0], fs)
        assert got["hr_ventricular"] == pytest.approx(75.0, abs=0.5), fs
        assert got["qrs_duration"] == pytest.approx(clean["qrs_duration"], abs=12), fs
        assert got["qrs_axis_front"] == pytest.approx(truth["qrs_axis_front"], abs=3), fs
        assert got["r_amp_global"] == pytest.approx(truth["r_amp_global"], rel=0.1 if fs == 100.0 else 0.03), fs


def test_signal_shape_is_checked():
    with pytest.raises(ValueError, match=r"\[12, T\]"):
        measure_signal49(np.zeros((8, 5000)), 500.0)
