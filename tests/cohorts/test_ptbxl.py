"""Manifest on the real PTB-XL sample (100 records, upper-case AVR/AVL/AVF headers, no PTB-XL+ tables)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from raybench.cohorts import manifest as M
from raybench.cohorts.ptbxl import build_ptbxl_manifest
from raybench.cohorts.split import ptbxl_split
from raybench.cohorts.waveforms import read_record


@pytest.fixture(scope="module", params=[500, 100])
def built(request, ptbxl_sample, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"ptbxl{request.param}")
    path = build_ptbxl_manifest(ptbxl_sample, out, sampling_rate=request.param, concepts="none")
    return request.param, path, ptbxl_sample


def test_all_100_records_pass_with_real_lead_names(built):
    rate, path, root = built
    df, info = M.load_manifest(path)
    assert len(df) == 100
    assert df["ecg_id"].tolist() == list(range(1, 101))
    assert (df["fs"] == rate).all() and (df["n_samples"] == rate * 10).all()
    folder = "records500" if rate == 500 else "records100"
    assert df["path"].str.startswith(folder + "/").all()
    assert "AVR" in (root / (df["path"].iloc[0] + ".hea")).read_text()
    wave = read_record(info.root, df["path"].iloc[0], rate, rate * 10)
    assert wave.signal.shape == (12, rate * 10)
    assert info.root == root.resolve()
    assert pd.read_csv(path.parent / "quarantine.csv").empty


def test_columns_types_and_patient_ids_as_written(built):
    _, path, root = built
    df, info = M.load_manifest(path)
    assert list(df.columns) == [*M.BASE_COLUMNS, "diagnostic_superclasses"]  # + the provenance audit's target
    assert df["ecg_id"].dtype == np.int64
    assert df["patient_id"].iloc[0] == "15709.0"
    assert df["device"].iloc[0] == "CS-12   E"  # padding kept as written
    assert info.concepts == () and info.concept_source == "none"
    raw = pd.read_csv(root / "ptbxl_database.csv", dtype=str)
    assert df["patient_id"].tolist() == raw["patient_id"].tolist()


def test_splits_follow_the_rule_and_are_patient_disjoint(built):
    _, path, _ = built
    df, _ = M.load_manifest(path)
    assert df["split"].tolist() == [ptbxl_split(p) for p in df["patient_id"]]
    assert (df.groupby("patient_id")["split"].nunique() == 1).all()
    sets = {s: set(df.loc[df["split"] == s, "patient_id"]) for s in ("train", "val", "test")}
    assert not (sets["train"] & sets["val"]) and not (sets["train"] & sets["test"]) and not (sets["val"] & sets["test"])
    summary = json.loads((path.parent / "summary.json").read_text())
    assert sum(v["records"] for v in summary["splits"].values()) == 100
    assert sum(v["patients"] for v in summary["splits"].values()) == df["patient_id"].nunique()


def test_hash_is_stable_and_independent_of_output_folder(built, tmp_path):
    rate, path, root = built
    again = build_ptbxl_manifest(root, tmp_path / "again", sampling_rate=rate, concepts="none")
    assert M.load_manifest(again)[1].manifest_hash == M.load_manifest(path)[1].manifest_hash


def test_tables_without_ptbxl_plus_features_is_refused(ptbxl_sample, tmp_path):
    with pytest.raises(M.ManifestError, match="features"):
        build_ptbxl_manifest(ptbxl_sample, tmp_path / "t", concepts="tables")
    assert not (tmp_path / "t" / "manifest.parquet").exists()
