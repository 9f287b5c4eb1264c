"""Figures drawn from a run's tables by their FigureSpecs (report/plotting.py): PNG + SVG, byte-identical on
rerun, in Ray tasks when Ray is up. A figure whose tables are missing or empty is skipped with a logged note."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import matplotlib

from raybench.analysis.inference.shared_jobs import run_jobs
from raybench.analysis.report.plotting import RC, FigureSpec, Tables, load_tables, render_figure, write_rendered
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)


def draw_figures(root: str | Path, specs: Sequence[FigureSpec], parallel: bool | None = None) -> list[Path]:
    """Draw every figure of `specs` whose tables exist under `root`/tables; return the written PNG and SVG paths.

    Figures are drawn by Ray tasks and this process together when Ray is up (the analyze stage; `parallel` None)
    or `parallel` is True, here alone otherwise (`raybench report`); the files are the same bytes either way."""
    import ray

    layout = RunLayout.at(root)
    tables = load_tables(layout.tables_dir)
    todo = []
    for spec in specs:
        missing = [t for t in spec.needs if t not in tables or tables[t].empty]
        if missing:
            log.info("figure %s skipped: table(s) %s missing or empty in %s", spec.stem, missing, layout.tables_dir)
        else:
            todo.append(spec)
    remote = ray.is_initialized() if parallel is None else parallel
    shared = ray.put(tables) if remote and todo else tables  # one copy for every task
    drawn: dict[str, dict[str, bytes] | None] = {}
    for i, rendered in run_jobs([(draw_figure, (spec, shared)) for spec in todo], remote, steal_tail=False):
        drawn[todo[i].stem] = rendered
    written: list[Path] = []
    for spec in todo:  # in the order of `specs`
        if drawn[spec.stem] is None:
            log.info("figure %s skipped: nothing to draw", spec.stem)
        else:
            written += write_rendered(drawn[spec.stem], layout.figures_dir, spec.stem)
    return written


def draw_figure(spec: FigureSpec, tables: Tables) -> dict[str, bytes] | None:
    """One figure as PNG and SVG bytes (None: nothing to draw); a job of draw_figures."""
    with matplotlib.rc_context(RC):
        fig = spec.build(tables)
        return None if fig is None else render_figure(fig)
