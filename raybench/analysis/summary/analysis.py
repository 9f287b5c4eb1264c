"""summary: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from raybench.analysis.api import Analysis
from raybench.analysis.summary.section import SECTIONS

ANALYSIS = Analysis("summary", sections=SECTIONS)
