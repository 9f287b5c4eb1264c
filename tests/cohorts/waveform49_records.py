"""Hand-set P-QRS-T records for the waveform49 tests, drawn by the synthetic cohort's beat model.

The truth is what `raybench.cohorts.synth_truth` says the noiseless beat shows (the reference waveform49
never reads), for one record whose every parameter is set here by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raybench.cohorts.synth_beats import WAVES, lead_amplitudes, wave_geometry, wave_profiles
from raybench.cohorts.synth_truth import feature_tables, ground_truth

BASE = {"hr": 75.0, "p_present": True, "pr": 160.0, "p_dur": 100.0, "qrs": 90.0, "qtc": 410.0, "t_frac": 0.45,
        "qrs_axis": 50.0, "t_axis": 40.0, "p_axis": 55.0, "st_axis": 30.0, "m_qrs": 1.2, "m_prec": 1.6,
        "q_frac": 0.15, "transition": 0.0, "m_t": 0.35, "m_tprec": 0.5, "t_invert_ant": False, "m_p": 0.15,
        "m_st": 0.03, "st_region": 0, "st_shift": 0.0}


def record(fs: float = 500.0, seconds: float = 10.0, noise: float = 0.0, seed: int = 0, **changes
           ) -> tuple[np.ndarray, pd.Series]:
    """([12, T] mV at fs, the 49 concepts' truth) of a record with BASE's parameters updated by `changes`.

    Beats are exactly 60000 / hr ms apart (RR IQR 0), the first QRS onset at 300 ms.
    """
    params = {**BASE, **changes}
    rec = {k: np.array([v]) for k, v in params.items()}
    amps, geo = lead_amplitudes(rec), wave_geometry(rec)
    rr = float(geo["rr_nominal"][0])
    onsets = np.arange(300.0 - rr, seconds * 1000.0 + rr, rr)
    t = np.arange(int(seconds * fs)) * (1000.0 / fs)
    prof = wave_profiles(t, onsets, geo["start"][0], geo["dur"][0], float(geo["j"][0]), float(geo["qt"][0]))
    sig = np.stack([amps[w][0] for w in WAVES], 1) @ prof
    if noise:
        sig = sig + np.random.default_rng(seed).normal(0.0, noise, sig.shape)
    t12, tdeli = feature_tables(rec, amps, geo, np.array([[rr, 0.0, rr]]))
    truth = ground_truth(t12, tdeli, np.array([True])).iloc[0]
    return sig, truth
