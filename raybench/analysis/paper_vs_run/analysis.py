"""paper_vs_run: its entry in the registry (raybench.analysis.registry). It runs after every analysis above it in
the registry, so the secondary analyses' tables (Tables 1, S2, S5) meet their published numbers."""

from __future__ import annotations

import pandas as pd

from raybench.analysis.api import Analysis, RunInputs
from raybench.analysis.paper_vs_run.section import SECTIONS


def compare_with_paper(inp: RunInputs) -> dict[str, pd.DataFrame]:
    from raybench.analysis.paper_vs_run.run import write_comparison

    return {"paper_comparison": write_comparison(inp.root, inp.cfg.cohort.kind)}


ANALYSIS = Analysis("paper_vs_run", sections=SECTIONS, run=compare_with_paper)
