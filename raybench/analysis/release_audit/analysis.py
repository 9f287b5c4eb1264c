"""release_audit: its entry in the registry (raybench.analysis.registry). See the package docstring."""

from __future__ import annotations

from pathlib import Path

from raybench.analysis.api import Analysis, RenderInputs
from raybench.analysis.release_audit.section import SECTIONS


def write_audit(inp: RenderInputs) -> list[Path]:
    """tables/audit.json against the run's protocol (left as it is when the run recorded none)."""
    from raybench.analysis.records import AUDIT_FILE
    from raybench.analysis.release_audit.run import release_audit

    if inp.protocol is None:
        return []
    release_audit(inp.root, inp.protocol)
    return [inp.layout.tables_dir / AUDIT_FILE]


ANALYSIS = Analysis("release_audit", sections=SECTIONS, render=write_audit)
