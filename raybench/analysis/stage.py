"""The analyze stage: one sequence, run by `raybench analyze` and by `raybench grid` alike.

    tables (Ray bootstraps) -> secondary analyses -> figures -> release audit -> report.html

`run_analyze_stage` is the only place that sequence is written; `raybench report` redraws the last three
steps (`render_outputs`) without recomputing anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raybench import progress, ray_session
from raybench.analysis.audit import AuditResult, release_audit
from raybench.analysis.features.render import write_dashboards
from raybench.analysis.figures import make_figures
from raybench.analysis.report import render_report
from raybench.analysis.secondary.run import run_secondary
from raybench.analysis.tables import analyze_run
from raybench.config import Protocol, RunConfig
from raybench.paths import RunLayout


@dataclass(frozen=True)
class Rendered:
    """What `render_outputs` wrote: figure files, the release audit (None without a protocol) and the report."""

    figures: list[Path]
    audit: AuditResult | None
    report: Path


@dataclass(frozen=True)
class AnalyzeResult:
    """What the analyze stage wrote: the analysis tables, the secondary analyses' tables, and the rendering."""

    tables: dict[str, pd.DataFrame]
    secondary: dict[str, pd.DataFrame]
    rendered: Rendered

    def summary(self) -> str:
        """One line for the pipeline's progress display."""
        audit = self.rendered.audit
        return (f"{len(self.tables) + len(self.secondary)} tables, {len(self.rendered.figures)} figures; "
                f"audit: {audit.summary if audit is not None else 'not run'}")


def render_outputs(root: str | Path, protocol: Protocol | None) -> Rendered:
    """Figures from the tables, the release audit against `protocol` (kept as it is when None), report.html."""
    figures = make_figures(root)
    write_dashboards(root, protocol)  # figures/dashboards/ (open cohorts only; raybench.analysis.features)
    audit = release_audit(root, protocol) if protocol is not None else None
    return Rendered(figures, audit, render_report(root))


def run_analyze_stage(cfg: RunConfig, num_workers: int | None = None, allow_incomplete: bool = False) -> AnalyzeResult:
    """Analyze the finished run in cfg.run_dir (a local folder): every table, the secondary analyses, figures,
    audit and report. Raises analysis.completeness.IncompleteGridError for an incomplete grid unless
    allow_incomplete. num_workers caps concurrent bootstrap tasks (results do not depend on it)."""
    root = RunLayout.at(cfg.run_dir).root
    ray_session.init_ray(cfg.resources)
    shown = progress.current()  # the run's live display: steps done, tables and figures written
    shown.start("analyze", "analyze steps", 3, "steps")
    tables = analyze_run(root, cfg.protocol, num_workers=num_workers, cohort_kind=cfg.cohort.kind,
                         allow_incomplete=allow_incomplete)
    shown.update("analyze", done=1, info=f"{len(tables)} tables written")
    secondary = run_secondary(root, cfg.protocol, cfg)
    from raybench.analysis.paper_vs_run import write_comparison  # every table is in: docs/protocol.md §10.4

    write_comparison(root, cfg.cohort.kind)
    shown.update("analyze", done=2, info=f"{len(tables) + len(secondary)} tables written; figures, audit, report")
    if cfg.provenance.enabled:  # the provenance audit (docs/protocol.md §12)
        from raybench.analysis.provenance_audit.run import run_provenance

        secondary.update(run_provenance(root, cfg))
    if cfg.reliability.enabled or cfg.reliability.cheap:  # the metric reliability audit (docs/protocol.md §11)
        from raybench.analysis.reliability.run import run_reliability

        run_reliability(root, cfg.protocol, cfg.reliability, heavy=cfg.reliability.enabled, num_workers=num_workers)
    shown.finish("bootstrap")
    rendered = render_outputs(root, cfg.protocol)
    shown.update("analyze", done=3)
    shown.finish("analyze", f"{len(tables) + len(secondary)} tables, {len(rendered.figures)} figures written")
    return AnalyzeResult(tables, secondary, rendered)
