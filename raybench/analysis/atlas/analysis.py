"""atlas: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from raybench.analysis.api import Analysis, RenderInputs, RunInputs
from raybench.analysis.atlas.figures import FIGURES
from raybench.analysis.atlas.paper_section import PAPER_SECTIONS
from raybench.analysis.atlas.section import BASE_SECTIONS

ORDER = ("profiles", "contrasts", "crossed_contrasts", "curves", "depth", "concepts", "stability", "arm_sensitivity",
         "reproducibility", "reproducibility_auc", "fidelity_gate", "atlas", "dead_fraction")


def run_atlas(inp: RunInputs) -> Mapping[str, pd.DataFrame]:
    from raybench.analysis.atlas.run import analyze_run

    return analyze_run(inp.root, inp.protocol, num_workers=inp.num_workers, cohort_kind=inp.cfg.cohort.kind,
                       allow_incomplete=inp.allow_incomplete)


def draw_atlas(inp: RenderInputs) -> list[Path]:
    from raybench.analysis.atlas.figures import make_figures

    return make_figures(inp.root, inp.parallel)


ANALYSIS = Analysis("atlas", sections=tuple({**BASE_SECTIONS, **PAPER_SECTIONS}[s] for s in ORDER), run=run_atlas,
                    render=draw_atlas, captions={spec.stem: spec.caption for spec in FIGURES})
