"""A deterministic synthetic 12-lead record shared by the encoder parity fixture generators and tests.

`synthetic_ecg_digital(fs, n, seed)` -> int16 [12, n] in microvolts (ADC gain 1000 per mV, baseline 0), the
way a WFDB / PhysioNet-challenge record stores it; the signal in millivolts is `digital / 1000`. A beat
train (jittered RR around 0.8 s) of Gaussian P, Q, R, S, T waves with lead-specific gains and signs,
baseline wander and a little noise. Computed in float64 with numpy's PCG64, then rounded once to integers,
so a few ulp of difference in `exp`/`sin` between platforms almost never changes a sample (and the tests
compare at 1e-5, not bitwise). numpy only.
"""

from __future__ import annotations

import numpy as np

# (offset from R in s, width in s, amplitude in mV) of the P, Q, R, S, T waves
_WAVES = ((-0.16, 0.025, 0.15), (-0.03, 0.010, -0.10), (0.0, 0.012, 1.0), (0.03, 0.010, -0.25),
          (0.26, 0.060, 0.30))


def synthetic_ecg_digital(fs: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(int(seed)))
    t = np.arange(int(n), dtype=np.float64) / float(fs)
    duration = n / float(fs)
    beats = np.cumsum(0.8 + 0.05 * rng.standard_normal(int(duration / 0.6) + 4)) - 0.5
    beats = beats[beats < duration + 0.5]
    gains = rng.uniform(0.3, 1.5, 12) * np.where(np.arange(12) == 3, -1.0, 1.0)  # aVR inverted
    shape = rng.uniform(0.7, 1.3, (12, len(_WAVES)))  # per-lead wave amplitudes
    x = np.zeros((12, t.size))
    for r in beats:
        for j, (off, width, amp) in enumerate(_WAVES):
            bump = np.exp(-0.5 * ((t - r - off) / width) ** 2)
            x += (gains * shape[:, j] * amp)[:, None] * bump[None, :]
    wander = 0.1 * np.sin(2 * np.pi * 0.3 * t[None, :] + rng.uniform(0, 2 * np.pi, (12, 1)))
    x += wander + 0.02 * rng.standard_normal((12, t.size))
    return np.round(x * 1000.0).astype(np.int16)
