"""cell_counts' report section: its table and figure, matched by stem."""

from __future__ import annotations

from raybench.analysis.api import Section

SECTIONS = (Section("cell_counts", "Cells per model",
                    intro="Ok cells and their median validation R<sup>2</sup> per model and arm.",  # raw HTML
                    figures=("cell_counts",), tables=("cell_counts",)),)
