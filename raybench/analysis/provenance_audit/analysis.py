"""provenance_audit: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from raybench.analysis.api import Analysis, RenderInputs, RunInputs
from raybench.analysis.provenance_audit.section import SECTIONS
from raybench.core.config import RunConfig


def run_audit(inp: RunInputs) -> Mapping[str, pd.DataFrame]:
    from raybench.analysis.provenance_audit.run import run_provenance

    return run_provenance(inp.root, inp.cfg)


def draw(inp: RenderInputs) -> list[Path]:
    """The audit's figures from its tables (none when it never ran)."""
    from raybench.analysis.provenance_audit.figures import make_provenance_figures
    from raybench.analysis.provenance_audit.run import TABLES
    from raybench.analysis.report.plotting import load_tables

    tables = load_tables(inp.layout.tables_dir, TABLES)
    return make_provenance_figures(tables, inp.layout.figures_dir) if tables else []


def enabled(cfg: RunConfig) -> bool:
    return cfg.provenance.enabled


ANALYSIS = Analysis("provenance_audit", sections=SECTIONS, run=run_audit, render=draw, enabled=enabled)
