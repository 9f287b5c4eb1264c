"""PTB-XL diagnostic superclasses of each record, from `scp_codes` and `scp_statements.csv`.

The manifest carries them as one text column, `diagnostic_superclasses` (sorted superclass names joined by
";", "" for a record with no diagnostic statement), so the provenance audit (docs/protocol.md §12) can pick
its target y = "carries superclass S" without reading the cohort's tables again. A code maps to the
`diagnostic_class` that `scp_statements.csv` gives it (any likelihood, as PTB-XL's own superclass recipe);
without that file a code that is itself a superclass name (NORM, MI, STTC, CD, HYP) maps to itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.manifest import ManifestError

COLUMN = "diagnostic_superclasses"
SEPARATOR = ";"
SUPERCLASSES = ("NORM", "MI", "STTC", "CD", "HYP")


def statement_classes(path: Path) -> dict[str, str]:
    """scp_statements.csv -> {scp code: diagnostic superclass} for diagnostic statements."""
    try:
        table = pd.read_csv(path, index_col=0, dtype=str, keep_default_na=False)
    except Exception as err:
        raise ManifestError(f"cannot read {path} ({type(err).__name__}: {err}); re-download scp_statements.csv"
                            ) from err
    if "diagnostic_class" not in table.columns:
        raise ManifestError(f"{path} has no diagnostic_class column; use PTB-XL's scp_statements.csv")
    classes = table["diagnostic_class"].str.strip()
    return {str(code).strip(): cls for code, cls in classes.items() if cls}


def parse_codes(text: str) -> list[str]:
    """One `scp_codes` cell ("{'NORM': 100.0, 'SR': 0.0}") -> its codes; blank or unparsable -> []."""
    try:
        value = ast.literal_eval(text) if str(text).strip() else {}
    except (ValueError, SyntaxError):
        return []
    return [str(k) for k in value] if isinstance(value, dict) else []


def record_superclasses(scp_codes: pd.Series | np.ndarray, classes: dict[str, str] | None) -> np.ndarray:
    """Per record the sorted superclasses joined by ';' (object array of str)."""
    mapping = classes if classes is not None else {s: s for s in SUPERCLASSES}
    out = []
    for text in scp_codes:
        found = sorted({mapping[c] for c in parse_codes(str(text)) if c in mapping})
        out.append(SEPARATOR.join(found))
    return np.asarray(out, dtype=object)


def database_superclasses(db: pd.DataFrame, root: Path) -> np.ndarray:
    """The column for the rows of `db` (ptbxl_database.csv); all "" when it has no scp_codes column."""
    if "scp_codes" not in db.columns:
        return np.full(len(db), "", dtype=object)
    path = root / "scp_statements.csv"
    return record_superclasses(db["scp_codes"], statement_classes(path) if path.exists() else None)


def target_labels(column: pd.Series | np.ndarray, target: str) -> np.ndarray:
    """y [n] int: 1 where a record's superclasses include `target`, else 0."""
    return np.array([target in str(v).split(SEPARATOR) for v in column], dtype=np.int64)
