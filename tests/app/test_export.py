"""`raybench export` (raybench/app/export.py) on partial or unusual run folders: the cohort kind comes from the
manifest, a credentialed run is never exported unscanned, and credentials in config URIs stay home.

The full MIMIC-shaped export is tests/core/test_privacy.py; these use tests/fake_run.py's tables (no report.html
unless a test writes one), which is enough for the export's decisions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner
from fake_run import small_protocol, write_fake_run

from raybench.app.cli import main
from raybench.app.export import ExportError, export_run
from raybench.core.atomic import write_json, write_table, write_text
from raybench.core.paths import RunLayout

STUDY = 40012345  # a MIMIC-shaped study id


def _run(root: Path, kind: str, *, run_yaml: bool = True, manifest: bool = True) -> RunLayout:
    write_fake_run(root, small_protocol(), cohort_kind=kind, tables=("cells", "profiles"), run_yaml=run_yaml)
    layout = RunLayout.at(root)
    if manifest:
        layout.manifest_dir.mkdir()
        pd.DataFrame({"ecg_id": [STUDY, STUDY + 1], "patient_id": ["10001217", "10001218"]}).to_parquet(
            layout.manifest)
        write_json(layout.manifest_summary, {"cohort": kind, "records": 2})
    return layout


def _plant_id(layout: RunLayout) -> None:
    write_table(layout.tables_dir / "legacy.parquet",
                pd.DataFrame({"cell_id": ["x"], "status": [f"failed: KeyError: '[{STUDY}] not in index'"]}))


def test_credentialed_run_without_loadable_ids_is_refused(tmp_path):
    """A partial copy of an s3:// run (run.yaml, tables, no manifest/) of a MIMIC run: nothing to scan for, so no
    export - before, the scan passed every file."""
    layout = _run(tmp_path / "run", "mimic", manifest=False)
    _plant_id(layout)
    with pytest.raises(ExportError, match=r"credentialed cohort 'mimic'.*no record or subject ids.*manifest/"):
        export_run(layout.root, tmp_path / "out")
    assert not (tmp_path / "out").exists() and [p.name for p in tmp_path.iterdir()] == ["run"]
    res = CliRunner().invoke(main, ["export", "--run-dir", str(layout.root), "--to", str(tmp_path / "out")])
    assert res.exit_code == 2 and "no record or subject ids" in res.output and str(STUDY) not in res.output


def test_cohort_kind_comes_from_the_manifest_when_run_yaml_is_missing(tmp_path):
    layout = _run(tmp_path / "run", "mimic", run_yaml=False)
    dash = layout.dashboards_dir / "index.json"
    dash.parent.mkdir(parents=True)
    dash.write_text("{}")
    clean = export_run(layout.root, tmp_path / "clean")
    assert clean.scanned_ids == 4  # two studies, two subjects
    assert not [f for f in clean.files if f["path"].startswith("figures/dashboards")]  # credentialed: left home
    assert json.loads((tmp_path / "clean" / "EXPORT.json").read_text())["credentialed"] is True

    _plant_id(layout)
    with pytest.raises(ExportError, match=r"credentialed cohort: tables/legacy\.csv, tables/legacy\.parquet"):
        export_run(layout.root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_manifest_wins_over_an_open_kind_in_run_yaml(tmp_path):
    layout = _run(tmp_path / "run", "ptbxl")
    write_json(layout.manifest_summary, {"cohort": "mimic", "records": 2})
    _plant_id(layout)
    with pytest.raises(ExportError, match="tables/legacy"):
        export_run(layout.root, tmp_path / "out")


def test_run_without_any_cohort_kind_is_refused(tmp_path):
    layout = _run(tmp_path / "run", "mimic", run_yaml=False, manifest=False)
    with pytest.raises(ExportError, match="cannot tell whether the cohort is credentialed"):
        export_run(layout.root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_open_run_still_exports_without_a_manifest(tmp_path):
    layout = _run(tmp_path / "run", "ptbxl", manifest=False)
    result = export_run(layout.root, tmp_path / "out")
    assert result.scanned_ids == 0 and "tables/cells.parquet" in {f["path"] for f in result.files}


SECRETS = ("AKIAEXAMPLE", "s3cr3tKEY", "alice", "hunter2pw", "bob", "pw0rd42")


def _with_credentials(layout: RunLayout) -> None:
    raw = yaml.safe_load(layout.run_yaml.read_text())
    raw["run_dir"] = "s3://bucket/runs/demo?access_key=AKIAEXAMPLE&secret_key=s3cr3tKEY"
    raw["tracking"] = {"mlflow": {"uri": "https://alice:hunter2pw@mlflow.example.org/api"}}
    write_text(layout.run_yaml, "# stored at https://bob:pw0rd42@store.example.org/x\n"
               + yaml.safe_dump(raw, sort_keys=False))


def test_exported_run_yaml_has_no_uri_credentials(tmp_path):
    layout = _run(tmp_path / "run", "ptbxl")
    _with_credentials(layout)
    export_run(layout.root, tmp_path / "out")
    text = (tmp_path / "out" / "run.yaml").read_text()
    assert not [s for s in SECRETS if s in text]
    exported = yaml.safe_load(text)
    assert exported["run_dir"] == "s3://bucket/runs/demo"
    assert exported["tracking"]["mlflow"]["uri"] == "https://mlflow.example.org/api"
    assert "# stored at https://store.example.org/x" in text
    assert all(s in layout.run_yaml.read_text() for s in SECRETS)  # the run's own copy keeps them


def test_a_report_rendered_with_uri_credentials_is_refused(tmp_path):
    """A report.html rendered before redaction (or any exported file) that quotes a URI's credentials."""
    layout = _run(tmp_path / "run", "ptbxl")
    _with_credentials(layout)
    write_text(layout.report, "<html><pre>uri: https://alice:hunter2pw@mlflow.example.org/api</pre></html>")
    with pytest.raises(ExportError, match=r"credentials.*: report\.html.*raybench report"):
        export_run(layout.root, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    write_text(layout.report, "<html><pre>uri: https://mlflow.example.org/api</pre></html>")
    export_run(layout.root, tmp_path / "out")


def test_a_comparison_with_another_run_is_exported_and_its_inputs_are_not(tmp_path):
    """`raybench compare` writes RUN_A/compare/<RUN_B>/: its report, tables and figures are aggregate and leave with
    the run; anything else there (a stray record-level file) stays home."""
    layout = _run(tmp_path / "run", "ptbxl", manifest=False)
    out = layout.root / "compare" / "other"
    write_table(out / "tables" / "leaders.parquet", pd.DataFrame({"metric": ["coverage"], "leader_a": ["csfm"]}))
    write_table(out / "tables" / "runs.parquet", pd.DataFrame({"role": ["a", "b"], "cohort_kind": ["ptbxl", "synth"]}))
    write_text(out / "report.html", "<html><body>comparison</body></html>")
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "compare.png").write_bytes(b"\x89PNG")
    (out / "patient_draws.npz").write_bytes(b"draws")
    copied = {f["path"] for f in export_run(layout.root, tmp_path / "out").files}
    assert {"compare/other/report.html", "compare/other/tables/leaders.parquet", "compare/other/tables/leaders.csv",
            "compare/other/figures/compare.png"} <= copied
    assert "compare/other/patient_draws.npz" not in copied
    (out / "tables" / "runs.parquet").unlink()  # then no telling whether run B is credentialed: refused
    with pytest.raises(ExportError, match=r"runs\.parquet is unreadable .*whether compare/other compares a credent"):
        export_run(layout.root, tmp_path / "out2")


def test_a_credentialed_run_without_its_manifest_is_refused_even_with_a_quarantine_list(tmp_path):
    """manifest.parquet missing, quarantine.csv holding one id: that partial id set would pass a table holding any
    other record's id, so the export refuses instead of scanning against it."""
    layout = _run(tmp_path / "run", "mimic", manifest=False)
    layout.manifest_dir.mkdir()
    write_json(layout.manifest_summary, {"cohort": "mimic", "records": 2})
    pd.DataFrame({"ecg_id": [STUDY + 7], "reason": ["flat lead"]}).to_csv(layout.quarantine, index=False)
    _plant_id(layout)  # STUDY: a record of the manifest, not of the quarantine list
    with pytest.raises(ExportError, match=r"credentialed cohort 'mimic'.*manifest\.parquet is missing"):
        export_run(layout.root, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_credentialed_run_whose_manifest_cannot_be_read_is_refused(tmp_path):
    layout = _run(tmp_path / "run", "mimic")
    layout.manifest.write_bytes(b"PAR1 damaged")
    with pytest.raises(ExportError, match=r"manifest\.parquet of the credentialed cohort 'mimic' could not be read"):
        export_run(layout.root, tmp_path / "out")


def _comparison(run_a: RunLayout, run_b: RunLayout | None, kind_b: str, leaders: str) -> Path:
    """A `raybench compare` output in run A against run B (a credentialed one), as the command writes it."""
    folder = run_a.root / "compare" / "other"
    runs = pd.DataFrame({"role": ["a", "b"], "run": ["run", "other"], "cohort_kind": ["ptbxl", kind_b]})
    write_table(folder / "tables" / "runs.parquet", runs)
    (folder / "tables" / "leaders.csv").write_text(leaders)
    if run_b is not None:
        write_json(folder / "sources.json", {"a": str(run_a.root.resolve()), "b": str(run_b.root.resolve())})
    return folder


def test_the_comparison_of_an_open_run_with_a_credentialed_one_is_scanned_for_the_credentialed_ids(tmp_path):
    run_a, run_b = _run(tmp_path / "run", "ptbxl"), _run(tmp_path / "other", "mimic")
    _comparison(run_a, run_b, "mimic", f"metric,leader_a,note\ncoverage,csfm,record {STUDY}\n")
    with pytest.raises(ExportError, match=r"ids of a credentialed cohort: compare/other/tables/leaders\.csv"):
        export_run(run_a.root, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    (run_a.root / "compare" / "other" / "tables" / "leaders.csv").write_text("metric,leader_a\ncoverage,csfm\n")
    clean = export_run(run_a.root, tmp_path / "clean")
    assert clean.scanned_ids == 4 and "compare/other/tables/leaders.csv" in {f["path"] for f in clean.files}
    assert not (tmp_path / "clean" / "compare" / "other" / "sources.json").exists(), "local paths stay home"


def test_the_comparison_with_a_credentialed_run_that_cannot_be_found_is_refused(tmp_path):
    run_a = _run(tmp_path / "run", "ptbxl")
    _comparison(run_a, None, "mimic", "metric,leader_a\ncoverage,csfm\n")
    with pytest.raises(ExportError, match=r"compare/other compares a run of the credentialed cohort 'mimic'"):
        export_run(run_a.root, tmp_path / "out")
    run_b = _run(tmp_path / "other", "mimic", manifest=False)  # found, but without its manifest: no ids
    _comparison(run_a, run_b, "mimic", "metric,leader_a\ncoverage,csfm\n")
    with pytest.raises(ExportError, match=r"credentialed cohort 'mimic'.*manifest\.parquet is missing"):
        export_run(run_a.root, tmp_path / "out")


def test_compared_runs_of_one_name_are_told_apart_without_their_paths(tmp_path):
    from raybench.analysis.compare.cli import run_names

    a, b = tmp_path / "site1" / "ptbxl", tmp_path / "site2" / "ptbxl"
    names = run_names(a, b)
    assert names == ("ptbxl (A)", "ptbxl (B)") and not any(str(tmp_path) in n or "/" in n for n in names)
    assert run_names(tmp_path / "ptbxl", tmp_path / "mimic") == ("ptbxl", "mimic")


def test_a_wfdb_run_is_credentialed_unless_run_yaml_and_manifest_both_say_open(tmp_path):
    """`cohort.kind: wfdb` exports like MIMIC (id scan, no dashboards) unless run.yaml says `credentialed: false` and
    the manifest's summary does not say otherwise."""
    def wfdb_run(name: str, yaml_open: bool, summary_open: bool | None) -> RunLayout:
        layout = _run(tmp_path / name, "wfdb")
        raw = yaml.safe_load(layout.run_yaml.read_text())
        section = raw["config"]["cohort"] if "config" in raw else raw["cohort"]
        section.update({"root": str(tmp_path), "credentialed": not yaml_open})
        write_text(layout.run_yaml, yaml.safe_dump(raw))
        flag = {} if summary_open is None else {"credentialed": not summary_open}
        summary = {"cohort": "wfdb", "records": 2, **flag}
        write_json(layout.manifest_summary, summary)
        _plant_id(layout)
        return layout

    for name, yaml_open, summary_open in (("default", False, None), ("summary_says_closed", True, False)):
        with pytest.raises(ExportError, match="tables/legacy"):
            export_run(wfdb_run(name, yaml_open, summary_open).root, tmp_path / f"out_{name}")
    result = export_run(wfdb_run("open", True, True).root, tmp_path / "out_open")
    assert json.loads((tmp_path / "out_open" / "EXPORT.json").read_text())["credentialed"] is False
    assert any(f["path"] == "tables/legacy.parquet" for f in result.files)
