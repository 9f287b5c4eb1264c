"""waveform49 beats: QRS detection from all leads, the PR-knot baseline, the median beat, unusable signals."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.cohorts.extractor_rules import ConceptError
from raybench.cohorts.waveform49.beats import FS, ms, qrs_peaks, record_beats, remove_baseline, to_working_rate
from tests.cohorts.waveform49_records import record


def test_every_beat_is_found_once_at_its_rr():
    sig, _ = record(hr=75.0)  # RR 800 ms exactly, QRS onsets at 300, 1100, ..., 9900 ms
    b = record_beats(sig, 500.0)
    np.testing.assert_allclose(b.rr_ms, 800.0, atol=2.0)
    assert b.peaks.size == 13 and b.template.shape == (12, ms(450.0) + ms(700.0))


def test_rate_and_template_do_not_depend_on_the_sampling_rate():
    b500 = record_beats(record()[0], 500.0)
    b100 = record_beats(record(fs=100.0)[0], 100.0)
    np.testing.assert_allclose(b100.rr_ms.mean(), b500.rr_ms.mean(), atol=1.0)
    assert to_working_rate(np.zeros((12, 1000)), 100.0).shape == (12, 5000)


def test_baseline_wander_is_removed_at_the_pr_segments():
    sig, _ = record()
    t = np.arange(sig.shape[1]) / 500.0
    wander = 0.4 * np.sin(2 * np.pi * 0.3 * t)[None, :] * np.linspace(0.5, 1.0, 12)[:, None]
    clean, wandering = record_beats(sig, 500.0), record_beats(sig + wander, 500.0)
    beat = slice(clean.fid - ms(300.0), clean.fid + ms(450.0))  # P onset to T end
    assert np.abs(wandering.template[:, beat] - clean.template[:, beat]).max() < 0.03  # mV, against a 0.4 mV wander


def test_baseline_knots_sit_on_the_flat_pr_segment():
    x = np.zeros((12, 3000)) + 0.2  # an offset the knots must remove
    peaks = np.array([500, 1300, 2100])
    for p in peaks:
        x[:, p - 10:p + 10] += 1.0  # a "QRS" at each peak
    y = remove_baseline(x, peaks)
    assert np.abs(y[:, 600:1200]).max() < 1e-12


@pytest.mark.parametrize(("sig", "reason"), [
    (np.zeros((12, 500)), "too_short"),          # 1 s
    (np.zeros((12, 5000)), "too_few_beats"),     # nothing to detect
])
def test_unusable_signals_raise_their_reason(sig, reason):
    with pytest.raises(ConceptError) as err:
        record_beats(sig, FS)
    assert err.value.reason == reason


def test_a_single_beat_is_too_few():
    sig, _ = record(hr=40.0, seconds=1.6)  # one QRS, at 300 ms
    with pytest.raises(ConceptError, match="QRS complexes"):
        record_beats(sig, 500.0)


def test_peaks_ignore_t_waves():
    sig, _ = record(m_tprec=1.2, m_t=0.6)  # tall T waves
    assert qrs_peaks(sig.astype(float)).size == 13
