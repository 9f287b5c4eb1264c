"""The analyze stage: one sequence, run by `raybench analyze` and by `raybench grid` alike.

    every enabled analysis' run, in registry order (Ray bootstraps and tasks) -> every render (figures drawn
    from the tables, the release audit) -> report.html

`run_analyze_stage` is the only place that sequence is written; `raybench report` runs the last two steps
(`render_outputs`) without recomputing anything. The analysis code is imported only when the stage runs, so the
stage sequence (raybench.app.pipeline) stays cheap to import.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from raybench.core.config import Protocol, RunConfig
from raybench.core.paths import RunLayout
from raybench.infra.stage import Stage

if TYPE_CHECKING:
    from raybench.analysis.release_audit.run import AuditResult


@dataclass(frozen=True)
class Rendered:
    """What `render_outputs` wrote: figure files (figures/*.png|svg; the dashboards' images are not counted), the
    release audit (None without a protocol) and the report."""

    figures: list[Path]
    audit: AuditResult | None
    report: Path


@dataclass(frozen=True)
class AnalyzeResult:
    """What the analyze stage wrote: each analysis' tables (by analysis name) and the rendering."""

    tables: dict[str, dict[str, pd.DataFrame]]
    rendered: Rendered

    def summary(self) -> str:
        """One line for the pipeline's progress display."""
        audit = self.rendered.audit
        n = sum(len(t) for t in self.tables.values())
        return (f"{n} tables, {len(self.rendered.figures)} figures; "
                f"audit: {audit.summary if audit is not None else 'not run'}")


def render_outputs(root: str | Path, protocol: Protocol | None, parallel: bool | None = None,
                   only: tuple[str, ...] | None = None) -> Rendered:
    """Every analysis' figures from the tables (or only those of the analyses named in `only`: a command that
    rewrote just their tables), the release audit against `protocol` (audit.json kept as it is when None),
    report.html."""
    from raybench.analysis.api import RenderInputs
    from raybench.analysis.records import read_audit
    from raybench.analysis.registry import ANALYSES
    from raybench.analysis.release_audit.run import AuditResult
    from raybench.analysis.stage import render_report

    inp = RenderInputs(RunLayout.at(root).root, protocol, parallel)
    written: list[Path] = []
    for analysis in ANALYSES:
        if analysis.render is not None and (only is None or analysis.name in only):
            written += analysis.render(inp)
    figures = [p for p in written if p.suffix in (".png", ".svg") and p.parent == inp.layout.figures_dir]
    recorded = read_audit(root) if protocol is not None else None
    audit = AuditResult.from_dict(recorded) if recorded is not None else None
    return Rendered(figures, audit, render_report(root))


def run_analyze_stage(cfg: RunConfig, num_workers: int | None = None, allow_incomplete: bool = False,
                      only: tuple[str, ...] | None = None) -> AnalyzeResult:
    """Analyze the finished run in cfg.run_dir (a local folder): every enabled analysis (or only those named in
    `only`, whatever their switch), then figures, audit and report. Raises analysis.completeness.IncompleteGridError
    for an incomplete grid unless allow_incomplete; an unknown name in `only` raises AnalysisError naming the
    choices. num_workers caps concurrent Ray tasks (results do not depend on it)."""
    from raybench.analysis.api import RunInputs
    from raybench.analysis.registry import ANALYSES
    from raybench.infra import progress, ray_session

    root = RunLayout.at(cfg.run_dir).root
    todo = _selected(ANALYSES, cfg, only)
    ray_session.init_ray(cfg.resources)
    shown = progress.current()  # the run's live display: analyses done, tables and figures written
    shown.start("analyze", "analyze steps", len(todo) + 1, "steps")
    inp = RunInputs(root, cfg, num_workers, allow_incomplete)
    tables: dict[str, dict[str, pd.DataFrame]] = {}
    for i, analysis in enumerate(todo, 1):
        tables[analysis.name] = dict(analysis.run(inp))
        n = sum(len(t) for t in tables.values())
        shown.update("analyze", done=i, info=f"{n} tables written" + ("; figures, audit, report" if i == len(todo)
                                                                        else ""))
    shown.finish("bootstrap")
    rendered = render_outputs(root, cfg.protocol)
    n = sum(len(t) for t in tables.values())
    shown.update("analyze", done=len(todo) + 1)
    shown.finish("analyze", f"{n} tables, {len(rendered.figures)} figures written")
    return AnalyzeResult(tables, rendered)


def _selected(analyses: list, cfg: RunConfig, only: tuple[str, ...] | None) -> list:
    """The analyses whose `run` the stage calls: the enabled ones, or exactly those named in `only`."""
    runnable = [a for a in analyses if a.run is not None]
    if not only:
        return [a for a in runnable if a.enabled(cfg)]
    from raybench.analysis.completeness import AnalysisError

    names = [a.name for a in runnable]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise AnalysisError(f"--only {', '.join(unknown)}: no such analysis with tables to compute; "
                            f"choose from {', '.join(names)}")
    return [a for a in runnable if a.name in only]


def render_report(root: str | Path) -> Path:
    """report.html from what the run folder holds, with every registered analysis' sections; a run with a
    protocol and a cells table but no audit.json gets its release audit first."""
    from raybench.analysis.records import read_audit
    from raybench.analysis.registry import ANALYSES
    from raybench.analysis.release_audit.run import release_audit
    from raybench.analysis.report.render import render_document
    from raybench.core.run_state import run_protocol

    layout = RunLayout.at(root)
    if read_audit(root) is None:
        protocol = run_protocol(root)
        if protocol is not None and layout.cells_table.exists():
            release_audit(root, protocol)
    return render_document(root, ANALYSES)


# ---------------------------------------------------------------- the Stage of `raybench grid`

def local_run_dir(run_dir: str) -> Path:
    """The local run folder `raybench analyze` / `report` read (an AnalysisError for a remote or missing one)."""
    from raybench.analysis.completeness import AnalysisError

    if "://" in run_dir:
        raise AnalysisError(f"--run-dir {run_dir}: figures and the report need a local run folder; copy it first "
                            f"(e.g. `aws s3 sync {run_dir} runs/local`) and pass that folder")
    path = Path(run_dir)
    if not path.is_dir():
        raise AnalysisError(f"--run-dir {run_dir} is not a folder: give the run folder written by `raybench grid`")
    return path


def analyze_complete(cfg: RunConfig) -> bool:
    """report.html exists and is newer than the cells table."""
    layout = RunLayout.at(cfg.run_dir)
    if not layout.cells_table.exists():
        return False
    return layout.report.exists() and layout.report.stat().st_mtime >= layout.cells_table.stat().st_mtime


def analyze_run(cfg: RunConfig, remote: str | None = None, allow_incomplete: bool = False) -> str:
    """Run the analyze stage; an incomplete grid raises analysis.completeness.IncompleteGridError (a
    RaybenchError) unless allow_incomplete."""
    return run_analyze_stage(cfg, allow_incomplete=allow_incomplete).summary()


def analyze_stage(allow_incomplete: bool = False) -> Stage:
    """The analyze stage; allow_incomplete analyzes a grid with missing or failed cells (see `raybench analyze`)."""
    run = functools.partial(analyze_run, allow_incomplete=True) if allow_incomplete else analyze_run
    return Stage("analyze", inputs=("cells_table",), is_complete=analyze_complete, run=run)


ANALYZE_STAGE = analyze_stage()
