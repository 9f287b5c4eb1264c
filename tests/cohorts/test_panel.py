"""The 49-concept panel: its table (names, families, sources) and compute_panel's aggregations."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from raybench.cohorts.panel import (
    CONCEPTS,
    FAMILIES,
    LEAD_GROUPS,
    WAVEFORM_CONCEPTS,
    compute_panel,
    concept_names,
    family_of,
    qrst_angle,
    required_columns,
    signed_absmax,
)

LEADS = ["I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"]


def test_panel_has_49_concepts_in_design_family_counts():
    assert len(CONCEPTS) == 49
    assert len(set(concept_names())) == 49
    assert FAMILIES == ("RATE_RHYTHM", "INTERVAL", "AXIS", "AMPLITUDE", "ST_T")
    counts = Counter(c.family for c in CONCEPTS)
    assert [counts[f] for f in FAMILIES] == [5, 8, 4, 17, 15]
    # families appear as contiguous blocks in the order of docs/protocol.md §3.2
    order = [c.family for c in CONCEPTS]
    assert order == sorted(order, key=FAMILIES.index)


def test_panel_order_and_sources_follow_design():
    names = concept_names()
    assert names[:5] == ["hr_ventricular", "hr_atrial", "rr_mean", "rr_iqr", "p_found"]
    assert names[13:17] == ["p_axis_front", "qrs_axis_front", "t_axis_front", "qrst_angle"]
    assert names[17:20] == ["p_amp_global", "p_amp_limb", "p_amp_precordial"]
    assert names[-1] == "t_duration_global"
    ecgdeli = sorted(c.name for c in CONCEPTS if c.source == "ecgdeli")
    assert ecgdeli == sorted(["rr_iqr", "pq_interval", "st_elev_global", "st_elev_inferior", "st_elev_lateral",
                              "st_elev_anterior", "t_duration_global"])
    assert {c.source for c in CONCEPTS} == {"12sl", "ecgdeli"}
    assert family_of("qrst_angle") == "AXIS"
    assert family_of("st_amp_lateral") == "ST_T"
    assert family_of("qrs_area_global") == "AMPLITUDE"
    with pytest.raises(KeyError, match="unknown concept"):
        family_of("heart_size")


def test_lead_groups_are_exactly_design():
    assert LEAD_GROUPS["all12"] == tuple(LEADS)
    assert LEAD_GROUPS["limb"] == tuple(LEADS[:6])
    assert LEAD_GROUPS["prec"] == tuple(LEADS[6:])
    assert set(LEAD_GROUPS["inferior"]) == {"II", "III", "aVF"}
    assert set(LEAD_GROUPS["lateral"]) == {"I", "aVL", "V5", "V6"}
    assert set(LEAD_GROUPS["anterior"]) == {"V1", "V2", "V3", "V4"}
    st_lat = next(c for c in CONCEPTS if c.name == "st_amp_lateral")
    assert st_lat.source_columns() == ("ST_Amp_I", "ST_Amp_aVL", "ST_Amp_V5", "ST_Amp_V6")


def test_waveform_concepts_contract():
    assert WAVEFORM_CONCEPTS == ("rr_mean_ms", "qrs_duration_ms", "pr_interval_ms", "qt_like_ms",
                                 "r_amp_global_mv", "st_amp_global_mv", "t_amp_global_mv")


def test_signed_absmax_keeps_sign_and_skips_missing():
    x = np.array([[1.0, -3.0, 2.0], [np.nan, 0.5, -0.2], [np.nan, np.nan, np.nan], [np.inf, 1.0, -1.5]])
    out = signed_absmax(x)
    assert out[0] == -3.0 and out[1] == 0.5 and math.isnan(out[2]) and out[3] == -1.5


@pytest.mark.parametrize("qrs,t,expected", [(60, 40, 20), (170, -170, 20), (10, 350, 20), (0, 180, 180),
                                            (-90, 90, 180), (45, 45, 0), (-30, 100, 130)])
def test_qrst_angle_hand_cases(qrs, t, expected):
    assert qrst_angle(np.array([qrs]), np.array([t]))[0] == pytest.approx(expected)


def _tables(n: int = 3, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    cols12 = required_columns("12sl")
    colsd = required_columns("ecgdeli")
    t12 = pd.DataFrame(rng.normal(0, 100, (n, len(cols12))), columns=cols12)
    td = pd.DataFrame(rng.normal(0, 100, (n, len(colsd))), columns=colsd)
    t12.insert(3, "ecg_id", [10, 11, 12][:n])  # not the first column: looked up by name
    td.insert(0, "ecg_id", [12, 10, 11][:n])  # other row order: joined on ecg_id
    return t12, td


def test_compute_panel_matches_independent_per_concept_formula():
    t12, td = _tables()
    out = compute_panel(t12, td)
    assert list(out.columns) == concept_names()
    assert list(out.index) == [10, 11, 12] and out.index.name == "ecg_id"
    assert (out.dtypes == np.float64).all()
    r12 = t12.set_index("ecg_id")
    rd = td.set_index("ecg_id")
    for eid in (10, 11, 12):
        assert out.at[eid, "hr_ventricular"] == r12.at[eid, "HR_Ventr_Global"]
        assert out.at[eid, "rr_iqr"] == rd.at[eid, "RR_Mean_Global_iqr"]
        inferior = [rd.at[eid, f"ST_Elev_{lead}"] for lead in ("II", "III", "aVF")]
        assert out.at[eid, "st_elev_inferior"] == max(inferior, key=abs)
        prec = [r12.at[eid, f"R_Amp_{lead}"] for lead in LEADS[6:]]
        assert out.at[eid, "r_amp_precordial"] == max(prec, key=abs)
        every = [r12.at[eid, f"QRS_Area_{lead}"] for lead in LEADS]
        assert out.at[eid, "qrs_area_global"] == max(every, key=abs)
        d = r12.at[eid, "R_AxisFrontal_Global"] - r12.at[eid, "T_AxisFront_Global"]
        assert out.at[eid, "qrst_angle"] == pytest.approx(abs(((d + 180) % 360) - 180))


def test_compute_panel_lead_groups_do_not_leak():
    t12, td = _tables(1)
    for lead in LEADS:
        t12[f"ST_Amp_{lead}"] = 0.1
    t12["ST_Amp_V4"] = -9.0  # anterior only
    out = compute_panel(t12, td).iloc[0]
    assert out["st_amp_anterior"] == -9.0 and out["st_amp_global"] == -9.0
    assert out["st_amp_lateral"] == pytest.approx(0.1) and out["st_amp_inferior"] == pytest.approx(0.1)


def test_compute_panel_case_insensitive_leads_and_missing_cells():
    t12, td = _tables(2)
    t12 = t12.rename(columns={c: c.replace("aVR", "AVR").replace("aVL", "AVL").replace("aVF", "AVF")
                              for c in t12.columns})
    assert "T_Amp_aVR" not in t12.columns
    for lead in LEADS:
        t12[f"T_Amp_{lead.upper()}"] = np.nan
    t12.loc[0, "T_Amp_AVR"] = -0.7
    t12["P_Dur_Global"] = t12["P_Dur_Global"].astype(object)
    t12.loc[1, "P_Dur_Global"] = "n/a"
    out = compute_panel(t12, td)
    assert out["t_amp_global"].iloc[0] == -0.7
    assert math.isnan(out["t_amp_global"].iloc[1])
    assert math.isnan(out["p_duration_global"].iloc[1])


def test_compute_panel_without_ecgdeli_leaves_those_nan():
    t12, _ = _tables()
    out = compute_panel(t12, None)
    deli = [c.name for c in CONCEPTS if c.source == "ecgdeli"]
    assert out[deli].isna().all().all()
    assert out.drop(columns=deli).notna().all().all()


def test_compute_panel_errors_name_the_problem():
    t12, td = _tables()
    with pytest.raises(ValueError, match="lacks column 'QRS_Dur_Global'"):
        compute_panel(t12.drop(columns=["QRS_Dur_Global"]), td)
    dup = t12.copy()
    dup.loc[2, "ecg_id"] = 10
    with pytest.raises(ValueError, match="duplicate ecg_id"):
        compute_panel(dup, td)
    with pytest.raises(ValueError, match="no ecg_id column"):
        compute_panel(t12.drop(columns=["ecg_id"]), td)
