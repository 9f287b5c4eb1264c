"""What the synthetic cohort's tables and ground truth say: PTB-XL+ feature columns and the concept values.

Table units follow PTB-XL+: amplitudes in microvolts, durations in ms, areas in microvolt*ms, axes in
degrees. Table values are what the noiseless beat shows: R amplitude = the value at the R peak (the
planted R: no other wave overlaps it); Q/S amplitude = the most negative value before/after the R peak
(0 when the lead shows none; Q is smaller than the planted Q because the R upstroke overlaps it, S
includes the ST level rising into the J point); P, T and ST amplitude = the planted P, T and ST level
(T measured above the ST level, which it rides on); QRS_Balance = Q + R + S amplitude; areas = exact
integrals of the drawn waves (net over the QRS; P and T wave alone);
RR_Mean = mean of the in-record RR intervals, RR_Mean_Global_iqr their IQR, HR = 60000 / RR_Mean;
PR = P onset to QRS onset (PQ the same), QT = QRS onset to T end, QTc Bazett/Fridericia/Framingham
from QT and RR_Mean; records without P waves have P_Found 0, P amplitudes/areas 0 and NaN P timing.

Waveform concepts (ground truth for the waveform extractor, docs/protocol.md §4),
measured on the noiseless single-beat template: rr_mean_ms = median RR; qrs_duration_ms, pr_interval_ms,
qt_like_ms = the exact support boundaries of `raybench.cohorts.synth_beats` (equal to QRS_Dur, PR_Int,
QT_Int); r/t/st_amp_global_mv = largest |value| over the 12 leads at the R peak, the T peak and 60 ms
after the J point (a magnitude, in mV).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from raybench.cohorts.panel import CONCEPTS, LEAD_GROUPS, WAVEFORM_CONCEPTS, concept_names, qrst_angle
from raybench.cohorts.synth_beats import (
    Q_SPAN,
    R_SPAN,
    S_SPAN,
    ST_RISE_FROM,
    WAVES,
    drawn_qrs_amplitudes,
    peak_time,
    template_value,
)
from raybench.cohorts.waveforms import LEADS


def _absmax(x: np.ndarray) -> np.ndarray:
    """Signed value with the largest |value| per row (ground-truth twin of panel.signed_absmax)."""
    out = np.full(x.shape[0], np.nan)
    for i, row in enumerate(x):
        ok = row[np.isfinite(row)]
        if ok.size:
            out[i] = ok[np.argmax(np.abs(ok))]
    return out


def feature_tables(rec: dict[str, np.ndarray], amps: dict[str, np.ndarray], geo: dict[str, np.ndarray],
            rr_stats: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """PTB-XL+ style columns (12sl, ecgdeli) in table units."""
    uv = {w: amps[w] * 1000.0 for w in WAVES}
    dur = geo["dur"]
    qrs = geo["j"][:, None]
    q_drawn, s_drawn = drawn_qrs_amplitudes(uv["Q"], uv["R"], uv["S"], uv["ST"])
    has_p = rec["p_present"]
    nan_if_no_p = lambda x: np.where(has_p, x, np.nan)  # noqa: E731
    rr_mean, rr_iqr = rr_stats[:, 0], rr_stats[:, 1]
    rr_s = rr_mean / 1000.0
    qt = geo["qt"]
    hr = 60000.0 / rr_mean
    t12: dict[str, np.ndarray] = {
        "HR_Ventr_Global": hr, "HR_Atrial_Global": nan_if_no_p(hr), "RR_Mean_Global": rr_mean,
        "P_Found_Global": has_p.astype(float), "PR_Int_Global": nan_if_no_p(rec["pr"]),
        "P_Dur_Global": nan_if_no_p(rec["p_dur"]), "QRS_Dur_Global": rec["qrs"], "QT_Int_Global": qt,
        "QT_IntBazett_Global": qt / np.sqrt(rr_s), "QT_IntFridericia_Global": qt / np.cbrt(rr_s),
        "QT_IntFramingham_Global": qt + 154.0 * (1.0 - rr_s), "P_AxisFront_Global": nan_if_no_p(rec["p_axis"]),
        "R_AxisFrontal_Global": rec["qrs_axis"], "T_AxisFront_Global": rec["t_axis"],
    }
    # exact integrals: half-sine area = 2/pi * length, Hann and half-cosine ramp areas = length / 2
    qrs_area = (uv["Q"] * Q_SPAN[1] * 2.0 / math.pi + uv["R"] * R_SPAN[1] / 2.0 + uv["S"] * S_SPAN[1] / 2.0
                + uv["ST"] * (1.0 - ST_RISE_FROM) / 2.0) * qrs
    per_lead = {
        "P_Amp": uv["P"], "Q_Amp": q_drawn, "R_Amp": uv["R"], "S_Amp": s_drawn, "T_Amp": uv["T"], "ST_Amp": uv["ST"],
        "QRS_Balance": q_drawn + uv["R"] + s_drawn, "QRS_Area": qrs_area,
        "P_AreaFull": uv["P"] * dur[:, 0:1] / 2.0, "T_AreaFull": uv["T"] * dur[:, 4:5] / 2.0,
    }
    for stem, values in per_lead.items():
        for k, lead in enumerate(LEADS):
            t12[f"{stem}_{lead}"] = values[:, k]
    tdeli: dict[str, np.ndarray] = {"RR_Mean_Global_iqr": rr_iqr, "PQ_Int_Global": nan_if_no_p(rec["pr"]),
                                    "T_Dur_Global": geo["t_dur"]}
    for k, lead in enumerate(LEADS):
        tdeli[f"ST_Elev_{lead}"] = uv["ST"][:, k]
    return t12, tdeli


def ground_truth(t12: dict[str, np.ndarray], tdeli: dict[str, np.ndarray], deli_ok: np.ndarray) -> pd.DataFrame:
    """The 49 raw concepts straight from the planted per-lead arrays (independent of panel.compute_panel)."""
    gt: dict[str, np.ndarray] = {}
    for c in CONCEPTS:
        src = t12 if c.source == "12sl" else tdeli
        if c.aggregation == "qrst_angle":
            val = qrst_angle(t12["R_AxisFrontal_Global"], t12["T_AxisFront_Global"])
        elif c.aggregation == "global":
            val = np.asarray(src[c.column], dtype=float).copy()
        else:
            val = _absmax(np.stack([src[f"{c.column}_{lead}"] for lead in LEAD_GROUPS[c.aggregation]], 1))
        if c.source == "ecgdeli":
            val = np.where(deli_ok, val, np.nan)
        gt[c.name] = val
    return pd.DataFrame(gt)[concept_names()]


def waveform_truth(amps: dict[str, np.ndarray], geo: dict[str, np.ndarray], rr_median: np.ndarray,
                    pr: np.ndarray, has_p: np.ndarray) -> pd.DataFrame:
    n = len(rr_median)
    r_amp, t_amp, st_amp = np.empty(n), np.empty(n), np.empty(n)
    r_time, t_time = peak_time(geo, "R"), peak_time(geo, "T")
    for i in range(n):
        r_amp[i] = np.abs(template_value(amps, geo, i, r_time[i])).max()
        t_amp[i] = np.abs(template_value(amps, geo, i, t_time[i])).max()
        st_amp[i] = np.abs(template_value(amps, geo, i, geo["j"][i] + 60.0)).max()
    out = pd.DataFrame({
        "rr_mean_ms": rr_median, "qrs_duration_ms": geo["j"], "pr_interval_ms": np.where(has_p, pr, np.nan),
        "qt_like_ms": geo["qt"], "r_amp_global_mv": r_amp, "st_amp_global_mv": st_amp, "t_amp_global_mv": t_amp,
    })
    return out[list(WAVEFORM_CONCEPTS)]
