"""Figures: PNG + SVG for every figure of a fake run, byte-identical on rerun, tolerant of gaps."""

from __future__ import annotations

import logging

import matplotlib
import matplotlib.image
import numpy as np
import pytest
from fake_run import small_protocol, write_fake_run

from raybench.analysis.atlas.figures import FIGURES, fig_forest_auc, fig_matched_scale_curves, make_figures
from raybench.analysis.report.plotting import RC, error_bars, load_tables
from raybench.core.paths import RunLayout

STEMS = {spec.stem for spec in FIGURES}


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    root = write_fake_run(tmp_path_factory.mktemp("run"), small_protocol(), cohort_kind="ptbxl")
    first = make_figures(root, parallel=False)
    return root, {p: p.read_bytes() for p in first}


def test_every_figure_as_png_and_svg(drawn):
    root, files = drawn
    fig_dir = RunLayout.at(root).figures_dir
    assert {p.name for p in files} == {f"{s}.{e}" for s in STEMS for e in ("png", "svg")}
    assert set(fig_dir.iterdir()) == set(files)  # no temp files left behind
    for path, data in files.items():
        if path.suffix == ".png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
            img = matplotlib.image.imread(path)
            assert img.shape[0] > 250 and img.shape[1] > 400 and img[..., :3].std() > 0.05  # not blank
        else:
            text = data.decode()
            assert text.lstrip().startswith("<?xml") and "<svg" in text and "dc:date" not in text


def test_rerun_is_byte_identical_and_ray_tasks_draw_the_same_bytes(drawn, ray_cluster):
    root, files = drawn
    again = make_figures(root, parallel=True)  # drawn by Ray tasks and this process together
    assert sorted(again) == sorted(files)
    changed = [p.name for p in again if p.read_bytes() != files[p]]
    assert changed == []


def test_missing_tables_are_skipped_with_a_note(tmp_path, caplog):
    write_fake_run(tmp_path, small_protocol(), tables=("profiles", "rank_stability"))
    with caplog.at_level(logging.INFO, logger="raybench.analysis.report.figures"):
        written = make_figures(tmp_path)
    assert sorted(p.name for p in written) == ["forest_auc.png", "forest_auc.svg", "rank_stability.png",
                                               "rank_stability.svg"]
    assert "figure matched_scale_curves skipped: table(s) ['curves'] missing" in caplog.text


def test_empty_run_draws_nothing(tmp_path):
    assert make_figures(tmp_path) == []


@pytest.mark.parametrize("models", [("only",), tuple(f"m{i:02d}" for i in range(12))])
def test_any_number_of_models(tmp_path, models):
    write_fake_run(tmp_path, small_protocol(), models=models, tables=("profiles", "curves", "crossed"))
    t = load_tables(RunLayout.at(tmp_path).tables_dir)
    with matplotlib.rc_context(RC):
        forest = fig_forest_auc(t)
        curves = fig_matched_scale_curves(t)
    assert len(forest.axes) == 3
    ticks = [tick.get_text() for tick in forest.axes[0].get_yticklabels()]
    assert sorted(ticks) == sorted(models)
    colors = {tuple(np.round(line.get_color(), 3)) for line in curves.axes[0].get_lines()}
    assert len(colors) == len(models)  # one distinct colour per model
    assert len(make_figures(tmp_path)) == 4


def test_heatmap_marks_the_peak_cell(tmp_path):
    write_fake_run(tmp_path, small_protocol(), models=("a", "b"), tables=("depth_scale",))
    from raybench.analysis.atlas.figures import fig_accessibility_heatmaps

    t = load_tables(RunLayout.at(tmp_path).tables_dir)
    fig = fig_accessibility_heatmaps(t)
    ds = t["depth_scale"][t["depth_scale"].metric == "accessibility"]
    for ax, model in zip(fig.axes[:2], ("a", "b"), strict=True):
        grid = ds[ds.model == model].pivot(index="q", columns="expansion", values="value")
        i, j = np.unravel_index(np.argmax(grid.to_numpy()), grid.shape)
        (box,) = ax.patches
        assert box.get_xy() == (j - 0.5, i - 0.5)


def test_error_bars_never_negative_when_the_point_lies_outside_its_interval():
    bars = error_bars([0.30, 0.10], [0.32, 0.05], [0.40, 0.12])
    np.testing.assert_allclose(bars, [[0.0, 0.05], [0.10, 0.02]])
