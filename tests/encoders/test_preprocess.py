"""raybench.encoders.preprocess: the filters designed once per process give scipy's numbers exactly."""

import numpy as np
import pytest
from scipy import signal as sps

from raybench.encoders.preprocess import bandpass, butter_sos, decimate


@pytest.mark.parametrize("q", [2, 5])
def test_decimate_equals_scipy_bit_for_bit(q):
    x = np.random.default_rng(q).standard_normal((3, 2500))
    assert np.array_equal(decimate(x, q), sps.decimate(x, q))
    assert np.array_equal(decimate(x[0], q), sps.decimate(x[0], q))  # 1-D, as HuBERT-ECG's flattened record


def test_butter_sos_is_scipys_design_and_a_caller_cannot_change_the_cached_one():
    sos = butter_sos(5, 0.5, "highpass", 500.0)
    assert np.array_equal(sos, sps.butter(5, 0.5, btype="highpass", fs=500.0, output="sos"))
    sos[0, 0] = 123.0
    assert np.array_equal(butter_sos(5, 0.5, "highpass", 500.0), sps.butter(5, 0.5, btype="highpass", fs=500.0,
                                                                            output="sos"))
    band = butter_sos(4, (0.5, 40.0), "bandpass", 100.0)
    assert np.array_equal(band, sps.butter(4, [0.5, 40.0], btype="bandpass", fs=100.0, output="sos"))


def test_bandpass_uses_the_cached_design():
    x = np.random.default_rng(0).standard_normal((2, 1000))
    expect = sps.sosfiltfilt(sps.butter(4, [0.5, 45.0], btype="bandpass", fs=100.0, output="sos"), x, axis=-1)
    assert np.array_equal(bandpass(x, 100.0, 0.5, 60.0), expect.astype(np.float32))  # 60 Hz clipped to 0.45 fs = 45 Hz
