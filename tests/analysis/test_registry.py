"""Adding an analysis is one folder and one entry of raybench.analysis.registry.ANALYSES. The example of
docs/architecture.md §4.1 (docs/examples/cell_counts/, copied as a user would into raybench/analysis/) gets its
table computed by the analyze stage, its figure drawn from that table (and redrawn by `raybench report`), its
section shown in report order, and `raybench analyze --only cell_counts` runs it alone."""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from fake_run import small_protocol, write_fake_run

import raybench.analysis
from raybench.analysis import registry
from raybench.analysis.api import Analysis, RenderInputs
from raybench.core.config import demo_run
from raybench.core.paths import RunLayout

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "cell_counts"


@pytest.fixture
def example_analysis(tmp_path, monkeypatch) -> Analysis:
    """docs/examples/cell_counts copied into raybench/analysis/ (an extra search folder of the package, so the
    checkout is left as it is) and imported as raybench.analysis.cell_counts."""
    extra = tmp_path / "analysis_pkg"
    shutil.copytree(EXAMPLE, extra / "cell_counts")
    monkeypatch.setattr(raybench.analysis, "__path__", [*raybench.analysis.__path__, str(extra)])
    for name in [m for m in sys.modules if m.startswith("raybench.analysis.cell_counts")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    example = importlib.import_module("raybench.analysis.cell_counts.analysis").ANALYSIS
    # drawn here, not in Ray tasks: a Ray worker (when another test left Ray up) cannot import the temporary copy
    return dataclasses.replace(example, render=lambda inp: example.render(dataclasses.replace(inp, parallel=False)))


def _registered(monkeypatch, example: Analysis) -> None:
    import raybench.infra.ray_session

    views = {a.name: a for a in registry.ANALYSES}
    # the views around it stay (summary first, run info last); the costly analyses are not this test's
    monkeypatch.setattr(registry, "ANALYSES", [views["summary"], views["release_audit"], example, views["run_info"]])
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)


def test_the_documented_example_analysis_gets_its_table_figure_and_section(tmp_path, monkeypatch, example_analysis):
    from raybench.analysis.stage import render_outputs, run_analyze_stage

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))
    _registered(monkeypatch, example_analysis)
    cfg = dataclasses.replace(demo_run(str(root)), protocol=small_protocol())

    result = run_analyze_stage(cfg)
    assert list(result.tables) == ["cell_counts"] and list(result.tables["cell_counts"]) == ["cell_counts"]
    layout = RunLayout.at(root)
    table = pd.read_parquet(layout.tables_dir / "cell_counts.parquet")
    cells = pd.read_parquet(layout.cells_table)
    ok = cells[cells.status == "ok"]
    assert table.cells_ok.sum() == len(ok) and (table.n_present == table.cells_ok).all()
    assert list(table.columns) == ["arm", "model", "cells_ok", "median_val_r2", "n_expected", "n_present",
                                   "short_denominator"]
    figure = layout.figures_dir / "cell_counts.png"
    assert figure in result.rendered.figures and figure.exists()
    html = layout.report.read_text()
    ids = [html.index(f'<section id="{i}"') for i in ("summary", "audit", "cell_counts", "protocol")]
    assert ids == sorted(ids), "sections in registry order"
    section = html[ids[2]:ids[3]]
    assert "Median validation R² of each model" in section and "R<sup>2</sup>" in section

    figure.unlink()  # `raybench report` redraws every figure from the tables, the new analysis' too
    before = set(Path(p).name for p in layout.tables_dir.iterdir())
    render_outputs(root, cfg.protocol)
    assert figure.exists() and set(Path(p).name for p in layout.tables_dir.iterdir()) == before


def test_analyze_only_runs_the_named_analysis_alone(tmp_path, monkeypatch, example_analysis):
    from raybench.analysis.completeness import AnalysisError
    from raybench.analysis.stage import run_analyze_stage

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))
    _registered(monkeypatch, example_analysis)
    ran: list[str] = []
    spy = Analysis("spy", run=lambda inp: ran.append("spy") or {})  # an enabled analysis that --only leaves out
    monkeypatch.setattr(registry, "ANALYSES", [spy, *registry.ANALYSES])
    cfg = dataclasses.replace(demo_run(str(root)), protocol=small_protocol())
    assert list(run_analyze_stage(cfg).tables) == ["spy", "cell_counts"] and ran == ["spy"]
    result = run_analyze_stage(cfg, only=("cell_counts",))
    assert list(result.tables) == ["cell_counts"] and ran == ["spy"]
    with pytest.raises(AnalysisError, match=r"--only nope: no such analysis.*choose from .*cell_counts"):
        run_analyze_stage(cfg, only=("nope",))


def test_every_registered_analysis_declares_sections_with_unique_ids():
    ids = [s.id for a in registry.ANALYSES for s in a.sections]
    assert len(ids) == len(set(ids))
    assert [a.name for a in registry.ANALYSES][:3] == ["summary", "release_audit", "atlas"]
    assert all(isinstance(a, Analysis) and a.name for a in registry.ANALYSES)
    assert all(callable(a.render) for a in registry.ANALYSES if a.captions), "an analysis with figures draws them"
    assert RenderInputs(Path("x"), None).layout.root == Path("x")
