"""`raybench grid` end to end on a small real run: every stage, then an idempotent rerun."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from raybench.cli import main
from raybench.config import dump_run_config
from raybench.paths import RunLayout
from raybench.pipeline import run_pipeline
from tests.small_run import small_config

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "explore_run.ipynb"


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, ray_cluster):
    cfg = small_config(tmp_path_factory.mktemp("pipeline") / "run")
    cfg = replace(cfg, resources=replace(cfg.resources, trial_unit="model"))
    lines: list[str] = []
    timings = run_pipeline(cfg, echo=lines.append)
    return cfg, timings, lines


@pytest.mark.slow
def test_grid_runs_every_stage_and_writes_the_report(finished_run):
    cfg, timings, lines = finished_run
    layout = RunLayout.at(cfg.run_dir)
    assert [t for t in ("cohort", "manifest", "encode", "train", "analyze") if timings[t] <= 0] == []
    assert any("audit: 16/16 cells, 8/8 blocks" in line for line in lines), lines
    for table in ("cells", "profiles", "contrasts", "curves", "rank_stability", "crossed", "depth_scale",
                  "reproducibility", "concepts", "arm", "calibration", "harmonization", "intervention"):
        assert (layout.tables_dir / f"{table}.parquet").exists(), table
        assert (layout.tables_dir / f"{table}.csv").exists(), table
    assert list(layout.figures_dir.glob("*.png")) and list(layout.figures_dir.glob("*.svg"))
    html = layout.report.read_text()
    assert "Release audit" in html and "Calibration" in html and "<img" in html
    assert "config_hash" in layout.run_yaml.read_text()


@pytest.mark.slow
def test_rerun_recomputes_nothing_and_keeps_tables_byte_identical(finished_run):
    cfg, _, _ = finished_run
    layout = RunLayout.at(cfg.run_dir)
    before = _digest(layout.tables_dir)
    cells_before = {p.name: p.stat().st_mtime_ns for p in layout.cells_dir.iterdir()}
    lines: list[str] = []
    timings = run_pipeline(cfg, echo=lines.append)
    assert all("skipped" in line for line in lines), lines
    assert timings["total"] < 60
    assert _digest(layout.tables_dir) == before
    assert {p.name: p.stat().st_mtime_ns for p in layout.cells_dir.iterdir()} == cells_before


@pytest.mark.slow
def test_cli_refuses_a_run_folder_of_another_config(finished_run, tmp_path):
    cfg, _, _ = finished_run
    other = replace(cfg, protocol=replace(cfg.protocol, sae=replace(cfg.protocol.sae, steps=7)))
    path = tmp_path / "other.yaml"
    path.write_text(dump_run_config(other))
    result = CliRunner().invoke(main, ["grid", "--config", str(path)])
    assert result.exit_code != 0 and "another config" in result.output


@pytest.mark.slow
def test_notebook_reproduces_the_figures_from_a_real_run(finished_run, monkeypatch, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cfg, _, _ = finished_run
    monkeypatch.setenv("RAYBENCH_RUN_DIR", str(Path(cfg.run_dir).resolve()))
    monkeypatch.delenv("MPLBACKEND", raising=False)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert len([o for o in outputs if "image/png" in o.get("data", {})]) >= 4
