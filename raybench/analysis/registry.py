"""Every analysis raybench runs on a finished grid, in report order: the one list to extend (docs/architecture.md
§4, "Add an analysis"). The analyze stage runs each enabled analysis' `run` in this order, then every `render`;
`raybench report` runs every `render` and the report shows every analysis' sections in this order.
"""

from __future__ import annotations

from raybench.analysis.api import Analysis
from raybench.analysis.atlas import analysis as atlas
from raybench.analysis.features import analysis as features
from raybench.analysis.paper_vs_run import analysis as paper_vs_run
from raybench.analysis.provenance_audit import analysis as provenance_audit
from raybench.analysis.release_audit import analysis as release_audit
from raybench.analysis.reliability import analysis as reliability
from raybench.analysis.run_info import analysis as run_info
from raybench.analysis.secondary import analysis as secondary
from raybench.analysis.summary import analysis as summary

ANALYSES: list[Analysis] = [
    summary.ANALYSIS,
    release_audit.ANALYSIS,
    atlas.ANALYSIS,
    secondary.ANALYSIS,
    provenance_audit.ANALYSIS,
    reliability.ANALYSIS,
    features.ANALYSIS,
    paper_vs_run.ANALYSIS,
    run_info.ANALYSIS,
]

