"""The analyze stage of `raybench grid` as a `raybench.infra.stage.Stage`: a thin wrapper around
`raybench.analysis.stage.run_analyze_stage`, the one analyze sequence `raybench analyze` runs too (tables ->
secondary analyses -> figures -> release audit -> report). Kept apart from that module so that importing the
stage sequence (`raybench.app.pipeline`) does not import the analysis code."""

from __future__ import annotations

import functools
from pathlib import Path

from raybench.core.config import RunConfig
from raybench.core.paths import RunLayout
from raybench.infra.stage import Stage


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
    from raybench.analysis import stage

    return stage.run_analyze_stage(cfg, allow_incomplete=allow_incomplete).summary()


def analyze_stage(allow_incomplete: bool = False) -> Stage:
    """The analyze stage; allow_incomplete analyzes a grid with missing or failed cells (see `raybench analyze`)."""
    run = functools.partial(analyze_run, allow_incomplete=True) if allow_incomplete else analyze_run
    return Stage("analyze", inputs=("cells_table",), is_complete=analyze_complete, run=run)


ANALYZE_STAGE = analyze_stage()
