"""`raybench compare` end to end on two small finished runs (two synthetic cohorts with different seeds and a
planted accessibility leader that changes), and its refusals."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from test_tables import write_planted_run

from raybench.analysis.atlas.run import analyze_run
from raybench.app.cli import main
from raybench.core.atomic import write_table
from raybench.core.config import (
    CohortConfig,
    EncoderConfig,
    EvalProtocol,
    GridProtocol,
    InferenceProtocol,
    Protocol,
    RunConfig,
)
from raybench.core.run_state import write_run_yaml

MODELS = ("csfm", "ecg_jepa", "st_mem")
CONCEPT_WEIGHT = np.array([1.0, 0.6, 0.4, 0.25, 0.15])  # concepts of falling strength: coverage separates models
SKILL_A = {"ecg_jepa": 0.9, "st_mem": 0.45, "csfm": 0.35}  # accessibility: ecg_jepa leads in A ...
SKILL_B = {"ecg_jepa": 0.45, "st_mem": 0.9, "csfm": 0.35}  # ... st_mem in B
P, M_TOP = 60, 8  # test_tables.py's (its ERR plants ecg_jepa best in reconstruction in both runs)


def compare_protocol(models: tuple[str, ...] = MODELS) -> Protocol:
    return Protocol(
        name="compare-test",
        grid=GridProtocol(models=models, depths=(0.5, 1.0), expansions=(1, 4), seeds=(1, 2), sensitivity_depth=0.5),
        eval=EvalProtocol(repro_top=M_TOP, repro_permutations=20),
        inference=InferenceProtocol(patient_draws=200, crossed_draws=400, chunk_draws=64, seed=3, stream="chunked"),
    )


def stamp(root: Path, protocol: Protocol, seed: int) -> None:
    """run.yaml of a synthetic-cohort run with this protocol (what `raybench grid` records)."""
    write_run_yaml(RunConfig(run_dir=str(root), protocol=protocol,
                             cohort=CohortConfig(kind="synth", records=2 * P, patients=P, seed=seed),
                             encoders=EncoderConfig(size="demo", batch_size=32, num_gpus=0.0)).validate())


def write_cohort_run(root: Path, seed: int, skill: dict[str, float], protocol: Protocol) -> Path:
    """A finished-looking run of one cohort (tests/analysis/atlas/test_tables.py's planted run, concepts of falling
    strength, a signal flat in E) and its run.yaml."""
    write_planted_run(root, protocol, seed=seed, skill=skill, weight=CONCEPT_WEIGHT, grows_with_e=False)
    stamp(root, protocol, seed)
    return root


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, ray_cluster):
    base = tmp_path_factory.mktemp("cohorts")
    runs = []
    for name, seed, skill in (("ptbxl_like", 11, SKILL_A), ("mimic_like", 12, SKILL_B)):
        root = write_cohort_run(base / name, seed, skill, compare_protocol())
        analyze_run(root, compare_protocol(), num_workers=1, cohort_kind="synth")
        runs.append(root)
    return runs


def _invoke(*args: str):
    return CliRunner().invoke(main, ["compare", *args], catch_exceptions=False)


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_compare_writes_tables_figure_and_report(two_runs, tmp_path):
    a, b = two_runs
    res = _invoke(str(a), str(b), "--draws", "100")
    assert res.exit_code == 0, res.output
    out = a / "compare" / "mimic_like"
    assert "accessibility: leader ecg_jepa in ptbxl_like, st_mem in mimic_like: not preserved" in res.output
    for name in ("runs", "protocol", "leaders", "rank_agreement", "auc_differences"):
        assert (out / "tables" / f"{name}.parquet").exists() and (out / "tables" / f"{name}.csv").exists()
    assert (out / "figures" / "compare.png").stat().st_size > 0 and (out / "figures" / "compare.svg").exists()
    report = (out / "report.html").read_text()
    assert "data:image/png;base64," in report and "Metric-specific leader preserved in" in report

    lead = pd.read_parquet(out / "tables" / "leaders.parquet").set_index("metric")
    assert (lead.loc["reconstruction", "leader_a"], lead.loc["reconstruction", "leader_b"]) == ("ecg_jepa", "ecg_jepa")
    assert bool(lead.loc["reconstruction", "leader_preserved"]) and lead.loc["reconstruction", "preserved_prob"] > .9
    assert (lead.loc["accessibility", "leader_a"], lead.loc["accessibility", "leader_b"]) == ("ecg_jepa", "st_mem")
    assert not bool(lead.loc["accessibility", "leader_preserved"]) and lead.loc["accessibility", "preserved_prob"] < .1

    # point values are the runs' own profiles; intervals contain them
    diff = pd.read_parquet(out / "tables" / "auc_differences.parquet")
    for root, suffix in ((a, "a"), (b, "b")):
        prof = pd.read_parquet(root / "tables" / "profiles.parquet").set_index(["metric", "model"]).auc
        got = diff.set_index(["metric", "model"])[f"auc_{suffix}"]
        assert np.allclose(got.to_numpy(), prof.loc[got.index].to_numpy(), rtol=1e-9)
    acc = diff[diff.metric == "accessibility"].set_index("model")
    assert acc.loc["st_mem", "ci_low"] > 0 > acc.loc["ecg_jepa", "ci_high"]  # planted: st_mem up, ecg_jepa down
    assert len(diff) == 3 * len(MODELS) and diff.p_bh.between(0, 1).all()
    agree = pd.read_parquet(out / "tables" / "rank_agreement.parquet").set_index("metric")
    assert agree.loc["reconstruction", "kendall_tau"] == pytest.approx(1.0)
    assert (agree.kendall_ci_low <= agree.kendall_ci_high).all()
    assert pd.read_parquet(out / "tables" / "runs.parquet").draws.tolist() == [100, 100]

    # a second run into another folder: the same bytes (draws, tables, figure, report)
    again = tmp_path / "again"
    assert _invoke(str(a), str(b), "--draws", "100", "--out", str(again)).exit_code == 0
    assert _digests(again) == _digests(out)


def test_protocols_that_differ_are_refused_with_the_difference(two_runs, tmp_path):
    a, _ = two_runs
    other = tmp_path / "four_models"
    other.mkdir()
    stamp(other, compare_protocol(("csfm", "ecg_fm", "ecg_jepa", "st_mem")), 13)
    res = CliRunner().invoke(main, ["compare", str(a), str(other)])
    assert res.exit_code == 2, res.output
    assert "grid.models" in res.output and "different protocols" in res.output and "rerun four_models" in res.output
    assert not (a / "compare" / "four_models").exists()


def test_a_run_without_profiles_is_refused(two_runs, tmp_path):
    a, _ = two_runs
    bare = tmp_path / "not_analyzed"
    bare.mkdir()
    stamp(bare, compare_protocol(), 14)
    res = CliRunner().invoke(main, ["compare", str(a), str(bare)])
    assert res.exit_code == 2 and "no profiles table" in res.output and "raybench analyze" in res.output


def test_stale_profiles_are_refused(two_runs, tmp_path):
    from raybench.analysis.compare.run import CompareError, load_profiles

    stale = tmp_path / "stale"
    import shutil

    shutil.copytree(two_runs[1], stale)
    prof = pd.read_parquet(stale / "tables" / "profiles.parquet")
    write_table(stale / "tables" / "profiles.parquet", prof.assign(auc=prof.auc + 0.01))
    with pytest.raises(CompareError, match="older than the cells"):
        load_profiles(stale, "stale", compare_protocol(), "synth", 10, 1, num_workers=1)


def test_other_protocol_fields_are_listed_not_refused():
    from raybench.analysis.compare.run import protocol_differences

    p = compare_protocol()
    q = dataclasses.replace(p, inference=dataclasses.replace(p.inference, patient_draws=300))
    diffs = protocol_differences(p, q)
    assert diffs.to_dict("records") == [{"field": "inference.patient_draws", "run_a": "200", "run_b": "300",
                                         "blocking": False}]
