"""`raybench grid` end to end on a small real run: every stage, then an idempotent rerun."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from raybench.app.cli import main
from raybench.app.pipeline import run_pipeline
from raybench.core import run_state as rs
from raybench.core.config import dump_run_config
from raybench.core.paths import RunLayout
from tests.small_run import copy_run, small_config

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "explore_run.ipynb"


def _digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def finished_run(finished_small_run):
    return finished_small_run


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
def test_rerun_recomputes_nothing_and_keeps_tables_byte_identical(finished_run, monkeypatch):
    import ray

    import raybench.encoders.base
    import raybench.infra.ray_session

    cfg, _, _ = finished_run
    layout = RunLayout.at(cfg.run_dir)
    before = _digest(layout.tables_dir)
    cells_before = {p.name: p.stat().st_mtime_ns for p in layout.cells_dir.iterdir()}
    lines: list[str] = []
    started: list = []
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: started.append(resources))
    monkeypatch.setattr(ray, "init", lambda *a, **kw: started.append("ray.init"))
    monkeypatch.setattr(raybench.encoders.base, "build_encoder", lambda spec: started.append(spec.name))
    timings = run_pipeline(cfg, echo=lines.append)
    assert all("skipped" in line for line in lines), lines
    assert started == [], "a complete run neither starts Ray nor builds an encoder (fingerprints from the stores)"
    assert timings["total"] < 60
    assert _digest(layout.tables_dir) == before
    assert {p.name: p.stat().st_mtime_ns for p in layout.cells_dir.iterdir()} == cells_before


@pytest.mark.slow
def test_analyze_command_reproduces_what_grid_wrote(finished_run):
    """`raybench analyze --run-dir R` (no --config: R's run.yaml) on the run `grid` finished rewrites every table
    byte for byte, the secondary analyses' included, and the randomness record and figures too."""
    cfg, _, _ = finished_run
    layout = RunLayout.at(cfg.run_dir)
    folders = (layout.tables_dir, layout.randomness_dir, layout.figures_dir)
    before = {f.name: _digest(f) for f in folders}
    assert {"profiles.parquet", "crossed_contrasts.csv", "calibration.parquet", "harmonization_concepts.csv",
            "intervention_contrasts.parquet", "secondary_failures.json", "audit.json"} <= set(before["tables"])
    for f in folders:  # only the train stage's cells table stays: analyze must write everything again
        for path in f.iterdir():
            if path.is_file() and path.name not in ("cells.parquet", "cells.csv"):
                path.unlink()
    result = CliRunner().invoke(main, ["analyze", "--run-dir", cfg.run_dir])
    assert result.exit_code == 0, result.output
    assert "secondary tables: calibration" in result.output
    assert {f.name: _digest(f) for f in folders} == before


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


# ---------------------------------------------------------------- stage commands use the run's own config

def _stamped_run(tmp_path: Path):
    """A run folder whose run.yaml (as `raybench grid` writes it) differs from the embedded demo."""
    from raybench.core.run_state import write_run_yaml

    cfg = small_config(tmp_path / "run")
    cfg = replace(cfg, encoders=replace(cfg.encoders, init_seed=3))
    RunLayout.at(cfg.run_dir).manifest_dir.mkdir(parents=True)
    RunLayout.at(cfg.run_dir).manifest.write_bytes(b"")  # the commands below only check that it exists
    write_run_yaml(cfg)
    return cfg


def _fake_stages(monkeypatch) -> dict:
    """Record what `train` / `encode` would run with instead of running it."""
    import pandas as pd

    import raybench.encoders.extract
    import raybench.infra.ray_session
    import raybench.sae.grid

    seen: dict = {"train": [], "encode": []}
    import raybench.sae.stage

    monkeypatch.setattr(raybench.sae.stage, "check_trainable", lambda cfg: None)  # no manifest or stores here

    def run_grid(cfg, **kw):
        seen["train"].append(cfg)
        return pd.DataFrame({"cell_id": ["c"], "status": ["ok"]})

    def extract_activations(manifest, run_dir, spec, enc_cfg, progress=True, depths=None, **kw):
        seen["encode"].append((spec, enc_cfg, tuple(depths)))
        return {"layers": [], "skipped_layers": [], "records": 0, "quarantined": 0}

    monkeypatch.setattr(raybench.sae.grid, "run_grid", run_grid)
    def extract_models(manifest, run_dir, specs, enc_cfg, progress=True, depths=None, **kw):
        return [{"model": spec.name, **extract_activations(manifest, run_dir, spec, enc_cfg, depths=depths)}
                for spec in specs]

    monkeypatch.setattr(raybench.encoders.extract, "extract_activations", extract_activations)
    monkeypatch.setattr(raybench.encoders.extract, "extract_models", extract_models)
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)
    return seen


def test_stage_commands_use_the_runs_own_config_and_refuse_another(tmp_path, monkeypatch):
    cfg = _stamped_run(tmp_path)
    seen = _fake_stages(monkeypatch)
    runner = CliRunner()
    res = runner.invoke(main, ["train", "--run-dir", cfg.run_dir])
    assert res.exit_code == 0, res.output
    assert seen["train"][-1].config_hash() == cfg.config_hash() and seen["train"][-1].protocol.sae.steps == 40
    res = runner.invoke(main, ["encode", "--run-dir", cfg.run_dir, "--quiet"])
    assert res.exit_code == 0, res.output
    spec, enc_cfg, depths = seen["encode"][-1]
    assert (spec.init_seed, spec.size, depths) == (3, "demo", (0.0, 1.0)) and enc_cfg == cfg.encoders

    other = replace(cfg, protocol=replace(cfg.protocol, sae=replace(cfg.protocol.sae, steps=7)))
    other_path = tmp_path / "other.yaml"
    other_path.write_text(dump_run_config(other))
    n_train, n_encode = len(seen["train"]), len(seen["encode"])
    for args in (["train", "--config", str(other_path)], ["encode", "--config", str(other_path)],
                 ["encode", "--size", "full"], ["analyze", "--config", str(other_path)]):
        res = runner.invoke(main, [*args, "--run-dir", cfg.run_dir])
        assert res.exit_code != 0, (args, res.output)
        assert cfg.config_hash() in res.output and "new --run-dir" in res.output, (args, res.output)
    assert (len(seen["train"]), len(seen["encode"])) == (n_train, n_encode), "nothing ran under another config"
    # the same config given explicitly (speed knobs aside) is fine
    same_path = tmp_path / "same.yaml"
    same_path.write_text(dump_run_config(replace(cfg, resources=replace(cfg.resources, trial_unit="stack"))))
    res = runner.invoke(main, ["train", "--run-dir", cfg.run_dir, "--config", str(same_path)])
    assert res.exit_code == 0, res.output


def test_first_stage_command_records_the_config_for_the_next(tmp_path, monkeypatch):
    """A run folder without run.yaml: `train --config` records it, so a later `train` uses it too."""
    cfg = small_config(tmp_path / "run")
    layout = RunLayout.at(cfg.run_dir)
    layout.manifest_dir.mkdir(parents=True)
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(dump_run_config(cfg))
    seen = _fake_stages(monkeypatch)
    res = CliRunner().invoke(main, ["train", "--run-dir", cfg.run_dir, "--config", str(cfg_path)])
    assert res.exit_code == 0, res.output
    assert layout.run_yaml.exists()
    res = CliRunner().invoke(main, ["train", "--run-dir", cfg.run_dir])
    assert res.exit_code == 0, res.output
    assert [c.config_hash() for c in seen["train"]] == [cfg.config_hash()] * 2


# ---------------------------------------------------------------- nothing to do: no Ray

def test_a_complete_run_does_not_start_ray(tmp_path, monkeypatch):
    """Ray starts before the first stage with work, never for a run whose stages are all complete."""
    import ray

    import raybench.app.pipeline as pl
    import raybench.infra.ray_session
    from raybench.infra.stage import Stage

    started: list = []
    monkeypatch.setattr(ray, "init", lambda *a, **kw: started.append("ray.init"))
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: started.append("init_ray"))
    ran: list[str] = []

    def stage(name: str, complete: bool) -> Stage:
        return Stage(name, (), lambda cfg: complete, lambda cfg, remote: ran.append(name) or "ok")

    cfg = small_config(tmp_path / "run")
    monkeypatch.setattr(pl, "STAGES", [stage("cohort", True), stage("encode", True), stage("train", True)])
    lines: list[str] = []
    run_pipeline(cfg, echo=lines.append)
    assert started == [] and ran == [] and len(lines) == 3, lines
    monkeypatch.setattr(pl, "STAGES", [stage("cohort", False), stage("encode", True), stage("train", False)])
    run_pipeline(cfg, echo=lines.append)
    assert ran == ["cohort", "train"] and started == ["init_ray"], "cohort needs no Ray; train starts it"


def test_until_stops_after_the_named_stage_and_a_rerun_goes_on(tmp_path, monkeypatch):
    import raybench.app.pipeline as pl
    import raybench.infra.ray_session
    from raybench.infra.stage import Stage

    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)
    ran: list[str] = []

    def stage(name: str) -> Stage:
        return Stage(name, (), lambda cfg: name in ran, lambda cfg, remote: ran.append(name) or "ok")

    monkeypatch.setattr(pl, "STAGES", [stage(n) for n in ("cohort", "manifest", "train", "analyze")])
    cfg = small_config(tmp_path / "run")
    lines: list[str] = []
    timings = run_pipeline(cfg, echo=lines.append, until="manifest")
    assert ran == ["cohort", "manifest"] and set(timings) == {"cohort", "manifest", "total"}
    assert any(ln.startswith("[2/2] manifest  done in") for ln in lines), lines
    run_pipeline(cfg, echo=lines.append)
    assert ran == ["cohort", "manifest", "train", "analyze"], "the rest, nothing twice"
    with pytest.raises(rs.PipelineError, match="unknown stage 'report' for until: choose one of cohort, manifest"):
        run_pipeline(cfg, until="report")


def test_grid_until_prints_where_it_stopped(tmp_path):
    cfg = small_config(tmp_path / "run", models=("csfm",))
    cfg = replace(cfg, cohort=replace(cfg.cohort, records=12, patients=6))
    path = tmp_path / "cfg.yaml"
    path.write_text(dump_run_config(cfg))
    res = CliRunner().invoke(main, ["grid", "--config", str(path), "--until", "cohort"])
    assert res.exit_code == 0, res.output
    assert "[1/1] cohort    done in" in res.output
    assert "stopped after cohort (`raybench grid` again goes on)" in res.output
    layout = RunLayout.at(cfg.run_dir)
    assert (layout.cohort_dir / "ptbxl_database.csv").exists() and not layout.manifest.exists()
    bad = CliRunner().invoke(main, ["grid", "--config", str(path), "--until", "report"])
    assert bad.exit_code != 0
    assert "'report' is not one of 'cohort', 'manifest', 'encode', 'train', 'analyze'" in bad.output


# ---------------------------------------------------------------- encode completeness

def test_encode_stage_compares_stores_with_the_current_manifest_and_encoder(tmp_path, finished_small_run):
    """Not the store's own index: a changed manifest (5 records fewer) or encoder makes the stage incomplete,
    and training refuses the stale stores."""
    from raybench.cohorts.manifest import load_manifest, write_manifest
    from raybench.encoders.stage import encode_complete as _encode_complete
    from raybench.encoders.store import StoreError
    from raybench.sae.grid import run_grid

    cfg = copy_run(finished_small_run[0], tmp_path / "run")  # encoded, trained and analyzed
    import raybench.encoders.base

    with pytest.MonkeyPatch.context() as mp:  # the stores' fingerprint key answers: no encoder is built
        mp.setattr(raybench.encoders.base, "build_encoder", lambda spec: pytest.fail("built an encoder"))
        assert _encode_complete(cfg)
    assert not _encode_complete(replace(cfg, encoders=replace(cfg.encoders, init_seed=1))), "another encoder"

    layout = RunLayout.at(cfg.run_dir)
    df, info = load_manifest(layout.manifest)
    new_hash = write_manifest(layout.manifest, df.iloc[5:].reset_index(drop=True), info.root, list(info.concepts),
                              info.concept_source)
    assert new_hash != info.manifest_hash
    assert not _encode_complete(cfg), "stores of the old manifest"
    with pytest.raises(StoreError, match="raybench encode"):
        run_grid(cfg)


# ---------------------------------------------------------------- run.yaml + its stamp: one atomic write

def test_a_kill_between_run_yaml_and_config_hash_json_does_not_block_the_rerun(tmp_path, monkeypatch):
    """Adding a model rewrites run.yaml and its stamp; a kill after run.yaml but before config_hash.json must leave a
    run folder the same command (and every stage command) accepts, with the earlier hash still compatible."""
    import json

    from raybench.core.run_state import compatible_hashes

    cfg = small_config(tmp_path / "run")
    RunLayout.at(cfg.run_dir).root.mkdir(parents=True)
    rs.write_run_yaml(cfg)
    more = replace(cfg, protocol=replace(cfg.protocol, grid=replace(cfg.protocol.grid,
                                                                        models=(*cfg.protocol.grid.models, "st_mem"))))
    real = rs.write_json

    def killed(path, obj):
        if Path(path).name == rs.STAMP:
            raise KeyboardInterrupt("killed between run.yaml and config_hash.json")
        real(path, obj)

    monkeypatch.setattr(rs, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        rs.write_run_yaml(more)
    monkeypatch.setattr(rs, "write_json", real)
    assert json.loads((Path(cfg.run_dir) / rs.STAMP).read_text())["config_hash"] == cfg.config_hash()  # stale copy

    assert rs.recorded_run_config(cfg.run_dir) == (more, more.config_hash())
    assert rs.stage_config(cfg.run_dir, None) == more  # a stage command reads the run's own config
    rs.write_run_yaml(more)  # the rerun of the same `raybench grid --config`
    assert json.loads((Path(cfg.run_dir) / rs.STAMP).read_text())["config_hash"] == more.config_hash()
    assert compatible_hashes(cfg.run_dir, more.config_hash()) == {cfg.config_hash(), more.config_hash()}


def test_a_run_folder_of_an_older_raybench_is_read_from_config_hash_json(tmp_path):
    """Older run folders have run.yaml without the `# stamp:` line, and config_hash.json: both still count."""
    from raybench.core.run_state import STAMP_LINE

    cfg = small_config(tmp_path / "run")
    layout = RunLayout.at(cfg.run_dir)
    layout.root.mkdir(parents=True)
    rs.write_run_yaml(cfg)
    text = layout.run_yaml.read_text()
    layout.run_yaml.write_text("".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(STAMP_LINE)))
    (layout.root / rs.STAMP).write_text('{"config_hash": "0123"}')
    assert rs.recorded_run_config(cfg.run_dir)[1] == "0123"
    with pytest.raises(rs.PipelineError, match="another config"):
        rs.write_run_yaml(cfg)


def test_grid_ends_with_the_weights_the_cohort_and_what_the_run_found(tmp_path, monkeypatch):
    """The terminal's last lines (issue 39): weights and cohort, per metric who leads as far as the contrasts say,
    then the report's path."""
    import raybench.app.pipeline as pl
    from tests.fake_run import small_protocol, write_fake_run

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells", "profiles", "contrasts"))
    monkeypatch.setattr(pl, "run_pipeline", lambda cfg, **kw: {"total": 1.0})  # the stages are not this test's
    res = CliRunner().invoke(main, ["grid", "--run-dir", str(root)])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[-1].startswith("total 1.0 s; report: ")
    assert lines[0].startswith("Encoder weights: random weights (demo encoders)") and lines[1].startswith(
        "Cohort: synthetic")
    assert [ln.split(":")[0] for ln in lines[2:5]] == ["Reconstruction", "Accessibility", "Coverage"]
