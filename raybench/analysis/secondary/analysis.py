"""The secondary analyses as one entry of the registry (raybench.analysis.registry)."""

from __future__ import annotations

import pandas as pd

from raybench.analysis.api import Analysis, RunInputs
from raybench.analysis.secondary.figures import draw_secondary_figures
from raybench.analysis.secondary.section import SECTIONS


def run_secondary_analyses(inp: RunInputs) -> dict[str, pd.DataFrame]:
    from raybench.analysis.secondary.run import run_secondary

    return run_secondary(inp.root, inp.protocol, inp.cfg)


ANALYSIS = Analysis("secondary", sections=SECTIONS, run=run_secondary_analyses, render=draw_secondary_figures)
