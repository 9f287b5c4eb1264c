"""Adding an analysis is one folder and one entry of raybench.analysis.registry.ANALYSES: a tiny analysis declared
here (as a folder would declare it) gets its table computed by the analyze stage, its figure drawn from that table
(and redrawn by `raybench report`), and its section shown in report order."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
from fake_run import small_protocol, write_fake_run
from matplotlib.figure import Figure

from raybench.analysis import registry
from raybench.analysis.api import Analysis, RenderInputs, RunInputs, Section
from raybench.analysis.report.figures import draw_figures
from raybench.analysis.report.plotting import FigureSpec, Tables
from raybench.core.atomic import write_table
from raybench.core.config import demo_run
from raybench.core.paths import RunLayout


def _count_cells(inp: RunInputs) -> dict[str, pd.DataFrame]:
    cells = pd.read_parquet(RunLayout.at(inp.root).cells_table)
    counts = cells.groupby("model", sort=True).size().rename("cells").reset_index()
    write_table(RunLayout.at(inp.root).tables_dir / "tiny_counts.parquet", counts)
    return {"tiny_counts": counts}


def _bars(t: Tables) -> Figure:
    fig = Figure(figsize=(3, 2))
    ax = fig.subplots()
    ax.bar(t["tiny_counts"].model, t["tiny_counts"].cells)
    return fig


TINY_FIGURES = (FigureSpec("tiny_counts", ("tiny_counts",), _bars, "Cells per model (a test analysis)."),)
TINY = Analysis(
    "tiny",
    sections=(Section("tiny", "Tiny analysis", "Cells per model.", figures=("tiny_*",), tables=("tiny_*",)),),
    run=_count_cells,
    render=lambda inp: draw_figures(inp.root, TINY_FIGURES, parallel=False),
    captions={s.stem: s.caption for s in TINY_FIGURES},
)


def test_a_registered_analysis_gets_its_table_figure_and_section(tmp_path, monkeypatch):
    import raybench.infra.ray_session
    from raybench.analysis.stage import render_outputs, run_analyze_stage

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))
    views = {a.name: a for a in registry.ANALYSES}
    # the views around it stay (summary first, run info last); the costly analyses are not this test's
    monkeypatch.setattr(registry, "ANALYSES", [views["summary"], views["release_audit"], TINY, views["run_info"]])
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)
    cfg = dataclasses.replace(demo_run(str(root)), protocol=small_protocol())

    result = run_analyze_stage(cfg)
    assert list(result.tables) == ["tiny"] and list(result.tables["tiny"]) == ["tiny_counts"]
    layout = RunLayout.at(root)
    assert (layout.tables_dir / "tiny_counts.parquet").exists()
    figure = layout.figures_dir / "tiny_counts.png"
    assert figure in result.rendered.figures and figure.exists()
    html = layout.report.read_text()
    ids = [html.index(f'<section id="{i}"') for i in ("summary", "audit", "tiny", "protocol")]
    assert ids == sorted(ids), "sections in registry order"
    tiny = html[ids[2]:ids[3]]
    assert "Cells per model (a test analysis)." in tiny and "tiny_counts" in tiny

    figure.unlink()  # `raybench report` redraws every figure from the tables, the new analysis' too
    before = set(Path(p).name for p in layout.tables_dir.iterdir())
    render_outputs(root, cfg.protocol)
    assert figure.exists() and set(Path(p).name for p in layout.tables_dir.iterdir()) == before


def test_every_registered_analysis_declares_sections_with_unique_ids():
    ids = [s.id for a in registry.ANALYSES for s in a.sections]
    assert len(ids) == len(set(ids))
    assert [a.name for a in registry.ANALYSES][:3] == ["summary", "release_audit", "atlas"]
    assert all(isinstance(a, Analysis) and a.name for a in registry.ANALYSES)
    assert all(callable(a.render) for a in registry.ANALYSES if a.captions), "an analysis with figures draws them"
    assert RenderInputs(Path("x"), None).layout.root == Path("x")
