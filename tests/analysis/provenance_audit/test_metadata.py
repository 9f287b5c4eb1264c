"""Device families, nested provenance variables, and the metadata comparator's features from ptbxl_database.csv."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.provenance_audit.metadata import device_family, ptbxl_metadata, variable_labels


@pytest.mark.parametrize(("raw", "family"), [
    ("AT-6 C 5.5", "AT-6"), ("AT-6 C 5.8", "AT-6"), ("AT-6     6", "AT-6"), ("AT-6 C", "AT-6"),
    ("AT-60    3", "AT-60"), ("CS-12   E", "CS-12"), ("CS-12", "CS-12"), ("CS100    3", "CS100"),
    ("  unknown device ", "unknown device"),
])
def test_device_family_keeps_the_recorder_model(raw, family):
    assert device_family(raw) == family


def test_variable_labels_group_families_and_nest_site_and_device():
    frame = pd.DataFrame({"site": ["0.0", "0.0", "2.0", "2.0"],
                          "device": ["AT-6 C 5.5", "AT-6 C 5.8", "AT-6 C 5.8", "CS-12   E"]})
    assert list(variable_labels(frame, "device", "raw")) == ["AT-6 C 5.5", "AT-6 C 5.8", "AT-6 C 5.8", "CS-12   E"]
    assert list(variable_labels(frame, "device", "family")) == ["AT-6", "AT-6", "AT-6", "CS-12"]
    assert list(variable_labels(frame, "site+device", "family")) == ["0.0/AT-6", "0.0/AT-6", "2.0/AT-6",
                                                                     "2.0/CS-12"]
    with pytest.raises(KeyError, match="nurse"):
        variable_labels(frame, "site+nurse", "raw")


def test_metadata_features_from_the_database(tmp_path):
    pd.DataFrame({"ecg_id": [1, 2, 3], "age": ["56.0", "", "300"], "sex": ["1", "0", "1"],
                  "recording_date": ["1984-11-09 09:17:34", "1995-01-02 10:00:00", "not a date"]}
                 ).to_csv(tmp_path / "ptbxl_database.csv", index=False)
    got = ptbxl_metadata(tmp_path, np.array([3, 1, 2, 9]))
    np.testing.assert_array_equal(got[1], [56.0, 1.0, 1984.0])
    assert np.isnan(got[2, 0]) and got[2, 2] == 1995.0 and np.isnan(got[0, 2])
    assert np.isnan(got[3]).all()  # an id the table does not hold
    assert ptbxl_metadata(tmp_path / "none", np.array([1])) is None


def test_metadata_of_the_ptbxl_sample(ptbxl_sample):
    db = pd.read_csv(ptbxl_sample / "ptbxl_database.csv")
    got = ptbxl_metadata(ptbxl_sample, db.ecg_id.to_numpy()[:5])
    np.testing.assert_allclose(got[:, 0], db.age.to_numpy()[:5])
    assert (got[:, 2] == 1984).all()


def test_a_metadata_csv_turns_the_comparator_on_for_any_cohort(tmp_path):
    from raybench.analysis.provenance_audit.run import ProvenanceError, block_metadata
    from raybench.core.config import ProvenanceConfig

    per_patient = tmp_path / "patients.csv"
    pd.DataFrame({"patient_id": ["p1", "p2"], "age": ["71", "44"], "sex": ["F", "male"]}).to_csv(per_patient,
                                                                                              index=False)
    ids = {"train": np.array([10, 11, 12]), "val": np.array([13]), "test": np.array([14])}
    pats = {"train": np.array(["p1", "p2", "p3"]), "val": np.array(["p2"]), "test": np.array(["p1"])}
    got = block_metadata(ProvenanceConfig(metadata_csv=str(per_patient)), tmp_path, ids, pats)
    np.testing.assert_array_equal(got["train"][:2, :2], [[71.0, 1.0], [44.0, 0.0]])
    assert np.isnan(got["train"][2]).all() and np.isnan(got["train"][:, 2]).all()  # unknown patient, no year
    assert got["test"][0, 0] == 71.0
    assert block_metadata(ProvenanceConfig(), tmp_path, ids, pats) is None  # no CSV, no ptbxl_database.csv
    per_record = tmp_path / "records.csv"
    pd.DataFrame({"ecg_id": [14, 10], "recording_year": [2011, 2015]}).to_csv(per_record, index=False)
    got = block_metadata(ProvenanceConfig(metadata_csv=str(per_record)), tmp_path, ids, pats)
    assert got["test"][0, 2] == 2011 and got["train"][0, 2] == 2015 and np.isnan(got["val"][0, 2])
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"subject": [1], "age": [3]}).to_csv(bad, index=False)
    with pytest.raises(ProvenanceError, match=r"bad.csv: .* needs ecg_id or patient_id"):
        block_metadata(ProvenanceConfig(metadata_csv=str(bad)), tmp_path, ids, pats)


def test_missing_values_are_no_group_and_nested_labels_carry_their_strata():
    from raybench.analysis.provenance_audit.metadata import variable_strata

    frame = pd.DataFrame({"site": ["0", "0", None, "2"], "device": ["AT-6", float("nan"), "CS-12", "CS-12"]})
    assert list(variable_labels(frame, "device", "raw")) == ["AT-6", "", "CS-12", "CS-12"]
    assert list(variable_labels(frame, "site+device", "raw")) == ["0/AT-6", "", "", "2/CS-12"]
    assert list(variable_labels(frame, "device|site", "raw")) == ["AT-6", "", "CS-12", "CS-12"]
    assert list(variable_strata(frame, "device|site", "raw")) == ["0", "0", "", "2"]
    assert variable_strata(frame, "device", "raw") is None
