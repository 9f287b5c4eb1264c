"""Feature dashboards in the run folder, the report (size, lazy images, headless Chromium) and the export.

The views are synthetic (model_view and the waveform loader are replaced), so these tests draw, index,
render and export real files without training; tests/analysis/features/test_features_run.py runs the data
side on a trained run.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from fake_run import small_protocol, write_fake_run

import raybench.analysis.features.dashboards as dashboards
import raybench.analysis.features.figures as render
from raybench.analysis.features.cli import FeaturesOutError, out_folder
from raybench.analysis.features.dashboards import ConceptView, ModelView, Pick, pick_records, unexplained_latents
from raybench.analysis.stage import render_report
from raybench.app.cli import main
from raybench.app.export import ExportError, export_run, report_links
from raybench.core.atomic import write_table, write_text
from raybench.core.paths import RunLayout

CONCEPTS = ("qrs_duration", "qt_interval", "r_amp_limb")


def fake_view(root, protocol, model, choice, cells=None) -> ModelView:
    rng = np.random.default_rng(len(model))
    n = 24
    ids = np.arange(1, n + 1) * 10
    act = np.where(rng.random((n, 3)) < 0.5, rng.random((n, 3)) * 3, 0.0)
    values = rng.normal(size=(n, 3))
    cell = {"cell_id": f"{model}-q100-E08-primary-s4311", "layer": 1, "q": 1.0, "expansion": 8, "seed": 4311,
            "k": 8, "n_latents": 64}
    view = ModelView(model, cell, ids, act, values)
    for c, name in enumerate(CONCEPTS):
        picks = [Pick(kind, int(ids[i]), float(act[i, c]), float(values[i, c]))
                 for kind, i in pick_records(act[:, c], ids, choice.top, choice.contrast)]
        view.concepts.append(ConceptView(name, c, 0.1 * c, float((act[:, c] > 0).mean()), picks))
    rows, cols = np.nonzero(act)
    view.unexplained = unexplained_latents(rows, cols, act[rows, cols], n, 3, values, CONCEPTS, np.array([0, 1]),
                                           ids, 0.99, 2)
    return view


def fake_loader(root):
    def load(ecg_id):
        t = np.arange(500) / 50.0
        return (np.sin(2 * np.pi * t)[None, :] * np.linspace(0.2, 1.5, 12)[:, None] * (1 + ecg_id / 1000)), 50.0
    return load


@pytest.fixture
def fake_views(monkeypatch):
    monkeypatch.setattr(render, "model_view", fake_view)
    monkeypatch.setattr(dashboards, "model_view", fake_view)
    monkeypatch.setattr(render, "record_loader", fake_loader)


def make_run(root: Path, kind: str = "ptbxl", features: dict | None = None) -> Path:
    root = write_fake_run(root, small_protocol(), cohort_kind=kind)
    layout = RunLayout.at(root)
    layout.manifest_dir.mkdir()  # a manifest to find (the waveform loader is replaced)
    pd.DataFrame({"ecg_id": [40000017, 40000018]}).to_parquet(layout.manifest)
    if features is not None:
        raw = yaml.safe_load(layout.run_yaml.read_text())
        raw["features"] = features
        write_text(layout.run_yaml, yaml.safe_dump(raw, sort_keys=False))
    return root


def test_dashboards_folder_and_browsable_section(tmp_path, fake_views):
    root = make_run(tmp_path / "run")
    written = render.write_dashboards(root)
    layout = RunLayout.at(root)
    index = render.read_index(root)
    assert [m["model"] for m in index["models"]] == list(small_protocol().grid.models)
    first = index["models"][0]
    assert [c["concept"] for c in first["concepts"]] == list(CONCEPTS)
    assert [p["kind"] for p in first["concepts"][0]["picks"]] == ["top"] * 3 + ["median"] * 2 + ["zero"] * 2
    records = sorted((layout.dashboards_dir / "records").glob("*.png"))
    assert records and set(written) >= set(records)
    assert len(records) == len(index["records"])  # each record drawn once, shared by the dashboards
    before = {p: p.read_bytes() for p in layout.dashboards_dir.rglob("*") if p.is_file()}
    render.write_dashboards(root)
    assert {p: p.read_bytes() for p in layout.dashboards_dir.rglob("*") if p.is_file()} == before  # byte-identical

    text = render_report(root).read_text()
    assert "id='fd-model'" in text and "id='fd-concept'" in text and "<script>" in text
    lazy = re.findall(r'<img class="[^"]*" loading="lazy" alt="[^"]*" data-src="([^"]+)"', text)
    assert len(lazy) == sum(1 + len(c["picks"]) for m in index["models"] for c in m["concepts"]) + sum(
        min(3, len(m["unexplained"])) for m in index["models"])
    assert all((root / ref).is_file() for ref in lazy)
    assert "base64" not in "".join(re.findall(r"<div class='fd'.*?</div>", text, re.S))  # linked, not inlined
    assert set(report_links(root / "report.html")) == set(lazy)


def test_reused_panel_figure_draws_each_concept_as_if_alone():
    view = fake_view(None, None, "ecg_fm", dashboards.Choice(8, 1.0, None))
    both = render.panel_pngs(view, ["qrs_duration", "qt_interval"])
    assert render.panel_pngs(view, ["qt_interval"]) == both[1:] and both[0] != both[1]


def test_unchanged_images_are_copied_and_changed_ones_redrawn(tmp_path, fake_views, monkeypatch):
    """In this process (parallel=False), so the patched drawing functions see every image drawn."""
    root = make_run(tmp_path / "run")
    render.write_dashboards(root, parallel=False)
    folder = RunLayout.at(root).dashboards_dir
    before = {p: p.read_bytes() for p in folder.rglob("*.png")}
    index = render.read_index(root)
    assert set(index["stamps"]) == {str(p.relative_to(folder)) for p in before}
    drawn: dict[str, list] = {"panel_pngs": [], "record_pngs": []}
    for name in drawn:
        real = getattr(render, name)
        monkeypatch.setattr(render, name, lambda *a, _real=real, _name=name: drawn[_name].extend(a[-1]) or _real(*a))
    render.write_dashboards(root, parallel=False)
    assert drawn == {"panel_pngs": [], "record_pngs": []}  # all copied
    assert {p: p.read_bytes() for p in folder.rglob("*.png")} == before
    index["stamps"]["ecg_fm/qt_interval.png"] = "stale"  # e.g. drawn by an older version
    (folder / "records" / "10.png").write_bytes(b"")
    index["stamps"]["records/10.png"] = "stale"
    write_text(folder / "index.json", json.dumps(index))
    render.write_dashboards(root, parallel=False)
    assert drawn["panel_pngs"] == ["qt_interval"] and [r[0] for r in drawn["record_pngs"]] == [10]
    assert {p: p.read_bytes() for p in folder.rglob("*.png")} == before


def test_disabled_in_config_removes_the_folder(tmp_path, fake_views):
    root = make_run(tmp_path / "run")
    render.write_dashboards(root)
    write_text(root / "run.yaml", (root / "run.yaml").read_text() + "features: {enabled: false}\n")
    assert render.write_dashboards(root) == [] and not RunLayout.at(root).dashboards_dir.exists()
    assert "features.enabled is false" in render_report(root).read_text()


@pytest.mark.parametrize("features", [None, {"enabled": True}])
def test_credentialed_cohort_keeps_record_level_waveforms_out_of_exportable_artifacts(tmp_path, fake_views,
                                                                                      features):
    root = make_run(tmp_path / "run", kind="mimic", features=features)
    layout = RunLayout.at(root)
    stale = layout.dashboards_dir / "records" / "40001234.png"  # e.g. drawn by an older version
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"\x89PNG")
    assert render.write_dashboards(root) == []
    assert not layout.dashboards_dir.exists()
    text = render_report(root).read_text()
    assert "credentialed cohort" in text and "data-src" not in text and "fd-model" not in text

    stale.parent.mkdir(parents=True)  # planted again: the export still leaves it behind
    stale.write_bytes(b"\x89PNG")
    (layout.dashboards_dir / "index.json").write_text("{}")
    result = export_run(root, tmp_path / "out")
    copied = [f["path"] for f in result.files]
    assert not [p for p in copied if p.startswith("figures/dashboards")]
    assert "report.html" in copied and not (tmp_path / "out" / "figures" / "dashboards").exists()


def test_export_copies_what_the_report_links_and_refuses_a_dangling_link(tmp_path, fake_views):
    root = make_run(tmp_path / "run")
    big = pd.DataFrame({"model": ["m"] * 2500, "value": np.arange(2500, dtype=float)})
    write_table(RunLayout.at(root).tables_dir / "calibration_concepts", big)
    render.write_dashboards(root)
    text = render_report(root).read_text()
    assert "First 100 of 2500 rows" in text and 'href="tables/calibration_concepts.csv"' in text
    assert "<td>2499.000</td>" not in text
    links = report_links(root / "report.html")
    assert "tables/calibration_concepts.csv" in links and any(r.startswith("figures/dashboards/") for r in links)
    export_run(root, tmp_path / "out")
    assert all((tmp_path / "out" / ref).is_file() for ref in links)
    shutil.rmtree(RunLayout.at(root).dashboards_dir / "records")
    with pytest.raises(ExportError, match="report.html links .*raybench report"):
        export_run(root, tmp_path / "out2")
    assert not (tmp_path / "out2").exists()


def test_features_command_and_where_it_may_write(tmp_path, fake_views):
    root = make_run(tmp_path / "run")
    out = tmp_path / "dash"
    res = CliRunner().invoke(main, ["features", "--run-dir", str(root), "--model", "ecg_fm", "--concept",
                                    "qt_interval", "--out", str(out), "--format", "svg"])
    assert res.exit_code == 0, res.output
    svg = out / "ecg_fm-qt_interval.svg"
    assert svg.read_text().lstrip().startswith(("<?xml", "<svg")) and "latent 1" in res.output
    res = CliRunner().invoke(main, ["features", "--run-dir", str(root), "--model", "ecg_fm", "--concept", "nope",
                                    "--out", str(out)])
    assert res.exit_code == 2 and "no concept 'nope'" in res.output

    assert out_folder(root, None, credentialed=False) == root / "features"
    with pytest.raises(FeaturesOutError, match="--out"):
        out_folder(root, None, credentialed=True)
    with pytest.raises(FeaturesOutError, match="inside the run folder"):
        out_folder(root, str(root / "figures"), credentialed=True)
    assert out_folder(root, str(tmp_path / "local"), credentialed=True) == (tmp_path / "local").resolve()


CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)),
                None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs it)")
def test_headless_chromium_loads_the_shown_dashboards_images_only(tmp_path, fake_views):
    root = make_run(tmp_path / "run")
    render.write_dashboards(root)
    report = render_report(root)
    url = report.resolve().as_uri() + "#features/ecg_jepa/qt_interval"
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'profile'}", "--allow-file-access-from-files",
                           "--virtual-time-budget=8000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    blocks = re.findall(r'<div class="fd"([^>]*)>(.*?)</div>', dom, re.S)
    shown = [(attrs, body) for attrs, body in blocks if "hidden" not in attrs]
    assert [re.findall(r'data-(?:model|concept)="([^"]+)"', a) for a, _ in shown] == [
        ["ecg_jepa", "qt_interval"], ["ecg_jepa"]]  # the chosen dashboard and the model's unexplained latents
    imgs = [img for _, body in shown for img in re.findall(r"<img[^>]*>", body)]
    assert len(imgs) == 1 + 7 + 1 and all('data-loaded="1"' in img for img in imgs)  # panel, 7 records, 1 latent
    hidden_imgs = [img for attrs, body in blocks if "hidden" in attrs for img in re.findall(r"<img[^>]*>", body)]
    assert hidden_imgs and not any("data-loaded" in img or " src=" in img for img in hidden_imgs)
