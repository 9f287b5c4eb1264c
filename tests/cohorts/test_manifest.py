"""Manifest on a synthetic cohort: raw concepts equal the ground truth, standardization, hash, metadata, CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from raybench.cohorts import manifest as M
from raybench.cohorts.panel import CONCEPTS, WAVEFORM_CONCEPTS, concept_names
from raybench.cohorts.ptbxl import build_ptbxl_manifest, build_synth_manifest
from raybench.cohorts.synth import generate_synth_cohort


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    return generate_synth_cohort(tmp_path_factory.mktemp("synth") / "c", n_records=80, n_patients=30, seed=3,
                                 bad_fraction=0.1)


@pytest.fixture(scope="module")
def built(cohort, tmp_path_factory):
    out = tmp_path_factory.mktemp("man")
    return build_synth_manifest(cohort, out)


def _truth(cohort: Path) -> pd.DataFrame:
    return pd.read_csv(cohort / "ground_truth.csv", keep_default_na=False, na_values=[""]).set_index("ecg_id")


def test_raw_concepts_equal_ground_truth(cohort, built):
    df, info = M.load_manifest(built)
    assert info.concepts == tuple(concept_names()) and info.concept_source == "tables"
    truth = _truth(cohort).loc[df["ecg_id"]]
    for name in concept_names():
        got = df[f"raw_{name}"].to_numpy()
        want = truth[name].to_numpy(float)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-12, err_msg=name)
    # the planted missingness reaches the manifest: no-P records and records without an ECGDeli row
    assert df["raw_pr_interval"].isna().any() or truth["p_found"].eq(1).all()
    assert df["raw_rr_iqr"].isna().any()


def test_planted_defects_are_quarantined_with_their_reason(cohort, built):
    truth = _truth(cohort)
    planted = truth["planted_defect"].dropna()
    quarantine = pd.read_csv(built.parent / "quarantine.csv").set_index("ecg_id")
    assert list(quarantine.columns) == ["path", "reason", "detail"]
    assert sorted(quarantine.index) == sorted(planted.index)
    assert (quarantine.loc[planted.index, "reason"] == planted).all()
    df, _ = M.load_manifest(built)
    assert len(df) == 80 - len(planted)
    assert not set(df["ecg_id"]) & set(planted.index)


def test_layout_order_and_dtypes(built):
    df, _ = M.load_manifest(built)
    names = concept_names()
    assert list(df.columns) == [*M.BASE_COLUMNS, *[f"raw_{n}" for n in names], *names, "diagnostic_superclasses"]
    assert df["ecg_id"].is_monotonic_increasing and df["ecg_id"].is_unique
    assert df["ecg_id"].dtype == np.int64 and df["fs"].dtype == np.int64
    assert all(df[f"raw_{n}"].dtype == np.float64 for n in names)
    assert all(df[n].dtype == np.float32 for n in names)
    assert set(df["split"]) <= {"train", "val", "test"}
    assert (df.groupby("patient_id")["split"].nunique() == 1).all()
    meta = pq.read_schema(built).metadata
    for key in (b"raybench.root", b"raybench.concepts", b"raybench.concept_source", b"raybench.manifest_hash"):
        assert key in meta
    assert json.loads(meta[b"raybench.concepts"]) == names


def test_standardized_with_train_statistics(built):
    df, _ = M.load_manifest(built)
    train = df["split"] == "train"
    summary = json.loads((built.parent / "summary.json").read_text())
    for name in ("hr_ventricular", "r_amp_global", "rr_iqr", "pr_interval", "p_found"):
        raw = df[f"raw_{name}"]
        ok = raw.notna()
        mean, std = raw[train & ok].mean(), max(raw[train & ok].std(ddof=0), 1e-6)
        np.testing.assert_allclose(df.loc[ok, name], (raw[ok] - mean) / std, rtol=1e-5, atol=1e-5)
        assert (df.loc[~ok, name] == 0).all()
        stats = summary["concept_stats"][name]
        assert stats["train_mean"] == pytest.approx(mean) and stats["train_std"] == pytest.approx(std)
    z = df.loc[train, "hr_ventricular"]
    assert abs(z.mean()) < 1e-5 and abs(z.std(ddof=0) - 1) < 1e-4


def test_constant_concept_uses_std_floor():
    z, mean, std, n = M.standardize(np.array([2.0, 2.0, np.nan, 5.0, np.inf]), np.array([1, 1, 1, 0, 1], bool))
    assert (mean, std, n) == (2.0, 1e-6, 2)
    assert z.dtype == np.float32
    np.testing.assert_allclose(z, [0, 0, 0, 3e6, 0])


def test_hash_stable_content_sensitive_and_tamper_checked(cohort, built, tmp_path):
    df, info = M.load_manifest(built)
    assert M.manifest_hash(df) == info.manifest_hash
    again = build_synth_manifest(cohort, tmp_path / "again")
    assert M.load_manifest(again)[1].manifest_hash == info.manifest_hash
    changed = df.copy()
    changed.loc[0, "raw_qrs_duration"] += 1.0
    assert M.manifest_hash(changed) != info.manifest_hash
    moved = df.copy()
    moved.loc[0, "split"] = "test" if moved.loc[0, "split"] != "test" else "train"
    assert M.manifest_hash(moved) != info.manifest_hash
    # a manifest edited after writing is refused on load
    table = pq.read_table(built)
    bad = table.set_column(table.schema.get_field_index("path"), "path",
                           [["x" + p for p in table.column("path").to_pylist()]])
    pq.write_table(bad, tmp_path / "edited.parquet")
    with pytest.raises(M.ManifestError, match="does not match its stored hash"):
        M.load_manifest(tmp_path / "edited.parquet")
    pq.write_table(table.replace_schema_metadata({}), tmp_path / "plain.parquet")
    with pytest.raises(M.ManifestError, match="raybench metadata"):
        M.load_manifest(tmp_path / "plain.parquet")


def test_summary_contents(built):
    summary = json.loads((built.parent / "summary.json").read_text())
    assert summary["cohort"] == "synth" and summary["records_listed"] == 80
    assert summary["records"] + summary["quarantined"] == 80
    assert sum(summary["quarantine_reasons"].values()) == summary["quarantined"]
    assert set(summary["splits"]) == {"train", "val", "test"}
    assert all(set(v) == {"records", "patients"} for v in summary["splits"].values())
    assert 0 < summary["concept_stats"]["rr_iqr"]["missing_fraction"] < 0.2
    assert summary["manifest_hash"] == M.load_manifest(built)[1].manifest_hash


def test_rate_100_and_missing_ecgdeli_table(cohort, tmp_path):
    root = tmp_path / "c"
    shutil.copytree(cohort, root)
    (root / "features" / "ecgdeli_features.csv").unlink()
    path = build_synth_manifest(root, tmp_path / "m", sampling_rate=100)
    df, info = M.load_manifest(path)
    assert (df["fs"] == 100).all() and (df["n_samples"] == 1000).all()
    assert df["path"].str.startswith("records100/").all()
    assert len(info.concepts) == 42
    assert not {c.name for c in CONCEPTS if c.source == "ecgdeli"} & set(info.concepts)
    notes = json.loads((path.parent / "summary.json").read_text())["notes"]
    assert any("ecgdeli_features.csv not found" in n for n in notes)


def test_not_a_synth_cohort(tmp_path):
    with pytest.raises(M.ManifestError, match="ground_truth.csv"):
        build_synth_manifest(tmp_path, tmp_path / "m")


def test_cli_cohort_and_manifest(tmp_path):
    from raybench.app.cli import main

    runner = CliRunner()
    for args in (["cohort", "--help"], ["cohort", "synth", "--help"], ["manifest", "--help"],
                 ["manifest", "ptbxl", "--help"], ["manifest", "synth", "--help"], ["manifest", "mimic", "--help"]):
        result = runner.invoke(main, args)
        assert result.exit_code == 0, (args, result.output)
    result = runner.invoke(main, ["cohort", "synth", "--out", str(tmp_path / "c"), "--records", "12",
                                  "--patients", "5", "--seed", "2", "--bad-fraction", "0.1"])
    assert result.exit_code == 0, result.output
    assert "records/s" in result.output
    result = runner.invoke(main, ["manifest", "synth", str(tmp_path / "c"), "--out", str(tmp_path / "m")])
    assert result.exit_code == 0, result.output
    assert "11 records" in result.output and "1 quarantined" in result.output
    result = runner.invoke(main, ["manifest", "ptbxl", str(tmp_path / "c"), "--out", str(tmp_path / "p"),
                                  "--rate", "100", "--concepts", "tables"])
    assert result.exit_code == 0, result.output
    assert M.load_manifest(tmp_path / "p")[1].concept_source == "tables"
    result = runner.invoke(main, ["cohort", "synth", "--out", str(tmp_path / "x"), "--records", "2",
                                  "--patients", "3"])
    assert result.exit_code != 0 and "--patients" in result.output


def test_auto_falls_back_to_waveform_concepts(cohort, tmp_path, ray_cluster):
    root = tmp_path / "c"
    root.mkdir()
    db = pd.read_csv(cohort / "ptbxl_database.csv", dtype=str, keep_default_na=False).head(6)
    db.to_csv(root / "ptbxl_database.csv", index=False)
    for rel in db["filename_hr"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        for ext in (".hea", ".dat"):
            shutil.copy(cohort / (rel + ext), root / (rel + ext))
    path = build_ptbxl_manifest(root, tmp_path / "m", concepts="auto", num_cpus=1)
    df, info = M.load_manifest(path)
    assert info.concept_source == "waveform" and info.concepts == WAVEFORM_CONCEPTS
    truth = _truth(cohort).loc[df["ecg_id"]]
    ok = df["raw_rr_mean_ms"].notna()
    assert ok.sum() >= 3
    np.testing.assert_allclose(df.loc[ok, "raw_rr_mean_ms"], truth.loc[ok.to_numpy(), "rr_mean_ms"], atol=20)
    notes = json.loads((path.parent / "summary.json").read_text())["notes"]
    assert any("waveform-derived" in n for n in notes)


def _records(patients: list[str], splits: list[str]) -> pd.DataFrame:
    n = len(patients)
    return pd.DataFrame({"ecg_id": np.arange(n, 0, -1), "patient_id": patients, "split": splits, "site": "0",
                         "device": "d", "path": [f"r/{i}" for i in range(n)], "fs": 500, "n_samples": 5000})


def test_finish_manifest_generic_entry_point(tmp_path):
    recs = _records(["1", "2", "3"], ["train", "train", "test"])
    values = pd.DataFrame({"a": [1.0, 3.0, 100.0, 7.0]}, index=pd.Index([3, 2, 1, 99], name="ecg_id"))
    path = M.finish_manifest(tmp_path, recs, tmp_path, values, ["a"], "tables",
                             [{"ecg_id": 5, "path": "r/x", "reason": "flat_lead", "detail": "flat lead V1"}],
                             [], {"cohort": "test"}, "rule")
    df, info = M.load_manifest(path)
    assert df["ecg_id"].tolist() == [1, 2, 3]  # ordered by ecg_id
    assert df["raw_a"].tolist() == [100.0, 3.0, 1.0]
    np.testing.assert_allclose(df["a"], [(100 - 2) / 1, (3 - 2) / 1, (1 - 2) / 1])  # train = ecg 2, 3
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["quarantine_reasons"] == {"flat_lead": 1}
    assert any("1 concept rows have no usable record" in n for n in summary["notes"])
    with pytest.raises(M.ManifestError, match="patients in two splits"):
        M.finish_manifest(tmp_path / "x", _records(["1", "1"], ["train", "test"]), tmp_path, None, [], "none",
                          [], [], {}, "rule")
    assert not (tmp_path / "x" / "manifest.parquet").exists()
