"""Numbers the paper states that the base and paper-analysis tables do not hold yet, each as a table.

Pure functions of a cell frame (one row per ok cell: arm, model, q, expansion, seed, the test metrics, the
dead fraction of the published inference's split, validation R^2 and dead fraction) and of the tables
`analyze_run` already wrote. docs/protocol.md §10.3 names, for each table, the published script and its rule:

- dead_fraction_summary: per model, the plain mean over the depth x E configurations of the seed-mean dead
  fraction (Table 2, Appendix D: the paper's summary, the published audit's model_profiles, first) beside the
  common-scale AUC over log E (raybench's);
- scale_depth_summary: Table S4 as printed - rows by E (mean over models and depths) and by depth (mean over
  models and E) of the seed means, dead fraction included;
- marginal_means: Appendix D - validation R^2 and dead fraction by E, by model and by depth;
- headline_numbers: BH-significant patient-bootstrap contrasts per metric, median / minimum scale tau and arm
  tau, the arm AUC difference range, the E = 8 anchor's maximum |difference| (over every metric and model, as
  the published sensitivity script), the leaders' rank-1 probability and stability AUCs;
- concept_distribution: the accessibility leader's concept-level AUCs: median, quartiles, counts at or above
  .40 / .50 / .60, and the top concepts.

Each has a `paper` column: the published value of the same quantity (raybench.analysis.published) when the
run's cohort is the one the paper reports it for, else NaN.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raybench.analysis.completeness import DENOM_COLUMNS, attach, counts, finish
from raybench.analysis.published import paper_values

CELL_METRICS = ("reconstruction", "accessibility", "coverage", "dead_fraction")
VAL_METRICS = ("val_r2", "val_dead_fraction")
CONCEPT_THRESHOLDS = (0.40, 0.50, 0.60)
TOP_CONCEPTS = 5
SIG = 0.05  # BH-adjusted p below this counts as significant (the published facts script)
NUMBER_COLUMNS: dict[str, list[str]] = {
    "dead_fraction_summary": ["model", "split", "mean_over_configs", "n_configs", "auc", "ci_low", "ci_high",
                              "paper"],
    "scale_depth_summary": ["axis", "setting", "metric", "value", "split", "n_configs", "paper"],
    "marginal_means": ["by", "level", "metric", "value", "n_configs", "paper"],
    "headline_numbers": ["quantity", "metric", "model", "value", "paper", "paper_model"],
    "concept_distribution": ["model", "quantity", "concept", "value", "paper", "paper_model"],
}
TABLE_COLUMNS = {name: [*cols, *DENOM_COLUMNS] for name, cols in NUMBER_COLUMNS.items()}  # as analyze writes them


def setting_label(axis: str, value: object) -> str:
    """The key a grouped row's setting has in the data file: E as an integer, depth as %g, a model as is."""
    if axis == "expansion":
        return str(int(value))
    if axis == "depth":
        return f"{float(value):g}"
    return str(value)


def _paper_of(cohort_kind: str | None, **where: str) -> pd.DataFrame:
    """Published rows for the run's cohort (none for a cohort the paper does not report)."""
    if cohort_kind not in ("ptbxl", "mimic"):
        return paper_values(source="-")  # an empty frame with the columns
    return paper_values(cohort=cohort_kind, **where)


def config_means(cells: pd.DataFrame, metrics: tuple[str, ...]) -> pd.DataFrame:
    """Seed mean of each metric per primary (model, q, expansion) configuration."""
    prim = cells[cells.arm == "primary"] if "arm" in cells else cells
    return prim.groupby(["model", "q", "expansion"], sort=True)[list(metrics)].mean().reset_index()


# ---------------------------------------------------------------- dead fraction (issue item 8)


def dead_fraction_summary(cells: pd.DataFrame, dead_auc: pd.DataFrame, split: str, models: list[str],
                          cohort_kind: str | None) -> pd.DataFrame:
    """Per model: the paper's plain mean over depth x E configurations, then raybench's log-E AUC with its CI.

    cells: the cell frame (`dead_fraction` column); dead_auc: the `dead_fraction_auc` table."""
    conf = config_means(cells, ("dead_fraction",))
    plain = conf.groupby("model", sort=False).dead_fraction.agg(["mean", "count"])
    auc = dead_auc.set_index("model") if len(dead_auc) else pd.DataFrame(columns=["auc", "ci_low", "ci_high"])
    pub = _paper_of(cohort_kind, source="table_2", metric="dead_fraction")
    pub = dict(zip(pub.model, pub.value, strict=True))
    rows = []
    for m in models:
        if m not in plain.index:
            continue
        a = auc.loc[m] if m in auc.index else None
        rows.append((m, split, float(plain.loc[m, "mean"]), int(plain.loc[m, "count"]),
                     *(float(a[c]) if a is not None else np.nan for c in ("auc", "ci_low", "ci_high")),
                     pub.get(m, np.nan)))
    return pd.DataFrame(rows, columns=NUMBER_COLUMNS["dead_fraction_summary"])


# ---------------------------------------------------------------- Table S4 and Appendix D


def scale_depth_summary(cells: pd.DataFrame, split: str, cohort_kind: str | None) -> pd.DataFrame:
    """Table S4: rows by E (plain mean over models x depths) and by depth (over models x E) of the seed means."""
    conf = config_means(cells, CELL_METRICS)
    pub = _paper_of(cohort_kind, source="table_s4")
    pub = {(a, s, m): v for a, s, m, v in zip(pub.axis, pub.setting, pub.metric, pub.value, strict=True)}
    rows = []
    for axis, col in (("expansion", "expansion"), ("depth", "q")):
        for level, g in conf.groupby(col, sort=True):
            setting = setting_label(axis, level)
            for metric in CELL_METRICS:
                rows.append((axis, setting, metric, float(g[metric].mean()), split if metric == "dead_fraction"
                             else "test", int(g[metric].notna().sum()), pub.get((axis, setting, metric), np.nan)))
    return pd.DataFrame(rows, columns=NUMBER_COLUMNS["scale_depth_summary"])


def marginal_means(cells: pd.DataFrame, models: list[str], cohort_kind: str | None) -> pd.DataFrame:
    """Appendix D: validation R^2 and dead fraction, plain means of the seed means by E, by model, by depth."""
    conf = config_means(cells, VAL_METRICS)
    pub = _paper_of(cohort_kind, source="appendix_d")
    pub = {(a, s, m): v for a, s, m, v in zip(pub.axis, pub.setting, pub.metric, pub.value, strict=True)}
    rank = {m: i for i, m in enumerate(models)}
    rows = []
    for by, col in (("expansion", "expansion"), ("model", "model"), ("depth", "q")):
        groups = conf.groupby(col, sort=True)
        keys = sorted(groups.groups, key=lambda k: rank.get(k, len(rank))) if by == "model" else sorted(groups.groups)
        for level in keys:
            g = groups.get_group(level)
            label = setting_label(by, level)
            for metric in VAL_METRICS:
                rows.append((by, label, metric, float(g[metric].mean()), int(g[metric].notna().sum()),
                             pub.get((by, label, metric), np.nan)))
    return pd.DataFrame(rows, columns=NUMBER_COLUMNS["marginal_means"])


# ---------------------------------------------------------------- headline numbers of the results text


def _leader(df: pd.DataFrame, value: str = "auc") -> pd.Series | None:
    """The row with the highest value (ties: the first model name), None when empty."""
    if df.empty:
        return None
    return df.sort_values([value, "model"], ascending=[False, True], kind="stable").iloc[0]


def headline_numbers(tables: dict[str, pd.DataFrame], cohort_kind: str | None) -> pd.DataFrame:
    """The results text's counts and summaries, from the tables analyze_run wrote (absent tables: no rows)."""
    rows: list[tuple[str, str, str, float]] = []
    con = tables.get("contrasts")
    if con is not None:
        for metric, g in con.groupby("metric", sort=False):
            rows += [("significant_contrasts", metric, "", float((g.p_bh < SIG).sum())),
                     ("n_contrasts", metric, "", float(len(g)))]
    for name, prefix in (("rank_stability", "scale_tau"), ("arm_rank_agreement", "arm_tau")):
        df = tables.get(name)
        if df is not None:
            for metric, g in df.groupby("metric", sort=False):
                rows += [(f"{prefix}_median", metric, "", float(g.kendall_tau.median())),
                         (f"{prefix}_min", metric, "", float(g.kendall_tau.min()))]
    aucd = tables.get("arm_auc_differences")
    if aucd is not None:
        for metric, g in aucd.groupby("metric", sort=False):
            rows += [("arm_auc_diff_min", metric, "", float(g["diff"].min())),
                     ("arm_auc_diff_max", metric, "", float(g["diff"].max()))]
    armd = tables.get("arm_differences")
    if armd is not None and (armd.expansion == 8).any():
        rows.append(("e8_anchor_max_abs_diff", "all", "", float(armd[armd.expansion == 8]["diff"].abs().max())))
    prof = tables.get("profiles")
    if prof is not None:
        for metric, g in prof.groupby("metric", sort=False):
            top = _leader(g)
            if top is not None and "rank1_prob" in g:
                rows.append(("rank1_prob", metric, str(top.model), float(top.rank1_prob)))
    rep = tables.get("reproducibility_auc")
    if rep is not None:
        for measure, g in rep.groupby("measure", sort=False):
            top = _leader(g)
            if top is not None:
                rows.append(("auc", measure, str(top.model), float(top.auc)))
    df = pd.DataFrame(rows, columns=NUMBER_COLUMNS["headline_numbers"][:4])
    pub = _paper_of(cohort_kind, source="results")
    pub = {(q, m): (v, mod) for q, m, v, mod in zip(pub.quantity, pub.metric, pub.value, pub.model, strict=True)}
    df["paper"] = [pub.get((q, m), (np.nan, ""))[0] for q, m in zip(df.quantity, df.metric, strict=True)]
    df["paper_model"] = [pub.get((q, m), (np.nan, ""))[1] for q, m in zip(df.quantity, df.metric, strict=True)]
    return df[NUMBER_COLUMNS["headline_numbers"]]


def concept_distribution(concepts: pd.DataFrame, profiles: pd.DataFrame, cohort_kind: str | None) -> pd.DataFrame:
    """The accessibility leader's concept-level common-scale AUCs: quartiles, counts at thresholds, top concepts."""
    acc = profiles[profiles.metric == "accessibility"] if profiles is not None else pd.DataFrame()
    top = _leader(acc)
    if top is None or concepts is None or concepts.empty:
        return pd.DataFrame(columns=NUMBER_COLUMNS["concept_distribution"])
    model = str(top.model)
    c = concepts[concepts.model == model]
    auc = c.auc.to_numpy(np.float64)
    rows = [(model, "concept_median", "", float(np.median(auc))),
            (model, "concept_q25", "", float(np.percentile(auc, 25))),
            (model, "concept_q75", "", float(np.percentile(auc, 75)))]
    rows += [(model, f"concept_n_at_least_{t:.2f}", "", float((auc >= t).sum())) for t in CONCEPT_THRESHOLDS]
    rows.append((model, "concept_n_concepts", "", float(len(auc))))
    best = c.sort_values(["auc", "concept"], ascending=[False, True], kind="stable").head(TOP_CONCEPTS)
    rows += [(model, "concept_top", str(name), float(v)) for name, v in zip(best.concept, best.auc, strict=True)]
    df = pd.DataFrame(rows, columns=NUMBER_COLUMNS["concept_distribution"][:4])
    pub = _paper_of(cohort_kind, source="results", metric="accessibility")
    pub = {q: (v, m) for q, v, m in zip(pub.quantity, pub.value, pub.model, strict=True) if q.startswith("concept_")}
    df["paper"] = [pub.get(q, (np.nan, ""))[0] for q in df.quantity]
    df["paper_model"] = [pub.get(q, (np.nan, ""))[1] for q in df.quantity]
    return df[NUMBER_COLUMNS["concept_distribution"]]


# ---------------------------------------------------------------- denominators (completeness.py)


def _counts_by(grid: pd.DataFrame, col: str, axis: str) -> dict[str, tuple[int, int]]:
    """setting label -> (n_expected, n_present) of the grid rows at each value of `col`."""
    cnt = counts(grid, [col])
    return {setting_label(axis, v): (int(e), int(p)) for v, e, p in zip(cnt[col], cnt.n_expected, cnt.n_present,
                                                                         strict=True)}


def _with_counts(df: pd.DataFrame, pairs: list[tuple[int, int]]) -> pd.DataFrame:
    out = df.assign(n_expected=[e for e, _ in pairs], n_present=[p for _, p in pairs])
    return finish(out)


def with_denominators(name: str, df: pd.DataFrame, grid: pd.DataFrame,
                      sensitivity_depth: float | None) -> pd.DataFrame:
    """The completeness.py columns for one of these tables: each row's scope is the grid cells it draws on (a
    model's primary cells; the primary cells at one E or depth; the whole primary grid for a headline count;
    both arms at the sensitivity depth for the arm numbers)."""
    prim = grid[grid.arm == "primary"]
    whole = (len(prim), int(prim.present.sum()))
    if name in ("dead_fraction_summary", "concept_distribution", "concept_intervals"):
        return attach(df, counts(prim, ["model"]), {"model": "model"})
    if name in ("scale_depth_summary", "marginal_means"):
        col = "axis" if name == "scale_depth_summary" else "by"
        level = "setting" if name == "scale_depth_summary" else "level"
        by = {"expansion": _counts_by(prim, "expansion", "expansion"), "depth": _counts_by(prim, "q", "depth"),
              "model": _counts_by(prim, "model", "model")}
        return _with_counts(df, [by[a].get(str(v), (0, 0)) for a, v in zip(df[col], df[level], strict=True)])
    if name == "headline_numbers":
        sub = grid if sensitivity_depth is None else grid[grid.q == sensitivity_depth]
        arm = (len(sub), int(sub.present.sum()))
        return _with_counts(df, [arm if q.startswith(("arm_", "e8_")) else whole for q in df.quantity])
    return _with_counts(df, [(len(grid), int(grid.present.sum()))] * len(df))  # the run as a whole


# ---------------------------------------------------------------- on a run


def number_tables(cells: pd.DataFrame, split: str, tables: dict[str, pd.DataFrame], models: list[str],
                  cohort_kind: str | None, grid: pd.DataFrame | None = None,
                  sensitivity_depth: float | None = None) -> dict[str, pd.DataFrame]:
    """Every table above from the cell frame and the tables analyze_run has built so far; with `grid`
    (completeness.grid_frame), each with its denominator columns (TABLE_COLUMNS)."""
    dead_auc = tables.get("dead_fraction_auc", pd.DataFrame(columns=["model", "auc", "ci_low", "ci_high"]))
    out = {
        "dead_fraction_summary": dead_fraction_summary(cells, dead_auc, split, models, cohort_kind),
        "scale_depth_summary": scale_depth_summary(cells, split, cohort_kind),
        "marginal_means": marginal_means(cells, models, cohort_kind),
        "headline_numbers": headline_numbers(tables, cohort_kind),
        "concept_distribution": concept_distribution(tables.get("concepts"), tables.get("profiles"), cohort_kind),
    }
    if grid is None:
        return out
    return {name: with_denominators(name, df, grid, sensitivity_depth)[TABLE_COLUMNS[name]]
            for name, df in out.items()}


def cell_frame(ok: pd.DataFrame, point: np.ndarray, dead: np.ndarray, metric_names: tuple[str, ...]) -> pd.DataFrame:
    """One row per ok cell: keys, test metrics (point [cells, 3] in metric_names order), dead fraction, validation."""
    out = ok[["arm", "model", "q", "expansion", "seed"]].copy().reset_index(drop=True)
    for k, metric in enumerate(metric_names):
        out[metric] = np.asarray(point)[:, k]
    out["dead_fraction"] = np.asarray(dead, dtype=np.float64)
    for col in VAL_METRICS:
        out[col] = ok[col].astype(float).to_numpy()
    return out
