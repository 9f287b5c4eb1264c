"""The provenance audit on run folders: a planted synthetic cohort through a demo encoder, and the real PTB-XL
sample (one device and one site: too small to audit, and said so). Ray tasks run on the session fixture."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import pytest
from provenance_fixtures import encode_in_process

from raybench.core.config import ProvenanceConfig, RunConfig, demo_protocol
from raybench.core.paths import RunLayout

MODEL = "ecg_fm"  # its native preprocessing standardizes each lead but keeps the 50 Hz hum


def _config(root, **provenance) -> RunConfig:
    p = demo_protocol()
    p = replace(p, grid=replace(p.grid, models=(MODEL,), depths=(0.0,), sensitivity_depth=None))
    provenance = {"min_cell_records": 5, "folds": 1, **provenance}  # a small cohort: the run's split, small cells
    pcfg = ProvenanceConfig(enabled=True, min_group_records=8, random_controls=20, draws=100, **provenance)
    return RunConfig(run_dir=str(root), protocol=p, provenance=pcfg).validate()


@pytest.mark.slow
def test_planted_cohort_through_the_encoder_is_recovered_and_relied_on(tmp_path, ray_cluster):
    from raybench.analysis.provenance_audit.run import run_provenance
    from raybench.analysis.stage import render_report
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.cohorts.synth_provenance import ProvenancePlant

    layout = RunLayout.at(tmp_path / "run")
    plant = ProvenancePlant(artifact="hum", amplitude_mv=0.3, device="CS-12   E", association=0.6)
    generate_synth_cohort(layout.cohort_dir, 400, 200, 3, plant=plant)
    build_synth_manifest(layout.cohort_dir, layout.manifest_dir, concepts="none")
    encode_in_process(layout.root, MODEL, [0])
    cfg = _config(layout.root, variables=("device",))
    tables = run_provenance(layout.root, cfg)

    rec = tables["provenance_recover"].iloc[0]
    assert rec.lpi_bits > 0.5 and rec.ci_low > 0.3  # Recover high: the encoder passes the hum through
    ver = tables["provenance_verdicts"].iloc[0]
    assert ver.g_ci_low > cfg.provenance.epsilon, ver.reason  # G clearly > 0
    assert ver.verdict.startswith("reliance"), ver.reason
    for name in ("provenance_recover", "provenance_stress", "provenance_controls", "provenance_verdicts",
                 "provenance_gates", "provenance_features"):
        assert (layout.tables_dir / f"{name}.parquet").exists()
    from raybench.analysis.api import RenderInputs
    from raybench.analysis.provenance_audit.analysis import draw

    draw(RenderInputs(layout.root, cfg.protocol))  # the analyze stage's render step: figures from the tables
    for stem in ("provenance_lpi", "provenance_curves", "provenance_removal"):
        assert (layout.figures_dir / f"{stem}.png").exists()
    html = render_report(layout.root).read_text()
    section = html[html.index('<section id="provenance_audit">'):]
    assert section.index("Verdicts (") < section.index("Validity and verification gates") \
        < section.index("Recover: LPI")  # leads with the verdict table, then the gates
    assert ver.verdict in section
    gates = tables["provenance_gates"]
    assert len(gates) == 6 and gates.gate.is_unique
    # the synthetic cohort's ptbxl_database.csv carries age, sex and recording date: the comparator is evaluated
    assert gates.set_index("gate").loc["embedding probe above metadata", "passed"] in (True, False)


def test_ptbxl_sample_runs_and_says_the_groups_are_too_small(ptbxl_sample, tmp_path, ray_cluster):
    from raybench.analysis.provenance_audit.run import run_provenance
    from raybench.cohorts.ptbxl import build_ptbxl_manifest

    layout = RunLayout.at(tmp_path / "run")
    build_ptbxl_manifest(ptbxl_sample, layout.manifest_dir, sampling_rate=100, concepts="none")
    encode_in_process(layout.root, MODEL, [0])
    tables = run_provenance(layout.root, _config(layout.root))
    ver = tables["provenance_verdicts"]
    assert sorted(ver.variable) == ["device", "device|site", "site"]
    assert (ver.verdict == "not audited").all()
    assert ver.reason.str.contains("too small to audit").all()
    assert tables["provenance_recover"].empty  # nothing estimated on a single group
    assert pd.read_parquet(layout.tables_dir / "provenance_verdicts.parquet").equals(ver)


def test_provenance_command_on_the_ptbxl_sample(ptbxl_sample, tmp_path, ray_cluster, monkeypatch):
    from dataclasses import replace

    from click.testing import CliRunner

    from raybench.analysis import registry
    from raybench.app.cli import main
    from raybench.cohorts.ptbxl import build_ptbxl_manifest
    from raybench.core.run_state import write_run_yaml

    layout = RunLayout.at(tmp_path / "run")
    build_ptbxl_manifest(ptbxl_sample, layout.manifest_dir, sampling_rate=100, concepts="none")
    encode_in_process(layout.root, MODEL, [0])
    write_run_yaml(_config(layout.root))
    drawn: list[str] = []  # whose figures the command draws: only its own (the other tables did not change)

    def recorded(analysis):
        def render(inp):
            drawn.append(analysis.name)
            return analysis.render(inp)
        return replace(analysis, render=render) if analysis.render is not None else analysis

    monkeypatch.setattr(registry, "ANALYSES", [recorded(a) for a in registry.ANALYSES])
    result = CliRunner().invoke(main, ["provenance", "--run-dir", str(layout.root), "--target", "MI"])
    assert result.exit_code == 0, result.output
    assert "3 model x depth x variable rows" in result.output and "not audited: 3" in result.output
    html = layout.report.read_text()
    assert "Provenance audit" in html and "too small to audit" in html
    assert drawn == ["provenance_audit"], drawn
