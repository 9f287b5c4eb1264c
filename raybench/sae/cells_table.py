"""tables/cells.parquet: one row per expected cell of the grid, ok or failed with its reason.

The SAE stage's product and the analysis stage's input (raybench.analysis reads the columns it needs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from raybench.core.config import RunConfig
from raybench.core.paths import RunLayout
from raybench.core.privacy import failure_text, is_credentialed
from raybench.sae.cell_files import load_cell_metrics
from raybench.sae.cells import CellSpec
from raybench.sae.freshness import cell_done, expected_provenance

CELLS_TABLE_COLUMNS = [
    "cell_id", "model", "layer", "n_layers", "q", "realized_depth", "arm", "expansion", "n_latents", "k", "seed",
    "status", "val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass", "test_accessibility",
    "test_coverage", "train_seconds", "config_hash", "cell_dir",
]


def collect_cells_table(cfg: RunConfig, cells: list[CellSpec], errors: dict[str, str]) -> pd.DataFrame:
    """One row per expected cell, in grid order; a missing cell is `failed: <reason>`, never dropped.

    A cell is `ok` only when complete for this config and the current activation stores (raybench.sae.freshness).
    """
    layout = RunLayout.at(cfg.run_dir)
    expect = expected_provenance(layout.root, cfg.config_hash(), cells)
    rows = []
    for c in cells:
        cdir = layout.cell_dir(c.cell_id)
        row: dict[str, Any] = {
            "cell_id": c.cell_id, "model": c.model, "layer": c.layer, "n_layers": c.n_layers, "q": c.q,
            "realized_depth": c.realized_depth, "arm": c.arm, "expansion": c.expansion, "n_latents": c.n_latents,
            "k": c.k, "seed": c.seed, "config_hash": cfg.config_hash(),
            "cell_dir": str(cdir.relative_to(layout.root)),
        }
        if cell_done(layout, expect, c):
            m = load_cell_metrics(cdir)
            row.update(status="ok", train_seconds=float(m.get("train_seconds", np.nan)))
            for key in ("val_r2", "test_r2", "val_dead_fraction", "val_mean_l0", "gate_pass",
                        "test_accessibility", "test_coverage"):
                row[key] = m.get(key, np.nan)
        else:
            reason = errors.get(c.stack_id, "not trained (trial did not finish)")
            if c.stack_id in errors and is_credentialed(cfg):  # however `errors` was made: no record ids
                reason = failure_text(reason, True)
            row.update(status=f"failed: {reason}", train_seconds=np.nan)
        rows.append(row)
    df = pd.DataFrame(rows)
    for col in CELLS_TABLE_COLUMNS:
        if col not in df:
            df[col] = np.nan
    df["gate_pass"] = df["gate_pass"].astype("boolean")
    return df[CELLS_TABLE_COLUMNS]
