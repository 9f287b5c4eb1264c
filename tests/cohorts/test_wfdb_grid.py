"""`raybench grid` with `cohort.kind: wfdb`, end to end (issue 41 item 4): (a) the shared PTB-XL sample as a
Challenge-style folder with no PTB-XL csv and a patients CSV, (b) `raybench cohort synth --layout challenge`
(.mat + .hea with #Dx, patients in #Patient). Each runs every stage of the demo preset on the smallest grid that
keeps every stage real (one model x 2 depths x 2 E x 2 seeds: 8 cells, one Tune trial; the demo's 540-cell shape,
several models and the sensitivity arm are what the demo and grid tests are about, e.g. the session's
finished_small_run, two models and the sensitivity arm through every stage; the cohort kind is what these are) on
the smallest cohort and training that keep every stage real: SAE steps, bootstrap draws and the selection subset
cut down as tests/small_run.py does, the provenance audit on (small enough that its rows say "too small to audit"
with the groups the headers named), the secondary analyses and feature dashboards off."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from raybench.app.pipeline import run_pipeline
from raybench.core.config import CohortConfig, FeaturesConfig, ProvenanceConfig, SecondaryConfig, demo_run
from raybench.core.paths import RunLayout
from tests.cohorts.wfdb_folders import ptbxl_challenge_folder
from tests.small_run import small_config


def _tiny_demo(run_dir: Path, cohort: CohortConfig):
    """The demo preset with an 8-cell grid (tests/small_run.py's, one model, no sensitivity arm) and the
    training and inference of a test."""
    cfg = demo_run(str(run_dir))
    p = cfg.protocol
    grid = replace(small_config(run_dir).protocol.grid, models=("ecg_fm",), sensitivity_depth=None)
    p = replace(p, sae=replace(p.sae, steps=10, batch_size=32), grid=grid,
                eval=replace(p.eval, selection_records=32, repro_permutations=10),
                inference=replace(p.inference, patient_draws=50, crossed_draws=100, chunk_draws=50))
    provenance = ProvenanceConfig(enabled=True, folds=1, min_group_records=2, random_controls=4, draws=20,
                                  cell_support_sensitivity=True, c_grid=(1.0,), association_levels=(1.0, -1.0),
                                  ranks=(1,))
    return replace(cfg, protocol=p, cohort=cohort, provenance=provenance, features=FeaturesConfig(enabled=False),
                   secondary=replace(SecondaryConfig.demo(), analyses=()),  # not what these tests are about
                   encoders=replace(cfg.encoders, min_actors=1, max_actors=1, batch_size=32)).validate()


def _check_run(cfg, lines: list[str], n_concepts: int) -> dict:
    """8/8 cells ok, the release audit PASS, the manifest's concepts, provenance rows for site and device."""
    layout = RunLayout.at(cfg.run_dir)
    assert any("8/8 cells" in ln and "PASS" in ln for ln in lines), lines
    cells = pd.read_parquet(layout.tables_dir / "cells.parquet")
    assert len(cells) == 8 and (cells["status"] == "ok").all()
    assert json.loads((layout.tables_dir / "audit.json").read_text())["passed"] is True
    summary = json.loads(layout.manifest_summary.read_text())
    assert summary["cohort"] == "wfdb" and summary["concept_source"] == "waveform49"
    assert len(summary["concepts"]) == n_concepts
    verdicts = pd.read_parquet(layout.tables_dir / "provenance_verdicts.parquet")
    variables = ["device", "device|site", "site"]  # the default variables: device within site too (§12)
    assert sorted(set(verdicts["variable"])) == variables and len(verdicts) == 3 * 2  # 1 model x 2 depths
    assert (verdicts["verdict"] != "failed").all(), verdicts["reason"].tolist()[:3]
    return summary


@pytest.mark.slow
def test_grid_on_the_ptbxl_sample_as_a_challenge_folder(ptbxl_sample, tmp_path, ray_cluster):
    folder = ptbxl_challenge_folder(ptbxl_sample, tmp_path / "cohort")
    assert not (folder / "ptbxl_database.csv").exists()
    cohort = CohortConfig(kind="wfdb", root=str(folder), patients_csv="patients.csv", concepts="auto",
                          credentialed=False)
    cfg = _tiny_demo(tmp_path / "run", cohort)
    lines: list[str] = []
    run_pipeline(cfg, echo=lines.append)
    summary = _check_run(cfg, lines, 49)
    assert summary["records"] == 100 and summary["patient_source"] == "csv patients.csv"
    df = pd.read_parquet(RunLayout.at(cfg.run_dir).manifest)
    csv = pd.read_csv(folder / "patients.csv", dtype=str, keep_default_na=False).set_index("record")
    by_name = df.assign(record=df["path"].str.rsplit("/", n=1).str[-1]).set_index("record")
    assert (by_name["device"] == csv.loc[by_name.index, "device"]).all()  # the CSV's site and device, per record
    assert (by_name["site"] == csv.loc[by_name.index, "site"]).all()
    assert {"NORM", "MI", "STTC"} <= set(";".join(df["diagnostic_superclasses"]).split(";"))  # from #Dx


@pytest.mark.slow
def test_grid_on_a_challenge_layout_synthetic_cohort(tmp_path, ray_cluster):
    from raybench.app.cli import main

    res = CliRunner().invoke(main, ["cohort", "synth", "--layout", "challenge", "--out", str(tmp_path / "cohort"),
                                    "--records", "48", "--patients", "24", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert list((tmp_path / "cohort").rglob("*.mat")) and not list((tmp_path / "cohort").rglob("*.dat"))
    cohort = CohortConfig(kind="wfdb", root=str(tmp_path / "cohort"), patient_key="Patient", concepts="auto")
    cfg = _tiny_demo(tmp_path / "run", cohort)
    lines: list[str] = []
    run_pipeline(cfg, echo=lines.append)
    summary = _check_run(cfg, lines, 49)
    assert summary["records"] == 48 and summary["credentialed"] is True


def test_the_readme_wfdb_commands_build_a_49_concept_manifest(tmp_path, monkeypatch, ray_cluster):
    """README's three `kind: wfdb` lines as written (fewer records; the grid stopped after the manifest)."""
    import shlex
    import subprocess

    from raybench.app.cli import main

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme[readme.index("raybench cohort synth --layout challenge"):]
    lines = [ln.strip() for ln in block[:block.index("```")].splitlines() if ln.strip()]
    assert len(lines) == 3 and lines[1].startswith("printf ") and lines[2].startswith("raybench grid ")
    monkeypatch.chdir(tmp_path)
    synth = shlex.split(lines[0].replace("--records 300 --patients 100", "--records 24 --patients 12"))
    assert CliRunner().invoke(main, synth[1:]).exit_code == 0
    subprocess.run(["bash", "-c", lines[1]], check=True)
    res = CliRunner().invoke(main, [*shlex.split(lines[2])[1:], "--until", "manifest"])
    assert res.exit_code == 0, res.output
    summary = json.loads((tmp_path / "runs" / "wfdb" / "manifest" / "summary.json").read_text())
    assert summary["records"] == 24 and summary["concept_source"] == "waveform49" and len(summary["concepts"]) == 49
    assert summary["patient_source"] == "header key #Patient" and summary["credentialed"] is True
