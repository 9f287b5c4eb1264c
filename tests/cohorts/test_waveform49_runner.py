"""waveform49 as Ray tasks over manifest rows, wired into the ptbxl / synth / mimic manifests by
`cohort.concepts: waveform49`; and, where the shared PTB-XL validation folder exists, real records."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.cohorts.panel import concept_names
from raybench.cohorts.waveform49 import measure_signal49
from raybench.cohorts.waveform49.runner import measure49, waveform49_values
from raybench.core.config import CohortConfig, ConfigError
from tests.cohorts.test_waveform_concepts import write_wfdb
from tests.cohorts.waveform49_records import record

# the 200-record PTB-XL validation folder with cardiologists' statements, where the machine has one
VALIDATION = Path(os.environ.get("RAYBENCH_PTBXL_VALIDATION", "/nonexistent"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """Three good records (hr 60, 75, 90), a flat one, a 1.6 s one with a single beat; one listed but absent."""
    root = tmp_path_factory.mktemp("w49")
    for name, hr in (("a", 60.0), ("b", 75.0), ("c", 90.0)):
        write_wfdb(root, name, record(hr=hr, noise=0.01, seed=1)[0])
    write_wfdb(root, "flat", np.zeros((12, 5000)))
    write_wfdb(root, "short", record(hr=40.0, seconds=1.6)[0])
    return root


def _rows(names: list[str]) -> pd.DataFrame:
    return pd.DataFrame({"ecg_id": range(1, len(names) + 1), "path": names, "fs": 500.0})


def test_runner_measures_every_good_record_and_keeps_going_past_bad_ones(folder, ray_cluster):
    rows = _rows(["a", "flat", "b", "absent", "short", "c"])
    values, failures, why, cpu_s = measure49(folder, rows, num_cpus=2, chunk_size=2)
    assert cpu_s > 0
    assert list(values.columns) == concept_names() and values.index.tolist() == [1, 2, 3, 4, 5, 6]
    np.testing.assert_allclose(values.loc[[1, 3, 6], "hr_ventricular"], [60.0, 75.0, 90.0], atol=0.5)
    assert values.loc[[2, 4, 5]].isna().all().all()
    assert dict(zip(failures["ecg_id"], failures["reason"], strict=True)) == {
        2: "flat_lead", 4: "missing_header", 5: "too_few_beats"}
    assert why["qrs_duration"] == {"record:flat_lead": 1, "record:missing_header": 1, "record:too_few_beats": 1}
    here = measure_signal49(record(hr=60.0, noise=0.01, seed=1)[0], 500.0)  # the same signal, before WFDB's 1 uV
    for name in ("hr_ventricular", "qrs_axis_front", "r_amp_global"):
        assert values.loc[1, name] == pytest.approx(here[name], rel=1e-3), name


def test_manifest_helper_writes_missing_counts_with_reasons(folder, ray_cluster):
    notes, summary = [], {}
    values = waveform49_values(folder, _rows(["a", "flat", "b"]), 2, notes, summary)
    assert values.shape == (3, 49)
    assert summary["waveform_concept_failures"] == {"count": 1, "reasons": {"flat_lead": 1}}
    assert summary["waveform49_missing"]["qt_interval"] == {"count": 1, "reasons": {"record:flat_lead": 1}}
    assert any("waveform49 could not measure 1 records" in n for n in notes)
    assert summary["waveform49_cpu"]["records"] == 3 and summary["waveform49_cpu"]["records_per_cpu_s"] > 0


def test_config_offers_waveform49_and_refuses_other_names():
    CohortConfig(kind="ptbxl", root="/data/ptbxl", concepts="waveform49").validate()
    CohortConfig(kind="mimic", root="/data/mimic", concepts="waveform49").validate()
    with pytest.raises(ConfigError, match="concepts"):
        CohortConfig(concepts="waveform50").validate()


def test_synth_manifest_carries_the_49_measured_concepts(ray_cluster, tmp_path):
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort

    cohort = generate_synth_cohort(tmp_path / "cohort", 24, 12, seed=3)
    df, info = load_manifest(build_synth_manifest(cohort, tmp_path / "m", concepts="waveform49", num_cpus=2))
    assert info.concept_source == "waveform49" and list(info.concepts) == concept_names()
    truth = pd.read_csv(cohort / "ground_truth.csv").set_index("ecg_id").reindex(df["ecg_id"])
    for name in ("hr_ventricular", "qrs_duration", "qt_interval", "r_amp_global"):
        assert np.corrcoef(df[f"raw_{name}"], truth[name])[0, 1] > 0.95, name
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    assert summary["concept_source"] == "waveform49" and "waveform49_missing" in summary


def test_mimic_manifest_can_measure_the_49_concepts(ray_cluster, tmp_path):
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.mimic import build_mimic_manifest
    from tests.cohorts.test_mimic import write_mimic_fixture

    truth = write_mimic_fixture(tmp_path / "mimic")
    df, info = load_manifest(build_mimic_manifest(tmp_path / "mimic", tmp_path / "m", concepts="waveform49"))
    assert info.concept_source == "waveform49" and list(info.concepts) == concept_names()
    rr = df["ecg_id"].map(lambda s: truth[s]["rr_mean_ms"])
    np.testing.assert_allclose(df["raw_rr_mean"], rr, rtol=0.02)


@pytest.mark.skipif(not (VALIDATION / "ptbxl_database.csv").exists(),
                    reason="set RAYBENCH_PTBXL_VALIDATION to a PTB-XL folder")
def test_real_bundle_branch_blocks_measure_wide_and_normal_records_narrow():
    from raybench.cohorts.waveforms import read_record

    db = pd.read_csv(VALIDATION / "ptbxl_database.csv")
    codes = db["scp_codes"].map(lambda s: set(ast.literal_eval(s)))
    blocks = db[codes.map(lambda c: bool(c & {"CLBBB", "CRBBB"}))].head(4)
    normal = db[codes.map(lambda c: "NORM" in c)].head(8)
    qrs = {}
    for tag, rows in (("block", blocks), ("norm", normal)):
        qrs[tag] = [measure_signal49(read_record(VALIDATION, rel).signal, 500.0)["qrs_duration"]
                    for rel in rows["filename_hr"]]
    assert len(qrs["block"]) >= 1 and min(qrs["block"]) >= 120.0  # bundle branch block: QRS >= 120 ms
    assert 70.0 <= np.median(qrs["norm"]) <= 115.0
