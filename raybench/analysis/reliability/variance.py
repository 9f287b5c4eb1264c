"""Training-seed variance decomposition (docs/protocol.md §11.3) with statsmodels' ANOVA.

One ordinary least squares fit per metric over the primary arm's cells,
    value ~ C(model) * C(q) * C(expansion) + C(seed),
and its sequential (type I) sums of squares: on the balanced grid these partition the total, so each share is
that factor's fraction of the metric's variation across cells. `interactions` pools the model x depth x E
interaction terms; `residual` is what is left within a configuration once the seed offset is taken out: the
training-seed noise of one cell, whose root mean square (`s_seed`) the minimum reliable differences use.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

FACTORS = ("model", "depth", "expansion", "seed", "interactions", "residual")
COLUMNS = ["metric", "factor", "sum_sq", "df", "share"]
_TERM = {"C(model)": "model", "C(q)": "depth", "C(expansion)": "expansion", "C(seed)": "seed",
         "Residual": "residual"}


def decompose(frame: pd.DataFrame, value: str, factors: tuple[str, ...] = ("model", "q", "expansion")
              ) -> tuple[pd.DataFrame, float, int]:
    """frame (model, q, expansion, seed, value) -> (rows of COLUMNS without metric, s_seed, its df).

    A factor with one level drops out (share 0)."""
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    df = frame[[*factors, "seed", value]].dropna().rename(columns={value: "y"})
    used = [f for f in factors if df[f].nunique() > 1]
    rhs = " * ".join(f"C({f})" for f in used) or "1"
    if df["seed"].nunique() > 1:
        rhs += " + C(seed)"
    out = {f: (0.0, 0) for f in FACTORS}
    total = float(((df.y - df.y.mean()) ** 2).sum())
    if len(df) < 3 or total == 0.0:
        return _rows(out, total), float("nan"), 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = smf.ols(f"y ~ {rhs}", data=df).fit()
        table = anova_lm(fit, typ=1)
    for term, row in table.iterrows():
        name = _TERM.get(str(term), "interactions")
        ss, dof = out[name]
        out[name] = (ss + float(row["sum_sq"]), dof + int(row["df"]))
    ss_res, df_res = out["residual"]
    s_seed = float(np.sqrt(ss_res / df_res)) if df_res > 0 else float("nan")
    return _rows(out, total), s_seed, int(df_res)


def _rows(out: dict[str, tuple[float, int]], total: float) -> pd.DataFrame:
    return pd.DataFrame([(f, ss, dof, ss / total if total > 0 else np.nan) for f, (ss, dof) in out.items()],
                        columns=COLUMNS[1:])
