"""The ECG paper drawing: 25 mm/s and 10 mm/mV in the layout's millimetres, the 3 x 4 + rhythm layout."""

from __future__ import annotations

import numpy as np
import pytest

from raybench.analysis.features.ecg_paper import (
    LAYOUT,
    PULSE_MM,
    PaperCanvas,
    layout_segments,
    paper_size_mm,
    record_figure,
)
from raybench.cohorts.waveforms import LEADS


def test_scale_is_25_mm_per_second_and_10_mm_per_millivolt():
    fs = 100.0
    sig = np.zeros((12, 1000))
    sig[LEADS.index("II"), 500:] = 1.0  # a 1 mV step at t = 5 s in lead II
    pieces = layout_segments(sig, fs)
    rhythm = pieces[-1]
    assert rhythm[0] == "II" and rhythm[1] == 3
    x, y = rhythm[2], rhythm[3]
    assert x[0] == PULSE_MM and x[100] - x[0] == pytest.approx(25.0)  # 1 s
    assert y[600] - y[100] == pytest.approx(10.0)  # 1 mV (the median of the strip is subtracted)
    assert x[-1] - x[0] == pytest.approx(999 / fs * 25.0)


def test_layout_is_3_by_4_columns_of_simultaneous_leads_plus_rhythm():
    sig = np.arange(12)[:, None] * np.ones((12, 2000))
    pieces = layout_segments(sig, 200.0)
    assert [p[0] for p in pieces[:-1]] == [lead for row in LAYOUT for lead in row]
    starts = {p[0]: p[2][0] for p in pieces[:-1]}
    assert starts["I"] == starts["II"] == starts["III"] == PULSE_MM
    assert starts["V4"] == starts["V5"] == starts["V6"] == pytest.approx(PULSE_MM + 7.5 * 25.0)
    assert paper_size_mm()[0] == PULSE_MM + 250.0


def test_short_records_and_bad_shapes():
    pieces = layout_segments(np.ones((12, 400)), 100.0)  # 4 s: four columns of 1 s
    assert pieces[1][0] == "aVR" and pieces[1][2][0] == pytest.approx(PULSE_MM + 25.0)  # aVR starts at 1 s
    with pytest.raises(ValueError, match="12 leads"):
        layout_segments(np.ones((8, 400)), 100.0)


def test_png_is_deterministic_and_figure_has_printed_size():
    rng = np.random.default_rng(1)
    sig = rng.normal(scale=0.2, size=(12, 500)).astype(np.float32)
    canvas = PaperCanvas(dpi=60)
    a = canvas.png(sig, 50.0, "record 1")
    assert a[:8] == b"\x89PNG\r\n\x1a\n" and canvas.png(sig, 50.0, "record 1") == a
    assert canvas.png(sig * 2, 50.0, "record 1") != a
    w, h = paper_size_mm()
    assert tuple(record_figure(sig, 50.0).get_size_inches()) == pytest.approx((w / 25.4, h / 25.4))
