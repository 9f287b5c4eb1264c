"""Fixed denominators: refuse an incomplete grid by default, and flag every short denominator when allowed.

The protocol's published code refuses to summarize an incomplete grid. raybench does the same unless the
user passes `--allow-incomplete`; then every analysis table carries, per row, how many grid cells its scope
holds in the protocol (`n_expected`, the fixed denominator) and how many of those are ok (`n_present`), and
`short_denominator` = n_present < n_expected. A row's scope is the set of grid cells its estimate may draw
on (e.g. a model's profile: every primary cell of that model; a curve point: the model's primary cells at
that E); a common-scale AUC also leaves out a depth with any E missing, so a short row may rest on fewer
cells than n_present.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from raybench.core.config import GridProtocol
from raybench.core.errors import RaybenchError

DENOM_COLUMNS = ["n_expected", "n_present", "short_denominator"]
GRID_COLUMNS = ["arm", "model", "q", "expansion", "seed"]
MAX_LISTED = 60  # missing cell ids named in the refusal message
KEY = ("model", "q", "expansion", "seed", "arm")


def cell_label(model: str, q: float, expansion: int, seed: int, arm: str) -> str:
    """The cell id of a grid point, as the SAE stage names it (raybench.sae.cells.CellSpec.cell_id).

    Used for cells that have no row in the cells table; tests check the two formats agree.
    """
    return f"{model}-q{round(float(q) * 100):03d}-E{int(expansion):02d}-{arm}-s{int(seed)}"


def expected_cells(grid: GridProtocol) -> list[tuple[str, float, int, int, str]]:
    """Grid product models x depths x expansions x seeds, plus the sensitivity arm at its depth."""
    keys = [(m, grid_q(q), int(e), int(s), "primary")
            for q, e, s, m in itertools.product(grid.depths, grid.expansions, grid.seeds, grid.models)]
    if grid.sensitivity_depth is not None:
        keys += [(m, grid_q(grid.sensitivity_depth), int(e), int(s), "sensitivity")
                 for e, s, m in itertools.product(grid.expansions, grid.seeds, grid.models)]
    return keys


def grid_q(q: Any) -> float:
    """A relative depth as the grid's keys hold it (6 decimals)."""
    return round(float(q), 6)


class AnalysisError(RaybenchError, RuntimeError):
    """The run folder cannot be analyzed; the message names the file and what to run first."""


class IncompleteGridError(AnalysisError):
    """Some expected cells are missing or failed and `allow_incomplete` was not given."""


def missing_ids(missing: pd.DataFrame) -> list[str]:
    """Cell ids of the missing table's rows (grid points with no row get the SAE stage's id for them)."""
    return [str(r.cell_id) if str(r.cell_id) else cell_label(r.model, r.q, r.expansion, r.seed, r.arm)
            for r in missing.itertuples(index=False)]


def check_complete(missing: pd.DataFrame, n_expected: int, allow_incomplete: bool) -> None:
    """Raise IncompleteGridError naming the missing/failed cells unless the grid is whole or allowed."""
    if missing.empty or allow_incomplete:
        return
    ids = missing_ids(missing)
    reasons = [str(r) for r in missing.reason]
    listed = "\n".join(f"  {i}: {r}" for i, r in zip(ids[:MAX_LISTED], reasons[:MAX_LISTED], strict=True))
    more = f"\n  ... and {len(ids) - MAX_LISTED} more (tables/missing.csv lists them all)" if len(ids) > MAX_LISTED \
        else ""
    raise IncompleteGridError(
        f"the grid is incomplete: {len(ids)} of {n_expected} expected cells are missing or failed:\n{listed}{more}\n"
        "The protocol summarizes only a complete grid (failed cells stay in its fixed denominator). Rerun "
        "`raybench train` (or `raybench grid`) to finish them, or pass --allow-incomplete to analyze the ok "
        "cells; every table then says which denominators are short (n_expected, n_present, short_denominator).")


# ---------------------------------------------------------------- counting


def grid_frame(expected: Iterable[tuple], ok: pd.DataFrame) -> pd.DataFrame:
    """Expected grid keys (arm, model, q, expansion, seed) with a `present` flag (an ok cell exists)."""
    grid = pd.DataFrame(list(expected), columns=GRID_COLUMNS)
    have = set(map(tuple, ok[GRID_COLUMNS].itertuples(index=False, name=None)))
    grid["present"] = [tuple(k) in have for k in grid[GRID_COLUMNS].itertuples(index=False, name=None)]
    return grid


def counts(grid: pd.DataFrame, by: list[str], **where) -> pd.DataFrame:
    """n_expected / n_present per `by` group among grid rows matching `where` (column == value)."""
    sel = grid
    for col, value in where.items():
        sel = sel[sel[col] == value]
    out = sel.groupby(by, sort=True)["present"].agg(n_expected="size", n_present="sum").reset_index()
    out["n_present"] = out["n_present"].astype(int)
    return out


def attach(df: pd.DataFrame, cnt: pd.DataFrame, on: dict[str, str]) -> pd.DataFrame:
    """Left-join counts onto df (on: table column -> grid column) and add short_denominator."""
    key = cnt.rename(columns={g: t for t, g in on.items()})
    left = df.drop(columns=[c for c in DENOM_COLUMNS if c in df.columns])
    merged = left.merge(key, on=list(on), how="left", validate="many_to_one")
    return finish(merged)


def finish(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for col in ("n_expected", "n_present"):
        df[col] = pd.to_numeric(df[col], errors="coerce").fillna(0).astype(int) if col in df else 0
    df["short_denominator"] = (df["n_present"] < df["n_expected"]).astype(bool)
    return df


def sum_of(df: pd.DataFrame, cnt: pd.DataFrame, key: str, cols: tuple[str, str]) -> pd.DataFrame:
    """Rows naming two groups (e.g. model_a, model_b): the sum of both groups' counts."""
    look = cnt.set_index(key)
    df = df.copy()
    for what in ("n_expected", "n_present"):
        df[what] = sum(df[c].map(look[what]).fillna(0).to_numpy() for c in cols)
    return finish(df)


def annotate_base(name: str, df: pd.DataFrame, grid: pd.DataFrame, sensitivity_depth: float | None) -> pd.DataFrame:
    """Add the denominator columns to one of the base analysis tables (tables.COLUMNS)."""
    prim = grid[grid.arm == "primary"]
    if name in ("profiles", "concepts", "crossed"):
        return attach(df, counts(prim, ["model"]), {"model": "model"})
    if name == "curves":
        return attach(df, counts(prim, ["model", "expansion"]), {"model": "model", "expansion": "expansion"})
    if name in ("depth_scale", "reproducibility"):
        return attach(df, counts(prim, ["model", "q", "expansion"]),
                      {"model": "model", "q": "q", "expansion": "expansion"})
    if name == "contrasts":
        return sum_of(df, counts(prim, ["model"]), "model", ("model_a", "model_b"))
    if name == "rank_stability":
        return sum_of(df, counts(prim, ["expansion"]), "expansion", ("expansion_a", "expansion_b"))
    if name == "arm":
        sub = grid if sensitivity_depth is None else grid[grid.q == sensitivity_depth]
        return attach(df, counts(sub, ["model", "expansion"]), {"model": "model", "expansion": "expansion"})
    if name == "sensitivity":
        return _annotate_sensitivity(df, grid, sensitivity_depth)
    return df


def _annotate_sensitivity(df: pd.DataFrame, grid: pd.DataFrame, sensitivity_depth: float | None) -> pd.DataFrame:
    prim = grid[grid.arm == "primary"]
    by_q = counts(prim, ["model", "q"]).set_index(["model", "q"])
    by_e = counts(prim, ["model", "expansion"]).set_index(["model", "expansion"])
    sub = grid if sensitivity_depth is None else grid[grid.q == sensitivity_depth]
    by_arm = counts(sub, ["model", "arm"]).set_index(["model", "arm"])
    n_exp, n_pre = np.zeros(len(df), dtype=int), np.zeros(len(df), dtype=int)
    for i, (m, factor, level) in enumerate(zip(df.model, df.factor, df.level, strict=True)):
        if factor == "depth":
            look, key = by_q, (m, round(float(level), 6))
        elif factor == "scale":
            look, key = by_e, (m, int(level))
        elif factor == "arm":
            look, key = by_arm, (m, str(level))
        else:
            continue
        if key in look.index:
            n_exp[i], n_pre[i] = look.loc[key, "n_expected"], look.loc[key, "n_present"]
    return finish(df.assign(n_expected=n_exp, n_present=n_pre))
