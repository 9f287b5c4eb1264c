"""cell_counts' computation: ok cells and median validation R² per model and arm, with fixed denominators."""

from __future__ import annotations

import pandas as pd

from raybench.analysis.api import RunInputs
from raybench.analysis.completeness import DENOM_COLUMNS, attach, counts
from raybench.analysis.run_inputs import grid_cells
from raybench.core.atomic import write_table
from raybench.core.paths import RunLayout

COLUMNS = ["arm", "model", "cells_ok", "median_val_r2", *DENOM_COLUMNS]
"""tables/cell_counts.parquet: one row per (arm, model); stable names, so notebooks can rely on them."""


def count_cells(inp: RunInputs) -> dict[str, pd.DataFrame]:
    """The analysis' `run`: read the grid once (an incomplete grid is refused unless --allow-incomplete), compute,
    attach the denominators, write atomically, return {table name: frame}."""
    layout = RunLayout.at(inp.root)
    cells = grid_cells(layout, inp.protocol, inp.allow_incomplete)
    table = (cells.ok.groupby(["arm", "model"], sort=True)
             .agg(cells_ok=("cell_id", "size"), median_val_r2=("val_r2", "median")).reset_index())
    table = attach(table, counts(cells.grid, ["arm", "model"]), on={"arm": "arm", "model": "model"})[COLUMNS]
    write_table(layout.tables_dir / "cell_counts.parquet", table)
    return {"cell_counts": table}
