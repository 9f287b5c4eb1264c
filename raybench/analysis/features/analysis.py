"""features: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from __future__ import annotations

from pathlib import Path

from raybench.analysis.api import Analysis, RenderInputs
from raybench.analysis.features.section import SECTIONS


def draw(inp: RenderInputs) -> list[Path]:
    """figures/dashboards/ (open cohorts only; the folder is removed when they are off)."""
    from raybench.analysis.features.figures import write_dashboards

    return write_dashboards(inp.root, inp.protocol, inp.parallel)


ANALYSIS = Analysis("features", sections=SECTIONS, render=draw)
