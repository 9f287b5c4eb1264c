"""What `analyze_run` reads from a finished run folder: the ok cells of the protocol grid, the grid points
with no ok cell (and why), the concept panel the cells share and the cohort kind.

Only ok cells enter the analysis; a retried cell may have several rows in tables/cells.parquet, and an ok
one wins.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from raybench.analysis.completeness import GRID_COLUMNS, AnalysisError, check_complete, expected_cells, grid_frame
from raybench.analysis.inference.packed_stats import StatsError
from raybench.core.atomic import read_json
from raybench.core.config import Protocol
from raybench.core.paths import RunLayout
from raybench.core.run_state import read_run_yaml, run_section

# the columns of tables/cells.parquet the analysis reads (the SAE stage writes more)
ANALYZED_CELL_COLUMNS = ("cell_id", "model", "q", "arm", "expansion", "seed", "status", "val_r2",
                         "val_dead_fraction", "cell_dir")
MISSING_COLUMNS = [*GRID_COLUMNS, "cell_id", "reason"]


def rounded_q(q: float) -> float:
    """A relative depth as every analysis table keys it (6 decimals)."""
    return round(float(q), 6)


def read_cells(layout: RunLayout) -> pd.DataFrame:
    """tables/cells.parquet with q rounded and expansion, seed as ints; refused without the analyzed columns."""
    if not layout.cells_table.exists():
        raise AnalysisError(f"{layout.cells_table}: no cells table; run `raybench train` (or `raybench grid`) first")
    cells = pd.read_parquet(layout.cells_table)
    lacking = [c for c in ANALYZED_CELL_COLUMNS if c not in cells.columns]
    if lacking:
        raise AnalysisError(f"{layout.cells_table}: missing column(s) {lacking}; rewrite it with the SAE stage")
    cells = cells.copy()
    cells["q"] = cells["q"].map(rounded_q)
    cells["expansion"] = cells["expansion"].astype(int)
    cells["seed"] = cells["seed"].astype(int)
    return cells


def expected_keys(protocol: Protocol) -> list[tuple[str, str, float, int, int]]:
    """Every grid point (arm, model, q, expansion, seed) of the protocol: the release audit's expected cells
    (audit.expected_cells), ordered by arm (primary first), then the grid's model, depth, E and seed order."""
    g = protocol.grid
    rank = {"arm": {"primary": 0, "sensitivity": 1}, "model": {m: i for i, m in enumerate(g.models)},
            "q": {rounded_q(q): i for i, q in enumerate(g.depths)}, "expansion": {int(e): i for i, e in
                                                                                    enumerate(g.expansions)},
            "seed": {int(s): i for i, s in enumerate(g.seeds)}}
    keys = [(arm, m, q, e, s) for m, q, e, s, arm in expected_cells(g)]
    return sorted(keys, key=lambda k: tuple(rank[col].get(v, -1) for col, v in zip(GRID_COLUMNS, k, strict=True)))


def select_ok(cells: pd.DataFrame, protocol: Protocol) -> tuple[pd.DataFrame, pd.DataFrame]:
    """-> (ok cells of the protocol grid in a fixed order, missing grid points with reasons)."""
    by_key: dict[tuple, dict] = {}
    for r in cells.to_dict("records"):  # a retried cell may have several rows: an ok one wins
        key = tuple(r[c] for c in GRID_COLUMNS)
        if key not in by_key or str(r["status"]) == "ok":
            by_key[key] = r
    ok_rows, missing = [], []
    for key in expected_keys(protocol):
        row = by_key.get(key)
        if row is None:
            missing.append((*key, "", "no row in cells table"))
        elif str(row["status"]) != "ok":
            missing.append((*key, str(row["cell_id"]), str(row["status"])))
        else:
            ok_rows.append(row)
    missing_df = pd.DataFrame(missing, columns=MISSING_COLUMNS)
    if not ok_rows:
        raise AnalysisError("no ok cells of the protocol grid in the cells table; nothing to analyze")
    return pd.DataFrame(ok_rows).reset_index(drop=True), missing_df


def read_concepts(layout: RunLayout, ok: pd.DataFrame) -> list[str]:
    """The concept list every ok cell's metrics.json names (one panel for all cells, else refused)."""
    names: list[str] | None = None
    for cid, cdir in zip(ok.cell_id, ok.cell_dir, strict=True):
        path = layout.root / str(cdir) / "metrics.json"
        if not path.exists():
            raise StatsError(f"{path}: missing for ok cell {cid}; rerun the SAE stage for it")
        got = list(read_json(path).get("concepts", []))
        if not got:
            raise StatsError(f"{path}: no 'concepts' list")
        if names is None:
            names = got
        elif got != names:
            raise StatsError(f"{path}: concept list differs from the other cells; every cell must use one panel")
    return names or []


def recorded_cohort_kind(layout: RunLayout) -> str:
    """The cohort kind in run.yaml ("synth" when the run has none)."""
    cohort = run_section(read_run_yaml(layout.root), "cohort")
    return str((cohort or {}).get("kind", "synth"))


@dataclass(frozen=True)
class GridCells:
    """The ok cells of a run's grid and its fixed denominators, in one read (what an analysis that summarizes the
    grid starts from): `ok` (ok cells, grid order), `missing` (grid points without an ok cell, with the reason)
    and `grid` (every expected grid point with a `present` flag: give it to completeness.counts / attach)."""

    ok: pd.DataFrame
    missing: pd.DataFrame
    grid: pd.DataFrame


def grid_cells(layout: RunLayout, protocol: Protocol, allow_incomplete: bool = False) -> GridCells:
    """read_cells + select_ok + check_complete + grid_frame: an incomplete grid raises IncompleteGridError naming
    the cells unless allow_incomplete (then every table says its short denominators)."""
    ok, missing = select_ok(read_cells(layout), protocol)
    expected = expected_keys(protocol)
    check_complete(missing, len(expected), allow_incomplete)
    return GridCells(ok, missing, grid_frame(expected, ok))
