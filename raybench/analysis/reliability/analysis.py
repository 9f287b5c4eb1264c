"""reliability: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from raybench.analysis.api import Analysis, RenderInputs, RunInputs
from raybench.analysis.reliability.section import SECTIONS
from raybench.core.config import RunConfig


def run_audit(inp: RunInputs) -> Mapping[str, pd.DataFrame]:
    """The cheap parts in every analyze; the heavy ones too when reliability.enabled."""
    from raybench.analysis.reliability.run import run_reliability

    rcfg = inp.cfg.reliability
    return run_reliability(inp.root, inp.protocol, rcfg, heavy=rcfg.enabled, num_workers=inp.num_workers).tables


def draw(inp: RenderInputs) -> list[Path]:
    from raybench.analysis.reliability.figures import make_reliability_figures

    return make_reliability_figures(inp.root)


def enabled(cfg: RunConfig) -> bool:
    return cfg.reliability.enabled or cfg.reliability.cheap


ANALYSIS = Analysis("reliability", sections=SECTIONS, run=run_audit, render=draw, enabled=enabled)
