"""report.html: one self-contained file, every section and figure, data-driven optional sections, CLI."""

from __future__ import annotations

import dataclasses
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from fake_run import small_protocol, write_fake_run

from raybench.analysis.atlas.figures import FIGURES, make_figures
from raybench.analysis.completeness import cell_label
from raybench.analysis.registry import ANALYSES
from raybench.analysis.stage import render_report
from raybench.app.cli import main
from raybench.core.atomic import write_table
from raybench.core.paths import RunLayout

CORE = ["summary", "audit", "profiles", "contrasts", "curves", "depth", "concepts", "stability", "reproducibility",
        "atlas", "protocol", "provenance"]
OPTIONAL = ["calibration", "harmonization", "intervention"]


class Refs(HTMLParser):
    """Collects every src/href and the ids, images and tags of a document."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.ids: set[str] = set()
        self.imgs: list[str] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        for k, v in attrs:
            if k in ("src", "href", "srcset", "action", "data", "poster"):
                self.refs.append((tag, k, v or ""))
            if k == "id":
                self.ids.add(v)
            if tag == "img" and k == "alt":
                self.imgs.append(v)


def parse(path: Path) -> Refs:
    p = Refs()
    p.feed(path.read_text())
    return p


@pytest.fixture(scope="module")
def with_figures(tmp_path_factory) -> Path:
    """A small PTB-XL-like run with figures drawn once; tests copy it."""
    root = write_fake_run(tmp_path_factory.mktemp("base") / "run", small_protocol(), cohort_kind="ptbxl",
                          secondary=True)
    make_figures(root)
    return root


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_one_self_contained_file_with_every_section(with_figures, tmp_path):
    root = copy_run(with_figures, tmp_path / "run")
    out = render_report(root)
    assert out == root / "report.html" and out.exists()
    assert [p.name for p in root.iterdir() if p.name.startswith(".report")] == []  # atomic, no temp left
    doc = parse(out)
    for tag, attr, value in doc.refs:
        ok = value.startswith("#") or (tag == "img" and attr == "src" and value.startswith("data:image/png;base64,"))
        assert ok, f"external reference {tag} {attr}={value[:60]}"
    assert not {"link", "script", "iframe", "object"} & doc.tags
    assert set(CORE + OPTIONAL) <= doc.ids
    nav = [v[1:] for tag, attr, v in doc.refs if tag == "a"]
    assert set(CORE + OPTIONAL) <= set(nav)
    assert sorted(doc.imgs) == sorted(spec.stem for spec in FIGURES)
    text = out.read_text()
    assert "published (paper)" in text and "0.351" in text  # ECG-JEPA published accessibility AUC
    assert "Release audit: 54/54 cells, 18/18 blocks; sensitivity arm 18/18 cells, 6/6 blocks: PASS" in text
    assert "manifest_hash" in text and "0f1e2d3c4b5a6978" in text and "ray (recorded in run.yaml)" in text
    assert "Calibration ladder" in text and "sae_top4" in text


def test_rerender_is_byte_identical(with_figures, tmp_path):
    """Same run, another place or another time: the same bytes (no timestamps, no absolute paths)."""
    a = render_report(copy_run(with_figures, tmp_path / "a" / "run")).read_bytes()
    b = render_report(copy_run(with_figures, tmp_path / "b" / "run")).read_bytes()
    assert a == b
    assert render_report(tmp_path / "a" / "run").read_bytes() == a


def test_optional_sections_are_data_driven(tmp_path):
    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("profiles", "cells"))
    doc = parse(render_report(root))
    assert not set(OPTIONAL) & doc.ids and "other" not in doc.ids
    assert "published (paper)" not in (root / "report.html").read_text()  # synth cohort: no paper column
    # another stage adds a calibration table and figure later, plus one artifact no section claims
    layout = RunLayout.at(root)
    write_table(layout.tables_dir / "calibration_ladder.parquet", pd.DataFrame({"model": ["ecg_fm"], "ridge": [0.6]}))
    write_table(layout.tables_dir / "mystery.parquet", pd.DataFrame({"x": [1]}))
    layout.figures_dir.mkdir(parents=True, exist_ok=True)
    png = with_png(layout.figures_dir)
    shutil.copy(png, layout.figures_dir / "calibration_ladder.png")
    doc = parse(render_report(root))
    assert "calibration" in doc.ids and "other" in doc.ids
    assert "fig-calibration_ladder" in doc.ids and "harmonization" not in doc.ids
    text = (root / "report.html").read_text()
    assert text.index("Table calibration_ladder") < text.index('id="protocol"')
    assert text.index("Table mystery") > text.index('id="other"')


def with_png(folder: Path) -> Path:
    from matplotlib.figure import Figure

    from raybench.analysis.report.plotting import save_figure

    fig = Figure(figsize=(2, 2))
    fig.subplots().plot([0, 1], [1, 0])
    return save_figure(fig, folder, "tmp_plot")[0].rename(folder / "tmp.png")


def test_audit_gaps_and_missing_run_yaml(tmp_path):
    p = small_protocol()
    gone = ("st_mem", 1.0, 16, 4312, "primary")
    root = write_fake_run(tmp_path / "run", p, drop=[gone], fail={("ecg_fm", 0.0, 1, 4311, "primary"): "NaN loss"},
                          tables=("cells", "missing"))
    text = render_report(root).read_text()
    assert cell_label(*gone) in text and "NaN loss" in text and "INCOMPLETE" in text
    assert "q1.00/E16/s4312" in text
    assert 'id="other"' not in text and text.index("Table missing (2 rows)") < text.index('id="profiles"')
    bare = write_fake_run(tmp_path / "bare", p, tables=("profiles",), run_yaml=False)
    text = render_report(bare).read_text()
    assert "Release audit: not run" in text and "resolved protocol was not recorded" in text


def test_registered_sections_have_unique_ids():
    ids = [s.id for a in ANALYSES for s in a.sections]
    assert len(ids) == len(set(ids)) and set(CORE + OPTIONAL) <= set(ids)


def test_report_command(tmp_path):
    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells", "profiles"))
    res = CliRunner().invoke(main, ["report", "--run-dir", str(root), "--strict"])
    assert res.exit_code == 0, res.output
    assert "release audit: 54/54 cells, 18/18 blocks" in res.output
    assert (root / "figures" / "forest_auc.svg").exists() and (root / "report.html").exists()
    missing = write_fake_run(tmp_path / "gap", small_protocol(), drop=[("ecg_fm", 0.5, 4, 4311, "primary")],
                             tables=("cells", "profiles"))
    res = CliRunner().invoke(main, ["report", "--run-dir", str(missing), "--strict"])
    assert res.exit_code == 1 and "release audit incomplete" in res.output
    res = CliRunner().invoke(main, ["report", "--run-dir", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "is not a folder" in res.output


def _fake_analysis(monkeypatch, analyze_run) -> None:
    """The analyze stage with `analyze_run` standing in for the tables and no secondary analyses."""
    import raybench.analysis.atlas.run as atlas_run
    import raybench.analysis.secondary.run as secondary_run

    monkeypatch.setattr(atlas_run, "analyze_run", analyze_run)
    monkeypatch.setattr(secondary_run, "run_secondary", lambda root, protocol, cfg: {})


def test_analyze_command_runs_every_stage(tmp_path, monkeypatch):
    """analyze: config from run.yaml -> init_ray -> analyze_run -> figures, audit, report."""
    root = write_fake_run(tmp_path / "run", small_protocol(), cohort_kind="ptbxl", tables=("cells",))
    calls = {}

    def analyze_run(run_root, protocol, num_workers=None, cohort_kind="synth", allow_incomplete=False):
        calls["analyze"] = (Path(run_root), protocol.grid.models, num_workers, cohort_kind)
        write_fake_run(run_root, small_protocol(), cohort_kind="ptbxl", tables=("cells", "profiles"), run_yaml=False)
        return {"cells": None, "profiles": None}

    _fake_analysis(monkeypatch, analyze_run)
    import raybench.infra.ray_session

    monkeypatch.setattr(raybench.infra.ray_session, "init_ray",
                        lambda resources=None: calls.setdefault("ray", resources))
    res = CliRunner().invoke(main, ["analyze", "--run-dir", str(root), "--num-workers", "3", "--strict"])
    assert res.exit_code == 0, res.output
    assert calls["analyze"] == (root, small_protocol().grid.models, 3, "ptbxl") and "ray" in calls
    assert "tables: cells, profiles" in res.output and "PASS" in res.output
    assert (root / "figures" / "forest_auc.png").exists() and (root / "report.html").exists()
    res = CliRunner().invoke(main, ["analyze", "--run-dir", str(tmp_path)])
    assert res.exit_code == 2 and "pass --config" in res.output


def test_analyze_with_explicit_config(tmp_path, monkeypatch):
    """--config wins over run.yaml; the run folder comes from --run-dir."""
    from raybench.core.config import demo_run, dump_run_config

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",), run_yaml=False)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_run_config(dataclasses.replace(demo_run("elsewhere"), protocol=small_protocol())))
    seen = {}

    def analyze_run(run_root, protocol, num_workers=None, cohort_kind="synth", allow_incomplete=False):
        seen["models"] = protocol.grid.models
        write_fake_run(run_root, protocol, tables=("cells",), run_yaml=False)
        return {"cells": None}

    _fake_analysis(monkeypatch, analyze_run)
    import raybench.infra.ray_session

    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)
    res = CliRunner().invoke(main, ["analyze", "--run-dir", str(root), "--config", str(cfg_path)])
    assert res.exit_code == 0, res.output
    assert seen["models"] == small_protocol().grid.models
    assert "release audit: 54/54 cells, 18/18 blocks" in res.output


def test_audit_json_values_are_escaped(tmp_path):
    """audit.json is a file in the run folder: whatever it holds must not become markup in report.html."""
    import json

    from raybench.analysis.release_audit.run import release_audit

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))
    release_audit(root, small_protocol())
    path = RunLayout.at(root).tables_dir / "audit.json"
    audit = json.loads(path.read_text())
    evil = "<script>alert(1)</script>"
    for key in ("ok_cells", "expected_cells", "complete_blocks", "expected_blocks"):
        audit["primary"][key] = f"{key}{evil}"
    audit["summary"] = evil
    audit["problems"] = [evil]
    path.write_text(json.dumps(audit))
    text = render_report(root).read_text()
    assert "<script" not in text
    assert "script" not in parse(root / "report.html").tags
    for key in ("ok_cells", "expected_cells", "complete_blocks", "expected_blocks"):
        assert f"{key}&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_credentials_in_config_uris_do_not_reach_the_report(tmp_path):
    """run.yaml keeps the URIs a rerun needs; report.html shows them without userinfo, query or fragment."""
    import yaml

    from raybench.core.atomic import write_text

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))
    path = RunLayout.at(root).run_yaml
    raw = yaml.safe_load(path.read_text())
    raw["run_dir"] = "s3://bucket/runs/demo?access_key=AKIAEXAMPLE&secret_key=s3cr3tKEY"
    raw["tracking"] = {"mlflow": {"uri": "https://alice:hunter2pw@mlflow.example.org:5000/api#frag"}}
    raw["versions"]["source"] = "git+https://ghp_tokenXYZ@git.example.org/raybench.git?ref=main"
    write_text(path, "# stored at https://bob:pw0rd42@store.example.org/x\n" + yaml.safe_dump(raw, sort_keys=False))
    text = render_report(root).read_text()
    for secret in ("AKIAEXAMPLE", "s3cr3tKEY", "alice", "hunter2pw", "frag", "ghp_tokenXYZ", "ref=main", "bob",
                   "pw0rd42"):
        assert secret not in text, secret
    for kept in ("s3://bucket/runs/demo", "https://mlflow.example.org:5000/api",
                 "git+https://git.example.org/raybench.git", "https://store.example.org/x"):
        assert kept in text, kept
