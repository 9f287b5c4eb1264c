"""run_info: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from raybench.analysis.api import Analysis
from raybench.analysis.run_info.section import SECTIONS

ANALYSIS = Analysis("run_info", sections=SECTIONS)
