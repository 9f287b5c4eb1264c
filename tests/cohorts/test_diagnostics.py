"""Diagnostic superclasses from scp_codes (+ scp_statements.csv) and the target labels built on them."""

from __future__ import annotations

import numpy as np
import pandas as pd

from raybench.cohorts.diagnostics import (
    database_superclasses,
    parse_codes,
    record_superclasses,
    statement_classes,
    target_labels,
)


def test_codes_map_to_their_superclasses(tmp_path):
    pd.DataFrame({"description": ["normal", "ant MI", "inf MI", "AF", "LVH"],
                  "diagnostic_class": ["NORM", "MI", "MI", "", "HYP"]},
                 index=["NORM", "AMI", "IMI", "AFIB", "LVH"]).to_csv(tmp_path / "scp_statements.csv")
    classes = statement_classes(tmp_path / "scp_statements.csv")
    assert classes == {"NORM": "NORM", "AMI": "MI", "IMI": "MI", "LVH": "HYP"}  # AFIB: a rhythm statement
    codes = pd.Series(["{'NORM': 100.0, 'SR': 0.0}", "{'IMI': 50.0, 'AMI': 100.0, 'LVH': 0.0}", "{'AFIB': 100.0}",
                       "", "not a dict"])
    got = record_superclasses(codes, classes)
    assert got.tolist() == ["NORM", "HYP;MI", "", "", ""]
    assert target_labels(got, "NORM").tolist() == [1, 0, 0, 0, 0]
    assert target_labels(got, "MI").tolist() == [0, 1, 0, 0, 0]
    db = pd.DataFrame({"scp_codes": codes})
    assert database_superclasses(db, tmp_path).tolist() == got.tolist()


def test_without_statements_a_superclass_code_maps_to_itself(tmp_path):
    assert parse_codes("{'NORM': 100.0}") == ["NORM"]
    got = database_superclasses(pd.DataFrame({"scp_codes": ["{'NORM': 100.0}", "{'AFIB': 100.0}"]}), tmp_path)
    assert got.tolist() == ["NORM", ""]
    assert database_superclasses(pd.DataFrame({"ecg_id": [1]}), tmp_path).tolist() == [""]


def test_the_ptbxl_sample_manifest_carries_the_target(ptbxl_sample, tmp_path):
    from raybench.cohorts.diagnostics import COLUMN
    from raybench.cohorts.ptbxl import build_ptbxl_manifest

    path = build_ptbxl_manifest(ptbxl_sample, tmp_path / "m", sampling_rate=100, concepts="none")
    df = pd.read_parquet(path)
    db = pd.read_csv(ptbxl_sample / "ptbxl_database.csv").set_index("ecg_id")
    assert {"site", "device", COLUMN} <= set(df.columns)
    norm = np.array(["'NORM'" in db.loc[i, "scp_codes"] for i in df.ecg_id])
    np.testing.assert_array_equal(target_labels(df[COLUMN], "NORM"), norm.astype(int))
