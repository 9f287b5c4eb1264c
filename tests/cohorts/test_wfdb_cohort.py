"""`cohort.kind: wfdb`: any folder of WFDB records to a manifest; every bad record quarantined with its reason while
the others go on (issue 41 item 5: one folder holds every case, built once with concepts off, so no Ray)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from raybench.cohorts.manifest import ManifestError, load_manifest
from raybench.cohorts.waveforms import read_record
from raybench.cohorts.wfdb_cohort import build_wfdb_manifest, record_id
from tests.cohorts.wfdb_folders import ecg, write_dat_record, write_mat_record

CHALLENGE = {"Age": "61", "Sex": "Female", "Dx": "426783006", "Rx": "Unknown"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Good Challenge records (.mat, in two subfolders, one in another lead order and spelling, one .dat, one at
    250 Hz, one of 60 s) beside every bad case of the issue."""
    root = tmp_path_factory.mktemp("wfdb") / "cohort"
    for k in range(6):
        write_mat_record(root / f"g{k % 2 + 1}", f"A{k:04d}", ecg(10, 500, seed=k),
                         500, comments={**CHALLENGE, "Site": f"s{k % 2}", "Device": f"d{k % 3}", "Patient": str(k)})
    order = (11, 0, 3, 1, 5, 2, 4, 6, 7, 8, 9, 10)  # V6, I, aVR, II, ...: any order, any case
    spelled = ("v6", "i", "AVR", "ii", "avf", "iii", "AVL", "v1", "V2", "v3", "V4", "v5")
    sig = ecg(10, 500, seed=20)
    write_mat_record(root / "g1", "A0100", sig[list(order)], 500, leads=spelled, comments=CHALLENGE)
    write_dat_record(root / "dat", "B0001", ecg(10, 500, seed=21), 500, comments=CHALLENGE)
    write_mat_record(root / "g2", "A0101", ecg(10, 250, seed=22), 250, comments=CHALLENGE)  # kept, resampled
    write_mat_record(root / "g2", "A0102", ecg(60, 500, seed=23), 500, comments=CHALLENGE)  # kept, cropped
    write_mat_record(root / "bad", "X8LEAD", ecg(10, 500, seed=30, n_leads=8), 500, leads=LEADS8, comments=CHALLENGE)
    nan = ecg(10, 500, seed=31)
    nan[4, 100:400] = np.nan
    write_mat_record(root / "bad", "XNAN", nan, 500, comments=CHALLENGE)
    flat = ecg(10, 500, seed=32)
    flat[7] = 0.25
    write_mat_record(root / "bad", "XFLAT", flat, 500, comments=CHALLENGE)
    write_mat_record(root / "bad", "XSHORT", ecg(5, 500, seed=33), 500, comments=CHALLENGE)
    write_mat_record(root / "bad", "XHEAD", ecg(10, 500, seed=34), 500, comments=CHALLENGE)
    (root / "bad" / "XHEAD.hea").write_text("XHEAD twelve fivehundred\n")
    write_mat_record(root / "g1", "ADUP", ecg(10, 500, seed=35), 500, comments=CHALLENGE)
    write_mat_record(root / "g2", "ADUP", ecg(10, 500, seed=36), 500, comments=CHALLENGE)
    return root


LEADS8 = ("I", "II", "V1", "V2", "V3", "V4", "V5", "V6")


@pytest.fixture(scope="module")
def built(folder, tmp_path_factory):
    out = tmp_path_factory.mktemp("wfdb_manifest")
    path = build_wfdb_manifest(folder, out, patient_key=None, concepts="none")
    df, info = load_manifest(path)
    summary = json.loads((out / "summary.json").read_text())
    quarantine = pd.read_csv(out / "quarantine.csv", dtype={"path": str})
    return df, info, summary, quarantine.set_index("path")


def _reason(built, path: str) -> str:
    return built[3].loc[path, "reason"]


def test_good_records_enter_and_every_bad_one_is_quarantined_with_its_reason(built):
    df, _, summary, quarantine = built
    assert sorted(df["path"]) == sorted(["g1/A0000", "g2/A0001", "g1/A0002", "g2/A0003", "g1/A0004", "g2/A0005",
                                          "g1/A0100", "dat/B0001", "g2/A0101", "g2/A0102"])
    assert summary["quarantine_reasons"] == {"missing_leads": 1, "nan_lead": 1, "flat_lead": 1, "too_short": 1,
                                             "unreadable": 1, "duplicate_record_name": 2}
    assert (df["ecg_id"] == [record_id(p) for p in df["path"]]).all() and df["ecg_id"].is_monotonic_increasing
    assert set(quarantine["ecg_id"]).isdisjoint(df["ecg_id"])


def test_an_8_lead_record_is_quarantined_naming_the_missing_leads(built):
    assert _reason(built, "bad/X8LEAD") == "missing_leads"
    assert "III" in built[3].loc["bad/X8LEAD", "detail"] and "aVR" in built[3].loc["bad/X8LEAD", "detail"]


def test_nan_and_flat_leads_are_quarantined(built):
    assert _reason(built, "bad/XNAN") == "nan_lead" and "aVL" in built[3].loc["bad/XNAN", "detail"]
    assert _reason(built, "bad/XFLAT") == "flat_lead" and "V2" in built[3].loc["bad/XFLAT", "detail"]


def test_a_5_s_record_is_quarantined_as_shorter_than_the_window(built):
    assert _reason(built, "bad/XSHORT") == "too_short" and "5.00 s" in built[3].loc["bad/XSHORT", "detail"]


def test_an_unreadable_header_is_quarantined(built):
    assert _reason(built, "bad/XHEAD") == "unreadable" and "XHEAD.hea" in built[3].loc["bad/XHEAD", "detail"]


def test_two_records_with_one_name_in_different_folders_are_both_quarantined(built):
    assert _reason(built, "g1/ADUP") == _reason(built, "g2/ADUP") == "duplicate_record_name"
    assert "g2/ADUP" in built[3].loc["g1/ADUP", "detail"]


def test_a_250_hz_record_keeps_its_rate_and_a_10_s_window(built, folder):
    df = built[0].set_index("path")
    assert (df.loc["g2/A0101", "fs"], df.loc["g2/A0101", "n_samples"]) == (250, 2500)
    assert built[2]["rates_hz"] == {"250": 1, "500": 9}


def test_a_60_s_record_is_kept_and_read_as_its_central_10_s(built, folder):
    row = built[0].set_index("path").loc["g2/A0102"]
    assert (row["n_samples"], row["record_samples"]) == (5000, 30000) and built[2]["cropped_records"] == 1
    full = read_record(folder, "g2/A0102")
    window = read_record(folder, "g2/A0102", expect_fs=500, expect_samples=5000, record_samples=30000)
    assert window.signal.shape == (12, 5000)
    np.testing.assert_array_equal(window.signal, full.signal[:, 12500:17500])
    assert any("central window" in n for n in window.notes)


def test_leads_are_matched_by_name_in_any_order_and_spelling(folder):
    wave = read_record(folder, "g1/A0100", expect_fs=500, expect_samples=5000)
    np.testing.assert_allclose(wave.signal, ecg(10, 500, seed=20), atol=6e-4)  # 1 uV quantization


def test_header_metadata_rides_in_the_manifest(built):
    df = built[0].set_index("path")
    row = df.loc["g1/A0000"]
    assert (row["age"], row["sex"], row["dx_codes"], row["diagnostic_superclasses"]) == (61.0, "F", "426783006",
                                                                                        "NORM")
    assert (row["site"], row["device"]) == ("s0", "d0")  # #Site / #Device: the provenance audit's variables


def test_each_record_its_own_patient_warns_that_splits_cannot_be_patient_disjoint(built):
    df, _, summary, _ = built
    assert (df["patient_id"] == df["path"]).all()
    assert any(n.startswith("WARNING") and "patient-disjoint" in n for n in summary["notes"])
    assert summary["patient_disjoint_split"].startswith("not guaranteed")


def test_patient_ids_from_a_header_key_split_by_the_hashed_patient_rule(folder, tmp_path):
    from raybench.cohorts.split import ptbxl_split

    df, _ = load_manifest(build_wfdb_manifest(folder, tmp_path, patient_key="Patient", concepts="none"))
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert sorted(df["patient_id"]) == [str(k) for k in range(6)]  # the records without #Patient: quarantined
    assert (df["split"] == [ptbxl_split(p) for p in df["patient_id"]]).all()
    assert summary["quarantine_reasons"]["missing_patient_id"] == 4
    assert not any("patient-disjoint" in n for n in summary["notes"])


def test_patient_csv_rows_naming_no_record_are_quarantined_and_the_run_goes_on(folder, tmp_path):
    csv = tmp_path / "patients.csv"
    pd.DataFrame({"record": ["A0000", "g2/A0001", "A0002", "NOSUCH", "ADUP"], "patient_id": ["p1", "p1", "p2", "p3",
                                                                                             "p4"],
                  "site": ["x", "x", "y", "z", "z"]}).to_csv(csv, index=False)
    df, _ = load_manifest(build_wfdb_manifest(folder, tmp_path / "m", patients_csv=csv, concepts="none"))
    summary = json.loads((tmp_path / "m" / "summary.json").read_text())
    quarantine = pd.read_csv(tmp_path / "m" / "quarantine.csv").set_index("path")
    assert sorted(df["path"]) == ["g1/A0000", "g1/A0002", "g2/A0001"]
    assert list(df.set_index("path").loc[["g1/A0000", "g2/A0001"], "site"]) == ["x", "x"]  # the CSV's, not #Site
    assert quarantine.loc["NOSUCH", "reason"] == "csv_unknown_record"
    assert summary["quarantine_reasons"]["csv_unknown_record"] == 1
    assert summary["quarantine_reasons"]["missing_patient_id"] == 7  # good records the CSV leaves out


def test_a_patient_csv_without_a_patient_column_is_refused_naming_the_expected_columns(folder, tmp_path):
    csv = tmp_path / "patients.csv"
    pd.DataFrame({"record": ["A0000"], "subject": ["p1"]}).to_csv(csv, index=False)
    with pytest.raises(ManifestError, match=r"patient_id.*columns record, patient_id \(optional site, device"):
        build_wfdb_manifest(folder, tmp_path / "m", patients_csv=csv, concepts="none")
    assert not (tmp_path / "m" / "manifest.parquet").exists()


def test_the_cli_refuses_a_bad_csv_in_one_line_with_exit_2(folder, tmp_path):
    from raybench.app.cli import main

    csv = tmp_path / "patients.csv"
    pd.DataFrame({"rec": ["A0000"], "patient_id": ["p1"]}).to_csv(csv, index=False)
    result = CliRunner().invoke(main, ["manifest", "wfdb", str(folder), "--out", str(tmp_path / "m"),
                                       "--patients-csv", str(csv), "--concepts", "none"])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and "record, patient_id" in lines[0], result.output


def test_an_empty_folder_is_refused(tmp_path):
    with pytest.raises(ManifestError, match="no WFDB header"):
        build_wfdb_manifest(tmp_path, tmp_path / "m", concepts="none")


def test_concepts_default_to_waveform49_measured_on_the_window_encoders_see(tmp_path, ray_cluster):
    from raybench.cohorts.panel import concept_names
    from raybench.cohorts.waveform49 import measure_signal49

    root = tmp_path / "cohort"
    write_mat_record(root, "A1", ecg(10, 500, seed=1), 500, comments=CHALLENGE)
    write_mat_record(root, "A2", ecg(10, 250, seed=2), 250, comments=CHALLENGE)
    long = ecg(30, 500, seed=3)
    long[:, :5000] *= 2.5  # the first 10 s differ from the central window
    write_mat_record(root, "A3", long, 500, comments=CHALLENGE)
    df, info = load_manifest(build_wfdb_manifest(root, tmp_path / "m", num_cpus=2))
    assert info.concept_source == "waveform49" and list(info.concepts) == concept_names()
    row = df.set_index("path").loc["A3"]
    window = read_record(root, "A3", expect_fs=500, expect_samples=5000, record_samples=15000).signal
    expected = measure_signal49(window, 500.0)
    for name in concept_names():
        got, want = row[f"raw_{name}"], expected[name]
        assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want), name
    assert np.isfinite(df["raw_hr_ventricular"]).all() and df["raw_hr_ventricular"].between(60, 85).all()
