"""Run-level driver of the secondary analyses: calibration ladder, input harmonization, intervention.

    run_secondary(root, protocol, cfg) -> {table name: DataFrame}

Needs a finished grid (manifest, activation stores, tables/cells.parquet with the E = 8 primary cells).
Each analysis fans out as Ray tasks (per model x depth, per model); an analysis whose inputs are missing
is skipped with a logged note, and one that fails is logged and left out without losing the others.
Writes tables/{calibration,harmonization,intervention}*.parquet (+ .csv) and figures/ with the same prefixes.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pandas as pd

from raybench.analysis.secondary import SecondaryConfig
from raybench.config import Protocol, RunConfig

log = logging.getLogger(__name__)


def run_secondary(root: str | Path, protocol: Protocol, cfg: RunConfig, scfg: SecondaryConfig | None = None,
                  *, strict: bool = False) -> dict[str, pd.DataFrame]:
    """Run every analysis in scfg.analyses (default SecondaryConfig.demo() for the demo protocol, else the
    paper settings). strict=True re-raises the first failure instead of logging it (tests, debugging)."""
    from raybench.analysis.secondary.calibration import run_calibration
    from raybench.analysis.secondary.harmonization import run_harmonization
    from raybench.analysis.secondary.intervention import run_intervention
    from raybench.ray_session import init_ray

    if scfg is None:
        scfg = SecondaryConfig.demo() if protocol.name == "demo" else SecondaryConfig()
    scfg.validate()
    init_ray(cfg.resources)
    steps = {
        "calibration": lambda: run_calibration(root, protocol, scfg),
        "harmonization": lambda: run_harmonization(root, protocol, cfg, scfg),
        "intervention": lambda: run_intervention(root, protocol, scfg),
    }
    out: dict[str, pd.DataFrame] = {}
    for name in scfg.analyses:
        t0 = time.perf_counter()
        try:
            tables = steps[name]()
        except Exception as err:  # one analysis failing must not lose the others
            if strict:
                raise
            log.error("secondary analysis %s failed: %s: %s", name, type(err).__name__, err)
            continue
        out.update(tables)
        log.info("secondary analysis %s: %d tables in %.1fs", name, len(tables), time.perf_counter() - t0)
    return out
