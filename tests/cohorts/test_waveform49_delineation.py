"""waveform49 delineation of the median beat: global QRS, P and T bounds against the beat model's exact supports."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.cohorts.waveform49.beats import record_beats
from raybench.cohorts.waveform49.delineation import _detrended, delineate
from tests.cohorts.waveform49_records import BASE, record

MS = 2.0  # ms per sample at the working rate


def _bounds(**changes):
    b = record_beats(record(**changes)[0], 500.0)
    d = delineate(b)
    return b, d


def test_qrs_onset_and_j_point_bracket_the_planted_qrs():
    for qrs in (80.0, 120.0):
        _, d = _bounds(qrs=qrs)
        assert (d.qrs_off - d.qrs_on) * MS == pytest.approx(qrs, abs=8)


def test_p_wave_sits_pr_before_the_qrs_and_inside_its_support():
    _, d = _bounds()
    assert d.p_on is not None and d.p_on < d.p_peak < d.p_off < d.qrs_on
    assert (d.qrs_on - d.p_peak) * MS == pytest.approx(BASE["pr"] - BASE["p_dur"] / 2, abs=6)
    assert (d.qrs_on - d.p_on) * MS <= BASE["pr"] + 4  # a threshold reads inside the support, never outside
    assert d.p_consistency > 0.9


def test_no_p_wave_is_found_where_none_is_drawn():
    _, d = _bounds(p_present=False)
    assert d.p_peak is None and d.p_on is None


def test_t_end_is_at_the_planted_qt_and_st_level_is_read_per_lead():
    b, d = _bounds(m_st=0.1)
    _, truth = record(m_st=0.1)
    assert (d.t_off - d.qrs_on) * MS == pytest.approx(truth["qt_interval"], abs=20)
    assert d.qrs_off < d.t_on < d.t_peak < d.t_off
    assert np.abs(d.st_level).max() * 1000 == pytest.approx(abs(truth["st_amp_global"]), rel=0.05)


def test_the_t_search_never_takes_the_next_p_wave_at_a_fast_rate():
    _, d = _bounds(hr=115.0, m_st=0.25, st_region=0)
    _, truth = record(hr=115.0, m_st=0.25)
    assert (d.t_off - d.qrs_on) * MS == pytest.approx(truth["qt_interval"], abs=25)


def test_detrending_removes_a_straight_line():
    x = np.linspace(-1.0, 3.0, 200)[None, :] * np.ones((12, 1))
    assert np.abs(_detrended(x)).max() < 0.05
