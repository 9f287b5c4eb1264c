"""Beat templates of the synthetic cohort: per-lead wave amplitudes, wave timing and the drawn P-QRS-T.

Every record is a train of parametric P-QRS-T beats. Each wave has compact support, so its onset and
end are exact times a delineator can see on the noiseless beat (Gaussian waves have no onset: any
threshold on their tails is a convention, and no detector sees a wave 3 sigma out). P, R, S and T are
raised-cosine (Hann) bumps, Q is a half-sine (a sharp onset, so a small q is visible at the start of
the R upstroke), and the ST level is reached at the J point (it rises from the S peak, as J-point
elevation/depression does, so the QRS ends with a flat slope at J), stays flat and falls with the T
wave's second half to the T end. Each wave has one time course per record (shared by all leads) and
one amplitude per lead, so the 12 x T signal is `amplitudes[12, 6] @ profiles[6, T]`.

QRS geometry (fractions of the QRS duration d, QRS onset at 0): Q on [0, 0.25 d], R on [0, 0.62 d],
S on [0.42 d, d]. Every lead has a positive R and a negative S (limb leads carry a floor of both), so
every lead's QRS deflection starts at 0 and ends at d: the drawn global QRS extent is exactly
QRS_Dur. Likewise PR = P onset -> QRS onset and QT = QRS onset -> T end are exact support boundaries.
Per-lead amplitudes come from frontal axes (limb leads: projection cos(axis - lead angle)) and
precordial progression profiles, so axes, amplitudes, intervals and rate all visibly shape the
waveform.
"""

from __future__ import annotations

import numpy as np

from raybench.cohorts.panel import LEAD_GROUPS
from raybench.cohorts.waveforms import LEADS

_LIMB_ANGLES = np.deg2rad(np.array([0.0, 60.0, 120.0, -150.0, -30.0, 90.0]))
WAVES: tuple[str, ...] = ("P", "Q", "R", "S", "T", "ST")  # the order of amplitudes[:, :, k] and profiles[k]
# QRS wave supports as fractions of the QRS duration: (start, length) of Q, R, S (module doc)
Q_SPAN, R_SPAN, S_SPAN = (0.0, 0.25), (0.0, 0.62), (0.42, 0.58)
ST_RISE_FROM = S_SPAN[0] + S_SPAN[1] / 2  # the ST level rises from the S peak to the J point
# every limb lead shows an r and an s of at least this fraction of the QRS magnitude (the QRS loop's
# width: a lead perpendicular to the axis is equiphasic, not flat), so lead II carries a visible R
LOOP_WIDTH = 0.25
ST_SEGMENT_MS = 40.0  # shortest J point -> T onset


def _interp_profile(profile: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """Precordial profile sampled at V-index + shift (per record): [N, 6]."""
    pos = np.clip(np.arange(6)[None, :] + shift[:, None], 0, 5)
    return np.stack([np.interp(p, np.arange(6), profile) for p in pos])


def lead_amplitudes(rec: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-lead wave amplitudes in mV, each [N, 12] in LEADS order."""
    n = len(rec["hr"])
    limb = lambda ang: np.cos(np.deg2rad(ang)[:, None] - _LIMB_ANGLES[None, :])  # noqa: E731
    net = rec["m_qrs"][:, None] * limb(rec["qrs_axis"])
    base = LOOP_WIDTH * rec["m_qrs"][:, None]
    r_limb = base + np.maximum(net, 0)
    s_limb = -(base + np.maximum(-net, 0))
    q_limb = -rec["q_frac"][:, None] * np.maximum(net, 0)
    shift = rec["transition"]
    r_prec = rec["m_prec"][:, None] * _interp_profile(np.array([0.15, 0.3, 0.55, 0.9, 1.0, 0.8]), shift)
    s_prec = -rec["m_prec"][:, None] * _interp_profile(np.array([0.9, 1.0, 0.7, 0.4, 0.2, 0.1]), shift)
    q_prec = np.zeros((n, 6))
    q_prec[:, 4:] = -rec["q_frac"][:, None] * r_prec[:, 4:]
    t_limb = rec["m_t"][:, None] * limb(rec["t_axis"])
    t_prec = rec["m_tprec"][:, None] * np.array([0.15, 0.6, 0.9, 1.0, 0.8, 0.6])[None, :]
    t_prec[:, :4] *= np.where(rec["t_invert_ant"], -1.0, 1.0)[:, None]
    p_on = rec["p_present"].astype(float)[:, None]
    p_limb = p_on * rec["m_p"][:, None] * limb(rec["p_axis"])
    p_prec = p_on * rec["m_p"][:, None] * np.array([0.5, 0.6, 0.5, 0.45, 0.4, 0.35])[None, :]
    st = np.concatenate([rec["m_st"][:, None] * limb(rec["st_axis"]),
                         rec["m_st"][:, None] * np.array([0.8, 1.0, 0.6, 0.3, 0.1, 0.0])[None, :]], axis=1)
    for region, group in ((1, "inferior"), (2, "lateral"), (3, "anterior")):
        idx = [LEADS.index(lead) for lead in LEAD_GROUPS[group]]
        st[:, idx] += np.where(rec["st_region"] == region, rec["st_shift"], 0.0)[:, None]
    return {
        "P": np.concatenate([p_limb, p_prec], 1), "Q": np.concatenate([q_limb, q_prec], 1),
        "R": np.concatenate([r_limb, r_prec], 1), "S": np.concatenate([s_limb, s_prec], 1),
        "T": np.concatenate([t_limb, t_prec], 1), "ST": st,
    }


def wave_geometry(rec: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-record timing (ms, relative to QRS onset): start and length of P Q R S T, J point, T end."""
    qrs, pr, p_dur = rec["qrs"], rec["pr"], rec["p_dur"]
    rr_nominal = 60000.0 / rec["hr"]
    qt = rec["qtc"] * np.sqrt(rr_nominal / 1000.0)
    t_dur = np.minimum(rec["t_frac"] * qt, qt - qrs - ST_SEGMENT_MS)
    return {
        "start": np.stack([-pr, Q_SPAN[0] * qrs, R_SPAN[0] * qrs, S_SPAN[0] * qrs, qt - t_dur], 1),
        "dur": np.stack([p_dur, Q_SPAN[1] * qrs, R_SPAN[1] * qrs, S_SPAN[1] * qrs, t_dur], 1),
        "j": qrs, "qt": qt, "t_dur": t_dur, "rr_nominal": rr_nominal,
    }


def _hann(x: np.ndarray) -> np.ndarray:
    """Raised-cosine bump on [0, 1] (peak 1 at 0.5, zero outside; area 1/2)."""
    return np.where((x > 0) & (x < 1), 0.5 * (1.0 - np.cos(2.0 * np.pi * x)), 0.0)


def _half_sine(x: np.ndarray) -> np.ndarray:
    """Half-sine bump on [0, 1] (peak 1 at 0.5, zero outside; area 2/pi); its onset is a visible kink."""
    return np.where((x > 0) & (x < 1), np.sin(np.pi * np.clip(x, 0.0, 1.0)), 0.0)


def _st_plateau(t: np.ndarray, j: float, t_end: float, t_dur: float) -> np.ndarray:
    """ST level: half-cosine rise from the S peak to 1 at the J point, 1 until the T peak, then falls with
    exactly the T wave's second-half shape to 0 at the T end (so T + ST peaks at the T peak)."""
    rise_from = ST_RISE_FROM * j
    rise = 0.5 * (1.0 - np.cos(np.pi * np.clip((t - rise_from) / (j - rise_from), 0.0, 1.0)))
    half = t_dur / 2.0
    fall = 0.5 * (1.0 + np.cos(np.pi * np.clip((t - (t_end - half)) / half, 0.0, 1.0)))
    return rise * fall


def wave_profiles(t: np.ndarray, onsets: np.ndarray, start: np.ndarray, dur: np.ndarray, j: float,
                  t_end: float) -> np.ndarray:
    """[6, len(t)] time courses (P Q R S T ST) summed over beats with QRS onsets `onsets` (ms).

    `t` must be a uniform grid from 0. Each beat is evaluated only on its own window (P onset to
    T end, every wave having compact support), then scattered into place.
    """
    if t.size == 1:
        rel = t[None, :] - onsets[:, None]
        return beat_waves(rel, start, dur, j, t_end).sum(1)
    dt = float(t[1] - t[0])
    pre = -start[0] + dt
    post = t_end + dt
    width = int(np.ceil((pre + post) / dt)) + 1
    first = np.floor((onsets - pre) / dt).astype(np.int64)
    idx = first[:, None] + np.arange(width)[None, :]  # [beats, W]
    rel = idx * dt - onsets[:, None]
    waves = beat_waves(rel, start, dur, j, t_end)  # [6, beats, W]
    ok = (idx >= 0) & (idx < t.size)
    flat_idx = idx[ok]
    return np.stack([np.bincount(flat_idx, weights=w[ok], minlength=t.size) for w in waves])


def beat_waves(rel: np.ndarray, start: np.ndarray, dur: np.ndarray, j: float, t_end: float) -> np.ndarray:
    """[6, *rel.shape]: P Q R S T bumps and the ST plateau at times `rel` (ms from QRS onset)."""
    out = np.empty((6, *rel.shape))
    for w in range(5):
        x = (rel - start[w]) / dur[w]
        out[w] = _half_sine(x) if WAVES[w] == "Q" else _hann(x)
    out[5] = _st_plateau(rel, j, t_end, float(dur[4]))
    return out


def template_value(amps: dict[str, np.ndarray], geo: dict[str, np.ndarray], i: int, t_rel: float) -> np.ndarray:
    """Noiseless single-beat template of record i at `t_rel` ms after QRS onset: [12] mV."""
    prof = wave_profiles(np.array([t_rel]), np.zeros(1), geo["start"][i], geo["dur"][i], geo["j"][i], geo["qt"][i])
    a = np.stack([amps[w][i] for w in WAVES], 1)  # [12, 6]
    return (a @ prof)[:, 0]


def peak_time(geo: dict[str, np.ndarray], wave: str) -> np.ndarray:
    """Time (ms from QRS onset) of the peak of P Q R S or T, per record."""
    k = WAVES.index(wave)
    return geo["start"][:, k] + 0.5 * geo["dur"][:, k]


DRAWN_CHUNK = 2048  # leads per block in drawn_qrs_amplitudes (16 MiB of float64 per term)


def drawn_qrs_amplitudes(q: np.ndarray, r: np.ndarray, s: np.ndarray, st: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drawn Q and S amplitudes (<= 0) from the planted Q, R, S and ST amplitudes (any matching shapes).

    Q = the most negative value before the R peak, S = the most negative value after it (0 when the
    lead shows none). Every QRS wave and the ST rise scale with the QRS duration, so these depend on the
    amplitudes only; evaluated on a fine grid of the QRS in units of its duration. (The R peak itself
    overlaps no other wave, so the drawn R equals the planted R.)
    """
    u = np.linspace(0.0, 1.0, 1001)
    shapes = {
        "Q": _half_sine((u - Q_SPAN[0]) / Q_SPAN[1]), "R": _hann((u - R_SPAN[0]) / R_SPAN[1]),
        "S": _hann((u - S_SPAN[0]) / S_SPAN[1]),
        "ST": 0.5 * (1.0 - np.cos(np.pi * np.clip((u - ST_RISE_FROM) / (1.0 - ST_RISE_FROM), 0.0, 1.0))),
    }
    amps = np.broadcast_arrays(*(np.asarray(a, dtype=float) for a in (q, r, s, st)))
    shape = amps[0].shape
    flat = [a.reshape(-1) for a in amps]
    before = u <= R_SPAN[0] + R_SPAN[1] / 2
    q_drawn, s_drawn = np.empty(flat[0].size), np.empty(flat[0].size)
    for lo in range(0, flat[0].size, DRAWN_CHUNK):  # [chunk, 1001] at a time: a cohort's [n, 12, 1001] is GBs
        part = slice(lo, lo + DRAWN_CHUNK)
        drawn = sum(a[part, None] * shapes[w] for w, a in zip(("Q", "R", "S", "ST"), flat, strict=True))
        q_drawn[part] = np.minimum(drawn[:, before].min(-1), 0.0)
        s_drawn[part] = np.minimum(drawn[:, ~before].min(-1), 0.0)
    return q_drawn.reshape(shape)[()], s_drawn.reshape(shape)[()]  # [()]: a scalar for scalar amplitudes
