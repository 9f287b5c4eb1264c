"""Parameters of the synthetic cohort: patient traits, and each record's draw around its patient's.

A record's parameters are its patient's traits plus small per-record jitter (heart rate, intervals, axes,
amplitudes); axes are wrapped into (-180, 180]. The keys are what `raybench.cohorts.synth_beats` turns into
per-lead amplitudes and wave timing. The order of the random draws is part of the cohort's definition:
changing it changes every generated cohort.
"""

from __future__ import annotations

import numpy as np


def draw_patients(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    axis_dev = rng.random(n)
    qrs_axis = np.where(axis_dev < 0.12, rng.uniform(-75, -30, n),
                        np.where(axis_dev > 0.95, rng.uniform(95, 150, n), rng.normal(45, 22, n).clip(-29, 94)))
    wide_angle = rng.random(n) < 0.08
    t_axis = qrs_axis + np.where(wide_angle, rng.choice([-1, 1], n) * rng.uniform(90, 170, n), rng.normal(0, 20, n))
    region = rng.integers(0, 4, n)  # 0 none, 1 inferior, 2 lateral, 3 anterior ST shift
    st_shift = np.where((rng.random(n) < 0.15) & (region > 0), rng.choice([-1, 1], n) * rng.uniform(0.08, 0.3, n), 0)
    site = rng.choice(3, n, p=[0.6, 0.3, 0.1])
    return {
        "hr": rng.normal(72, 14, n).clip(48, 115),
        "rr_var": rng.uniform(0.005, 0.06, n),
        "p_present": rng.random(n) > 0.05,
        "pr": rng.uniform(125, 215, n),
        "p_dur": rng.uniform(80, 120, n),
        "qrs": np.where(rng.random(n) < 0.15, rng.uniform(110, 138, n), rng.uniform(72, 108, n)),
        "qtc": rng.normal(415, 18, n).clip(370, 470),
        "t_frac": rng.uniform(0.38, 0.5, n),
        "qrs_axis": qrs_axis,
        "t_axis": t_axis,
        "p_axis": rng.normal(55, 18, n),
        "st_axis": rng.uniform(-180, 180, n),
        "m_qrs": rng.uniform(0.6, 1.6, n),
        "m_prec": rng.uniform(0.8, 2.4, n),
        "q_frac": rng.uniform(0.0, 0.25, n),
        "transition": rng.uniform(-1.0, 1.0, n),
        "m_t": rng.uniform(0.15, 0.5, n),
        "m_tprec": rng.uniform(0.2, 0.8, n),
        "t_invert_ant": rng.random(n) < 0.07,
        "m_p": rng.uniform(0.08, 0.25, n),
        "m_st": rng.uniform(0.0, 0.06, n),
        "st_region": region,
        "st_shift": st_shift,
        "site": site,
        "age": rng.integers(18, 90, n).astype(float),
        "sex": rng.integers(0, 2, n),
    }


def draw_records(rng: np.random.Generator, pat: dict[str, np.ndarray], who: np.ndarray) -> dict[str, np.ndarray]:
    n = len(who)

    def jit(key: str, scale: float, relative: bool = False) -> np.ndarray:
        base = pat[key][who]
        eps = rng.normal(0, scale, n)
        return base * (1 + eps) if relative else base + eps

    rec = {
        "hr": jit("hr", 3.0).clip(45, 120),
        "rr_var": pat["rr_var"][who],
        "p_present": pat["p_present"][who],
        "pr": jit("pr", 4.0).clip(120, 220),
        "p_dur": jit("p_dur", 3.0).clip(75, 125),
        "qrs": jit("qrs", 3.0).clip(70, 140),
        "qtc": jit("qtc", 6.0),
        "t_frac": pat["t_frac"][who],
        "qrs_axis": jit("qrs_axis", 4.0),
        "t_axis": jit("t_axis", 5.0),
        "p_axis": jit("p_axis", 5.0),
        "st_axis": pat["st_axis"][who],
        "m_qrs": jit("m_qrs", 0.05, True),
        "m_prec": jit("m_prec", 0.05, True),
        "q_frac": pat["q_frac"][who],
        "transition": jit("transition", 0.1).clip(-1, 1),
        "m_t": jit("m_t", 0.06, True),
        "m_tprec": jit("m_tprec", 0.06, True),
        "t_invert_ant": pat["t_invert_ant"][who],
        "m_p": jit("m_p", 0.06, True),
        "m_st": pat["m_st"][who],
        "st_region": pat["st_region"][who],
        "st_shift": jit("st_shift", 0.01) * (pat["st_shift"][who] != 0),
        "site": pat["site"][who],
    }
    rec["p_dur"] = np.minimum(rec["p_dur"], rec["pr"] - 30.0)
    for key in ("qrs_axis", "t_axis", "p_axis"):
        rec[key] = _wrap_deg(rec[key])
    return rec


def _wrap_deg(x: np.ndarray) -> np.ndarray:
    """Angles into (-180, 180]."""
    return -(np.mod(-np.asarray(x, dtype=np.float64) + 180.0, 360.0) - 180.0)
