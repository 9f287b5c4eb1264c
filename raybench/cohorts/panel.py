"""The 49-concept panel: one table of what each concept is and where its value comes from.

Each concept reads PTB-XL+ feature columns (`12sl_features.csv` unless `source == "ecgdeli"`).
`aggregation` is `global` (the column itself), a lead group (the signed value with the largest
absolute value across `<column>_<lead>` for the group's leads), or `qrst_angle` (the absolute
wrapped difference of the frontal QRS and T axes). Leads missing a value are skipped; a concept is
NaN only when every source cell is missing. Feature-table lead columns use the PTB-XL+ spelling
(`R_Amp_aVR`); lookup is case-insensitive so `R_Amp_AVR` works too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

FAMILIES: tuple[str, ...] = ("RATE_RHYTHM", "INTERVAL", "AXIS", "AMPLITUDE", "ST_T")

LEAD_GROUPS: dict[str, tuple[str, ...]] = {
    "all12": ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"),
    "limb": ("I", "II", "III", "aVR", "aVL", "aVF"),
    "prec": ("V1", "V2", "V3", "V4", "V5", "V6"),
    "inferior": ("II", "III", "aVF"),
    "lateral": ("I", "aVL", "V5", "V6"),
    "anterior": ("V1", "V2", "V3", "V4"),
}
QRST_AXES = ("R_AxisFrontal_Global", "T_AxisFront_Global")

# The seven concepts measured on the waveform itself (MIMIC replication, cohorts without PTB-XL+),
# each with the family of the panel concept it measures (docs/protocol.md §4.2).
WAVEFORM_FAMILIES: dict[str, str] = {
    "rr_mean_ms": "RATE_RHYTHM", "qrs_duration_ms": "INTERVAL", "pr_interval_ms": "INTERVAL",
    "qt_like_ms": "INTERVAL", "r_amp_global_mv": "AMPLITUDE", "st_amp_global_mv": "ST_T",
    "t_amp_global_mv": "ST_T",
}
WAVEFORM_CONCEPTS: tuple[str, ...] = tuple(WAVEFORM_FAMILIES)

# The rate concept of a MIMIC-IV-ECG manifest (cohort.rate_concept, docs/protocol.md §4.2): the published MIMIC
# run used the heart rate derived from the measured RR interval, in rr_mean_ms's place; rr_mean_ms is raybench's.
RATE_CONCEPTS: tuple[str, ...] = ("heart_rate_bpm", "rr_mean_ms")
DERIVED_FAMILIES: dict[str, str] = {"heart_rate_bpm": "RATE_RHYTHM"}


def heart_rate_bpm(rr_ms: np.ndarray) -> np.ndarray:
    """60000 / RR (ms) -> beats per minute; NaN where RR is missing or not positive (as published)."""
    rr = np.asarray(rr_ms, dtype=np.float64)
    ok = np.isfinite(rr) & (rr > 0)
    return np.where(ok, 60000.0 / np.where(ok, rr, 1.0), np.nan)


def mimic_concepts(rate_concept: str) -> tuple[str, ...]:
    """The seven MIMIC-IV-ECG concepts, in WAVEFORM_CONCEPTS order with the rate concept in rr_mean_ms's place."""
    if rate_concept not in RATE_CONCEPTS:
        raise ValueError(f"rate_concept must be one of {list(RATE_CONCEPTS)}, got {rate_concept!r}")
    return tuple(rate_concept if c == "rr_mean_ms" else c for c in WAVEFORM_CONCEPTS)


def with_rate_concept(values: pd.DataFrame, rate_concept: str) -> pd.DataFrame:
    """Waveform concept values (WAVEFORM_CONCEPTS columns) -> mimic_concepts(rate_concept) columns."""
    names = mimic_concepts(rate_concept)
    out = values.copy()
    if rate_concept == "heart_rate_bpm":
        out["heart_rate_bpm"] = heart_rate_bpm(out["rr_mean_ms"].to_numpy(np.float64))
    return out[list(names)]


@dataclass(frozen=True)
class Concept:
    """One panel row. `column` is the full column (global) or the stem before `_<lead>`."""

    name: str
    family: str
    source: str  # "12sl" | "ecgdeli"
    column: str
    aggregation: str  # "global" | a LEAD_GROUPS key | "qrst_angle"

    def source_columns(self) -> tuple[str, ...]:
        if self.aggregation == "global":
            return (self.column,)
        if self.aggregation == "qrst_angle":
            return QRST_AXES
        return tuple(f"{self.column}_{lead}" for lead in LEAD_GROUPS[self.aggregation])


def _g(name: str, family: str, column: str, source: str = "12sl") -> Concept:
    return Concept(name, family, source, column, "global")


def _groups(prefix: str, family: str, stem: str, groups: dict[str, str], source: str = "12sl") -> list[Concept]:
    return [Concept(f"{prefix}_{suffix}", family, source, stem, group) for suffix, group in groups.items()]


_GLP = {"global": "all12", "limb": "limb", "precordial": "prec"}
_REG = {"global": "all12", "inferior": "inferior", "lateral": "lateral", "anterior": "anterior"}

CONCEPTS: tuple[Concept, ...] = tuple([
    # RATE_RHYTHM (5)
    _g("hr_ventricular", "RATE_RHYTHM", "HR_Ventr_Global"),
    _g("hr_atrial", "RATE_RHYTHM", "HR_Atrial_Global"),
    _g("rr_mean", "RATE_RHYTHM", "RR_Mean_Global"),
    _g("rr_iqr", "RATE_RHYTHM", "RR_Mean_Global_iqr", source="ecgdeli"),
    _g("p_found", "RATE_RHYTHM", "P_Found_Global"),
    # INTERVAL (8)
    _g("pr_interval", "INTERVAL", "PR_Int_Global"),
    _g("pq_interval", "INTERVAL", "PQ_Int_Global", source="ecgdeli"),
    _g("p_duration_global", "INTERVAL", "P_Dur_Global"),
    _g("qrs_duration", "INTERVAL", "QRS_Dur_Global"),
    _g("qt_interval", "INTERVAL", "QT_Int_Global"),
    _g("qtc_bazett", "INTERVAL", "QT_IntBazett_Global"),
    _g("qtc_fridericia", "INTERVAL", "QT_IntFridericia_Global"),
    _g("qtc_framingham", "INTERVAL", "QT_IntFramingham_Global"),
    # AXIS (4)
    _g("p_axis_front", "AXIS", "P_AxisFront_Global"),
    _g("qrs_axis_front", "AXIS", "R_AxisFrontal_Global"),
    _g("t_axis_front", "AXIS", "T_AxisFront_Global"),
    Concept("qrst_angle", "AXIS", "12sl", "R_AxisFrontal_Global", "qrst_angle"),
    # AMPLITUDE (17)
    *_groups("p_amp", "AMPLITUDE", "P_Amp", _GLP),
    *_groups("q_amp", "AMPLITUDE", "Q_Amp", _GLP),
    *_groups("r_amp", "AMPLITUDE", "R_Amp", _GLP),
    *_groups("s_amp", "AMPLITUDE", "S_Amp", _GLP),
    Concept("qrs_balance_global", "AMPLITUDE", "12sl", "QRS_Balance", "all12"),
    Concept("qrs_area_global", "AMPLITUDE", "12sl", "QRS_Area", "all12"),
    *_groups("p_area", "AMPLITUDE", "P_AreaFull", _GLP),
    # ST_T (15)
    *_groups("t_amp", "ST_T", "T_Amp", _GLP),
    *_groups("t_area", "ST_T", "T_AreaFull", _GLP),
    *_groups("st_elev", "ST_T", "ST_Elev", _REG, source="ecgdeli"),
    *_groups("st_amp", "ST_T", "ST_Amp", _REG),
    _g("t_duration_global", "ST_T", "T_Dur_Global", source="ecgdeli"),
])

_BY_NAME = {c.name: c for c in CONCEPTS}


def concept_names() -> list[str]:
    return [c.name for c in CONCEPTS]


def family_of(name: str) -> str:
    """The family of a panel concept or of a waveform-derived concept: the one concept-family lookup."""
    if name in _BY_NAME:
        return _BY_NAME[name].family
    if name in WAVEFORM_FAMILIES:
        return WAVEFORM_FAMILIES[name]
    if name in DERIVED_FAMILIES:
        return DERIVED_FAMILIES[name]
    raise KeyError(f"unknown concept {name!r}; known: {concept_names()}, {list(WAVEFORM_CONCEPTS)} and "
                   f"{list(DERIVED_FAMILIES)}")


def concept_families(names: Sequence[str]) -> list[str]:
    """`family_of` for each name, in order."""
    return [family_of(name) for name in names]


def required_columns(source: str) -> list[str]:
    """Every column the panel reads from one source table (for up-front validation)."""
    cols: list[str] = []
    for c in CONCEPTS:
        if c.source == source:
            cols.extend(col for col in c.source_columns() if col not in cols)
    return cols


def find_column(columns: pd.Index | list[str], name: str) -> str | None:
    """The actual column matching `name` (exact first, then case-insensitive), or None."""
    if name in columns:
        return name
    lowered = {str(c).lower(): c for c in columns}
    return lowered.get(name.lower())


def signed_absmax(values: np.ndarray) -> np.ndarray:
    """Row-wise value with the largest |value| (sign kept), NaNs skipped; NaN if a row is all-NaN."""
    values = np.asarray(values, dtype=np.float64)
    filled = np.where(np.isfinite(values), np.abs(values), -1.0)
    idx = filled.argmax(axis=1)
    out = values[np.arange(values.shape[0]), idx]
    out[filled.max(axis=1) < 0] = np.nan
    return out


def qrst_angle(qrs_axis: np.ndarray, t_axis: np.ndarray) -> np.ndarray:
    """|((QRS - T + 180) mod 360) - 180|: the unsigned frontal QRS-T angle in [0, 180]."""
    diff = np.asarray(qrs_axis, dtype=np.float64) - np.asarray(t_axis, dtype=np.float64)
    return np.abs(np.mod(diff + 180.0, 360.0) - 180.0)


def _indexed(table: pd.DataFrame, what: str) -> pd.DataFrame:
    """Index a feature table by its `ecg_id` column (found by name), numeric cells only."""
    key = find_column(table.columns, "ecg_id")
    if key is None and table.index.name is not None and table.index.name.lower() == "ecg_id":
        return table
    if key is None:
        raise ValueError(f"{what} feature table has no ecg_id column (columns start {list(table.columns[:5])}); "
                         "pass the PTB-XL+ features/<source>_features.csv file")
    ids = pd.to_numeric(table[key], errors="coerce")
    if ids.isna().any():
        row = int(np.flatnonzero(ids.isna().to_numpy())[0])
        raise ValueError(f"{what} feature table: row {row} has a non-numeric ecg_id {table[key].iloc[row]!r}; "
                         "fix or drop that row")
    out = table.drop(columns=[key])
    out.index = pd.Index(ids.astype(np.int64), name="ecg_id")
    if out.index.has_duplicates:
        dup = out.index[out.index.duplicated()].unique()[:5].tolist()
        raise ValueError(f"{what} feature table: duplicate ecg_id values {dup}; keep one row per record")
    return out


def _numeric(table: pd.DataFrame, cols: list[str]) -> np.ndarray:
    return np.stack([pd.to_numeric(table[c], errors="coerce").to_numpy(np.float64) for c in cols], axis=1)


def compute_panel(f12sl: pd.DataFrame, fecgdeli: pd.DataFrame | None) -> pd.DataFrame:
    """Raw concept values: index ecg_id (union of both tables), the 49 concepts as float64 columns.

    Non-numeric cells read as NaN (the manifest builder counts and reports them beforehand).
    A source column absent from its table is an error naming it; `fecgdeli=None` leaves the
    ecgdeli concepts NaN.
    """
    tables = {"12sl": _indexed(f12sl, "12sl")}
    if fecgdeli is not None:
        tables["ecgdeli"] = _indexed(fecgdeli, "ecgdeli")
    index = tables["12sl"].index
    if "ecgdeli" in tables:
        index = index.union(tables["ecgdeli"].index)
    index = index.sort_values()
    aligned = {src: t.reindex(index) for src, t in tables.items()}
    out: dict[str, np.ndarray] = {}
    for c in CONCEPTS:
        table = aligned.get(c.source)
        if table is None:
            out[c.name] = np.full(len(index), np.nan)
            continue
        cols = []
        for name in c.source_columns():
            actual = find_column(table.columns, name)
            if actual is None:
                raise ValueError(f"{c.source} feature table lacks column {name!r} (needed by concept {c.name}); "
                                 "use the PTB-XL+ release tables, which carry every panel column")
            cols.append(actual)
        values = _numeric(table, cols)
        if c.aggregation == "global":
            out[c.name] = values[:, 0]
        elif c.aggregation == "qrst_angle":
            out[c.name] = qrst_angle(values[:, 0], values[:, 1])
        else:
            out[c.name] = signed_absmax(values)
        out[c.name] = np.where(np.isfinite(out[c.name]), out[c.name], np.nan)
    return pd.DataFrame(out, index=pd.Index(index, name="ecg_id"))[concept_names()].astype(np.float64)
