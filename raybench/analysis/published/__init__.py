"""The paper's printed numbers as package data: the one owner of every published value raybench shows.

`paper_values.csv` (beside this module, shipped as package data) holds each number the paper prints, one per
row, as printed (docs/protocol.md §10). Columns:

- source: where it is printed (table_1, table_2, table_s1, table_s2, table_s4, table_s5, appendix_d, appendix_e,
  appendix_f (input harmonization text), appendix_g (matched-effect text), design (the benchmark design's cohort
  counts), results = the results text, paper_facts = the protocol's generated facts beside the paper);
- cohort: ptbxl or mimic (the run whose numbers the paper reports);
- quantity, metric, model, axis, setting: what the number is (raybench's model and metric names; axis/setting
  name a row of a grouped table, e.g. expansion / 8 or depth / 0.25);
- value: the number; decimals: how many decimals the paper prints (a run agrees when it rounds to it);
- note: e.g. "approximate" where the paper says so (compared to two decimals); the paper's file:line for the rows
  of issue 42; "at most" / "at least" where the paper prints a bound (a run agrees when it keeps it: `bound`).

Everything that shows a published value (the profiles' `published` column, the reproducibility AUCs, the
`paper` columns of the paper-number tables, the report's "This run vs the paper") reads it from here.
"""

from __future__ import annotations

import functools
from importlib import resources

import numpy as np
import pandas as pd

KEYS = ["source", "cohort", "quantity", "metric", "model", "axis", "setting"]
COLUMNS = [*KEYS, "value", "decimals", "note"]
DATA_FILE = "paper_values.csv"


def _decimals(text: str) -> int:
    return len(text.split(".", 1)[1]) if "." in text else 0


@functools.lru_cache(maxsize=1)
def _read() -> pd.DataFrame:
    with resources.files(__name__).joinpath(DATA_FILE).open("r", encoding="utf-8") as handle:
        raw = pd.read_csv(handle, comment="#", dtype=str, keep_default_na=False)
    if list(raw.columns) != [*KEYS, "value", "note"]:
        raise ValueError(f"{DATA_FILE}: unexpected columns {list(raw.columns)}")
    if raw.duplicated(KEYS).any():
        raise ValueError(f"{DATA_FILE}: duplicate keys {raw[raw.duplicated(KEYS)][KEYS].to_dict('records')}")
    out = raw[KEYS].copy()
    out["value"] = raw.value.astype(float)
    out["decimals"] = [2 if note == "approximate" else _decimals(v.lstrip("+-")) for v, note in
                       zip(raw.value, raw.note, strict=True)]
    out["note"] = raw.note
    return out[COLUMNS]


def paper_values(**where: str) -> pd.DataFrame:
    """Every published number (a copy), optionally filtered by key columns: paper_values(source="table_s1")."""
    df = _read()
    for col, want in where.items():
        if col not in KEYS:
            raise KeyError(f"{col!r} is not a key column of {DATA_FILE} ({', '.join(KEYS)})")
        df = df[df[col] == want]
    return df.reset_index(drop=True).copy()


def model_values(source: str, quantity: str, cohort: str = "ptbxl") -> dict[str, dict[str, float]]:
    """metric -> model -> value of one source and quantity (e.g. the profiles' AUCs of table_s1)."""
    df = paper_values(source=source, quantity=quantity, cohort=cohort)
    out: dict[str, dict[str, float]] = {}
    for metric, model, value in zip(df.metric, df.model, df.value, strict=True):
        out.setdefault(metric, {})[model] = float(value)
    return out


def bound(note: str) -> str:
    """"at most" / "at least" when the note marks the printed number as a bound, else ""."""
    return next((b for b in ("at most", "at least") if b in note), "")


def agrees(ours: float, paper: float, decimals: int, kind: str = "") -> bool:
    """Does a run's value round to what the paper prints? (half a unit of the last printed decimal, plus float
    slack; NaN never agrees). kind: "at most" / "at least" for a printed bound."""
    if not (np.isfinite(ours) and np.isfinite(paper)):
        return False
    if kind:  # a bound (`bound`): kept up to half a printed unit
        slack = 0.5 * 10.0 ** -decimals + 1e-12
        return bool(ours <= paper + slack if kind == "at most" else ours >= paper - slack)
    return bool(abs(ours - paper) <= 0.5 * 10.0 ** -decimals + 1e-12)
