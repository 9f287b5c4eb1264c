"""Secondary analyses of the paper's appendices (docs/protocol.md §9), run on a finished grid:

- calibration ladder at E = protocol.eval.calibration_expansion (`calibration.py`),
- input-harmonization audit at the final layer (`harmonization.py`),
- matched-effect intervention selectivity at the final layer (`intervention.py`),

driven by `run.run_secondary(root, protocol, cfg)`, which the analyze stage calls (raybench.analysis.stage).
Tables go to tables/{calibration,harmonization,intervention}*.parquet (+ .csv) and figures to figures/ with the
same prefixes, so the report picks them up. This module holds what the three share: their settings and the
run-folder look-ups. Their settings, `SecondaryConfig`, are the run config's `secondary` section
(raybench.core.analysis_config).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

from raybench.core.analysis_config import SECONDARY_ANALYSES as ANALYSES
from raybench.core.analysis_config import SecondaryConfig
from raybench.core.config import Protocol

log = logging.getLogger(__name__)

__all__ = ["ANALYSES", "SecondaryConfig", "calibration_cells"]

def calibration_cells(root: str | Path, protocol: Protocol, expansion: int | None = None) -> pd.DataFrame:
    """Primary-arm cells at the calibration expansion with status ok (model, q, layer, n_layers, seed, cell_dir)."""
    from raybench.core.paths import RunLayout

    layout = RunLayout.at(root)
    if not layout.cells_table.exists():
        raise FileNotFoundError(f"{layout.cells_table} not found: run the grid (raybench grid / train) first")
    e = protocol.eval.calibration_expansion if expansion is None else expansion
    cells = pd.read_parquet(layout.cells_table)
    keep = (cells["arm"] == "primary") & (cells["expansion"] == e) & (cells["status"] == "ok")
    keep &= cells["model"].isin(protocol.grid.models)
    out = cells.loc[keep, ["model", "q", "layer", "n_layers", "seed", "n_latents", "k", "cell_dir"]].copy()
    out["cell_dir"] = [str(layout.root / p) for p in out["cell_dir"]]
    return out.sort_values(["model", "q", "seed"], kind="stable").reset_index(drop=True)
