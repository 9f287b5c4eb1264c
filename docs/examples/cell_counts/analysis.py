"""cell_counts: its entry in raybench.analysis.registry.ANALYSES."""

from __future__ import annotations

from raybench.analysis.api import Analysis, RenderInputs
from raybench.analysis.cell_counts.figures import FIGURES
from raybench.analysis.cell_counts.run import count_cells
from raybench.analysis.cell_counts.section import SECTIONS
from raybench.analysis.report.figures import draw_figures


def _render(inp: RenderInputs) -> list:
    return draw_figures(inp.root, FIGURES, parallel=inp.parallel)


ANALYSIS = Analysis("cell_counts", sections=SECTIONS, run=count_cells, render=_render,
                    captions={spec.stem: spec.caption for spec in FIGURES})
