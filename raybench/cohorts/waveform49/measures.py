"""The 49 panel concepts from one record's beats and delineation (docs/protocol.md §4.4).

Units are the PTB-XL+ tables' (the panel's): amplitudes in microvolts, areas in microvolt*ms, durations and
intervals in ms, rates in beats/min, axes in degrees in (-180, 180]. Amplitudes are read on the median
beat above the isoelectric level (the PR segment's end):
  P        the signed extreme between P onset and P end (0, with area 0, when no P wave is found)
  Q, R, S  R peak = the QRS sample highest above the line from the QRS onset level to the J level; R = its
           value (0 if negative); Q / S = the most negative value before / after it (0 if none);
           QRS balance = Q + R + S; QRS area = net area onset -> J
  T        the signed extreme of (value - ST level) between T onset and T end, i.e. above the ST level
  ST       ST amplitude at J + 40 ms, ST elevation at the J point
Frontal axes are the direction of the (lead I, lead II, lead III) projection fitted by least squares
(hexaxial angles 0, 60, 120 degrees) to the net QRS deflection (Q + R + S, the bedside method; it
tracked the cardiologists' left-axis statements more closely than the net area did), the P area and the
T amplitude. Then the
panel's lead-group aggregations (`raybench.cohorts.panel`) apply unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from raybench.cohorts.extractor_rules import quiet
from raybench.cohorts.panel import CONCEPTS, LEAD_GROUPS, concept_names, qrst_angle, signed_absmax
from raybench.cohorts.waveform49.beats import FS, Beats, record_beats
from raybench.cohorts.waveform49.delineation import Delineation, delineate
from raybench.cohorts.waveforms import LEADS

DT_MS = 1000.0 / FS
_LIMB3 = [LEADS.index(lead) for lead in ("I", "II", "III")]
_HEX = np.deg2rad(np.array([0.0, 60.0, 120.0]))
_AXIS_FIT = np.linalg.pinv(np.stack([np.cos(_HEX), np.sin(_HEX)], 1))  # [2, 3]: (I, II, III) -> (x, y)
_GROUP_IDX = {g: [LEADS.index(lead) for lead in leads] for g, leads in LEAD_GROUPS.items()}
# plausibility windows (ms): a value outside is a failed delineation, not a measurement
PLAUSIBLE = {"qrs": (40.0, 250.0), "pr": (60.0, 400.0), "qt": (180.0, 700.0), "p_dur": (30.0, 250.0)}


def frontal_axis(limb3: np.ndarray) -> float:
    """Degrees of the frontal vector fitted to values of leads I, II, III; NaN for a zero vector."""
    x, y = _AXIS_FIT @ np.asarray(limb3, dtype=np.float64)
    if not (math.isfinite(x) and math.isfinite(y)) or (x == 0 and y == 0):
        return math.nan
    return float(-(np.mod(-np.degrees(np.arctan2(y, x)) + 180.0, 360.0) - 180.0))


def signed_extreme(y: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """Per lead, the value of largest |value| in samples [lo, hi] ([12])."""
    seg = y[:, lo:hi + 1]
    return seg[np.arange(seg.shape[0]), np.abs(seg).argmax(1)]


def qrs_amplitudes(y: np.ndarray, on: int, off: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-lead Q, R, S (module doc), in y's unit."""
    seg = y[:, on:off + 1]
    # the R peak stands highest above the line from the QRS onset level to the J level: a terminal ST elevation
    # higher than a small r is then not taken for the R wave (which would turn the S into a Q)
    frac = np.linspace(0.0, 1.0, seg.shape[1])[None, :]
    r_at = (seg - (seg[:, :1] * (1.0 - frac) + seg[:, -1:] * frac)).argmax(1)
    cols = np.arange(seg.shape[1])[None, :]
    r = np.maximum(seg[np.arange(seg.shape[0]), r_at], 0.0)
    q = np.minimum(np.where(cols < r_at[:, None], seg, np.inf).min(1), 0.0)
    s = np.minimum(np.where(cols > r_at[:, None], seg, np.inf).min(1), 0.0)
    return q, r, s


def _interval(a: int | None, b: int | None, window: tuple[float, float] | None) -> tuple[float, str | None]:
    if a is None or b is None:
        return math.nan, "not_delineated"
    value = (b - a) * DT_MS
    if window is not None and not window[0] <= value <= window[1]:
        return math.nan, "implausible"
    return value, None


def per_lead(b: Beats, d: Delineation) -> dict[str, np.ndarray]:
    """Per-lead measurements in panel units (uV, uV*ms), keyed by the panel column stem; NaN where unmeasured."""
    y = (b.template - d.baseline[:, None]) * 1000.0
    q, r, s = qrs_amplitudes(y, d.qrs_on, d.qrs_off)
    out = {"Q_Amp": q, "R_Amp": r, "S_Amp": s, "QRS_Balance": q + r + s,
           "QRS_Area": y[:, d.qrs_on:d.qrs_off].sum(1) * DT_MS,
           "ST_Amp": d.st_level * 1000.0, "ST_Elev": d.st_j * 1000.0}
    if d.p_peak is None:
        out["P_Amp"], out["P_AreaFull"] = np.zeros(12), np.zeros(12)
    else:
        out["P_Amp"] = signed_extreme(y, d.p_on, d.p_off)
        out["P_AreaFull"] = y[:, d.p_on:d.p_off + 1].sum(1) * DT_MS
    if d.t_peak is None or d.t_off is None or d.t_on is None:
        out["T_Amp"], out["T_AreaFull"] = np.full(12, np.nan), np.full(12, np.nan)
    else:
        out["T_Amp"] = signed_extreme(y - d.st_level[:, None] * 1000.0, d.t_on, d.t_off)
        out["T_AreaFull"] = y[:, d.t_on:d.t_off + 1].sum(1) * DT_MS
    return out


def concepts49(b: Beats, d: Delineation) -> tuple[dict[str, float], dict[str, str]]:
    """(the 49 concepts, {concept: reason} for each NaN one)."""
    reasons: dict[str, str] = {}
    g: dict[str, float] = {}
    rr_mean = float(np.mean(b.rr_ms))
    q75, q25 = np.percentile(b.rr_ms, [75, 25])
    p_found = d.p_peak is not None
    g["hr_ventricular"] = 60000.0 / rr_mean
    g["hr_atrial"] = g["hr_ventricular"] if p_found else math.nan
    g["rr_mean"], g["rr_iqr"], g["p_found"] = rr_mean, float(q75 - q25), float(p_found)
    g["qrs_duration"], why_qrs = _interval(d.qrs_on, d.qrs_off, PLAUSIBLE["qrs"])
    g["pr_interval"], why_pr = _interval(d.p_on, d.qrs_on, PLAUSIBLE["pr"])
    g["pq_interval"] = g["pr_interval"]
    g["p_duration_global"], why_pd = _interval(d.p_on, d.p_off, PLAUSIBLE["p_dur"])
    g["qt_interval"], why_qt = _interval(d.qrs_on, d.t_off, PLAUSIBLE["qt"])
    g["t_duration_global"], why_td = _interval(d.t_on, d.t_off, None)
    rr_s = rr_mean / 1000.0
    g["qtc_bazett"] = g["qt_interval"] / math.sqrt(rr_s)
    g["qtc_fridericia"] = g["qt_interval"] / rr_s ** (1.0 / 3.0)
    g["qtc_framingham"] = g["qt_interval"] + 154.0 * (1.0 - rr_s)
    lead = per_lead(b, d)
    g["qrs_axis_front"] = frontal_axis(lead["QRS_Balance"][_LIMB3])
    g["p_axis_front"] = frontal_axis(lead["P_AreaFull"][_LIMB3]) if p_found else math.nan
    g["t_axis_front"] = frontal_axis(lead["T_Amp"][_LIMB3])
    g["qrst_angle"] = float(qrst_angle(g["qrs_axis_front"], g["t_axis_front"]))
    no_p = "no_p_wave" if not p_found else None
    for names, why in ((("hr_atrial", "p_axis_front"), no_p), (("qrs_duration",), why_qrs),
                       (("pr_interval", "pq_interval"), no_p or why_pr), (("p_duration_global",), no_p or why_pd),
                       (("qt_interval", "qtc_bazett", "qtc_fridericia", "qtc_framingham"), why_qt),
                       (("t_duration_global",), why_td)):
        for name in names:
            if why is not None:
                reasons[name] = why
    for c in CONCEPTS:
        if c.aggregation not in _GROUP_IDX:
            continue
        vals = lead[c.column][_GROUP_IDX[c.aggregation]]
        g[c.name] = float(signed_absmax(vals[None, :])[0])
    for name in concept_names():
        if not math.isfinite(g[name]):
            g[name] = math.nan
            reasons.setdefault(name, "t_wave_not_delineated" if name.startswith(("t_", "qrst")) else "not_measurable")
    return {name: g[name] for name in concept_names()}, reasons


def measure_signal49_reasons(signal: np.ndarray, fs: float) -> tuple[dict[str, float], dict[str, str]]:
    """(the 49 concepts of one [12, T] mV signal, the reason of each NaN); ConceptError if unmeasurable."""
    sig = np.asarray(signal, dtype=np.float64)
    if sig.ndim != 2 or sig.shape[0] != 12:
        raise ValueError(f"signal must be [12, T] in LEADS order, got shape {sig.shape}")
    with quiet():
        beats = record_beats(sig, float(fs))
        return concepts49(beats, delineate(beats))


def measure_signal49(signal: np.ndarray, fs: float) -> dict[str, float]:
    """The 49 concepts of one [12, T] mV signal (NaN where unmeasurable; raybench.cohorts.waveform49 doc)."""
    return measure_signal49_reasons(signal, fs)[0]
