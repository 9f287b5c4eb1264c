"""Bad input: record-level defects are quarantined with a reason; table-level defects are clear errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import raybench.cohorts.record_checks as record_checks
from raybench.cohorts import manifest as M
from raybench.cohorts.ptbxl import build_ptbxl_manifest
from raybench.cohorts.record_checks import check_record, validate_records
from raybench.cohorts.synth import generate_synth_cohort
from raybench.cohorts.waveforms import RecordError, read_record


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return generate_synth_cohort(tmp_path_factory.mktemp("bad") / "c", n_records=20, n_patients=8, seed=21)


@pytest.fixture
def root(base, tmp_path) -> Path:
    dst = tmp_path / "root"
    shutil.copytree(base, dst)
    return dst


def _base(root: Path, eid: int, rate: int = 500) -> Path:
    folder, suffix = ("records500", "hr") if rate == 500 else ("records100", "lr")
    return root / folder / "00000" / f"{eid:05d}_{suffix}"


def _edit_header(root: Path, eid: int, edit) -> None:
    hea = _base(root, eid).with_suffix(".hea")
    lines = hea.read_text().splitlines()
    hea.write_text("\n".join(edit(lines)) + "\n")


def _samples(root: Path, eid: int) -> np.ndarray:
    return np.fromfile(_base(root, eid).with_suffix(".dat"), dtype="<i2").reshape(5000, 12)


def _write_samples(root: Path, eid: int, data: np.ndarray) -> None:
    data.astype("<i2").tofile(_base(root, eid).with_suffix(".dat"))


def _db(root: Path) -> pd.DataFrame:
    return pd.read_csv(root / "ptbxl_database.csv", dtype=str, keep_default_na=False)


def _build(root: Path, out: Path, **kw) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    path = build_ptbxl_manifest(root, out, **kw)
    df, _ = M.load_manifest(path)
    quarantine = pd.read_csv(out / "quarantine.csv").set_index("ecg_id")
    return df, quarantine, json.loads((out / "summary.json").read_text())


def test_record_level_defects_are_quarantined_with_reasons(root, tmp_path):
    expected: dict[int, str] = {}
    dat = lambda eid: _base(root, eid).with_suffix(".dat")  # noqa: E731

    # 1 truncated .dat / 2 .dat longer than the header says
    dat(1).write_bytes(dat(1).read_bytes()[:50_000])
    expected[1] = "truncated"
    dat(2).write_bytes(dat(2).read_bytes() + b"\0" * 24)
    expected[2] = "shape_mismatch"
    # 3 header length disagrees with the expected 10 s / 4 header rate wrong
    _edit_header(root, 3, lambda ls: [ls[0].replace(" 5000", " 4000"), *ls[1:]])
    expected[3] = "length_mismatch"
    _edit_header(root, 4, lambda ls: [ls[0].replace(" 500 ", " 250 "), *ls[1:]])
    expected[4] = "rate_mismatch"
    # 5 NaN samples in one lead / 6 a flat lead
    data = _samples(root, 5)
    data[100:300, 7] = -32768
    _write_samples(root, 5, data)
    expected[5] = "nan_lead"
    data = _samples(root, 6)
    data[:, 2] = 17
    _write_samples(root, 6, data)
    expected[6] = "flat_lead"
    # 7 a lead missing from the header (11 channels) / 8 a lead mislabeled
    data = _samples(root, 7)[:, :11]
    _write_samples(root, 7, data)
    _edit_header(root, 7, lambda ls: [ls[0].replace(" 12 ", " 11 "), *ls[1:12]])
    expected[7] = "missing_leads"
    _edit_header(root, 8, lambda ls: [*ls[:12], ls[12].replace(" V6", " V7")])
    expected[8] = "missing_leads"
    # 9 header missing / 10 .dat missing / 11 header garbage
    _base(root, 9).with_suffix(".hea").unlink()
    expected[9] = "missing_header"
    dat(10).unlink()
    expected[10] = "unreadable"
    _base(root, 11).with_suffix(".hea").write_bytes(b"\x00\xff garbage\nnot a header\n")
    expected[11] = "unreadable"
    # 12 the header's data file escapes the data root
    _edit_header(root, 12, lambda ls: [ls[0], *[ln.replace("00012_hr.dat", "../../../../outside.dat", 1)
                                                 for ln in ls[1:]]])
    expected[12] = "path_escapes_root"
    # 13, 14 the metadata filename escapes the data root (relative and absolute)
    outside = root.parent / "outside"
    outside.mkdir()
    for ext in (".hea", ".dat"):
        shutil.copy(_base(root, 13).with_suffix(ext), outside / ("00013_hr" + ext))
    db = _db(root)
    db.loc[db["ecg_id"] == "13", "filename_hr"] = "../outside/00013_hr"
    db.loc[db["ecg_id"] == "14", "filename_hr"] = str(outside / "00013_hr")
    expected[13] = expected[14] = "path_escapes_root"
    # 15 no patient id / 16 no filename
    db.loc[db["ecg_id"] == "15", "patient_id"] = ""
    expected[15] = "missing_patient_id"
    db.loc[db["ecg_id"] == "16", "filename_hr"] = ""
    expected[16] = "missing_filename"
    db.to_csv(root / "ptbxl_database.csv", index=False)

    df, quarantine, summary = _build(root, tmp_path / "m")
    assert quarantine["reason"].to_dict() == expected
    assert quarantine["detail"].str.len().min() > 10
    assert df["ecg_id"].tolist() == [17, 18, 19, 20]
    assert summary["quarantined"] == len(expected) and summary["records"] == 4


def test_wfdb_agrees_with_the_fast_checks(root):
    data = _samples(root, 5)
    data[100:300, 7] = -32768
    _write_samples(root, 5, data)
    with pytest.raises(RecordError) as err:
        read_record(root, "records500/00000/00005_hr", 500, 5000)
    assert err.value.reason == "nan_lead"
    assert check_record(root, "records500/00000/00005_hr", 500, 5000).reason == "nan_lead"
    with pytest.raises(RecordError) as err:
        read_record(root, "../x", 500, 5000)
    assert err.value.reason == "path_escapes_root"


def test_records_are_checked_alike_in_this_thread_and_in_a_pool(root, monkeypatch):
    """Cached files are checked in this thread; a slow first batch hands the rest to threads: same flags, same
    quarantine rows in the same order either way."""
    data = _samples(root, 3)
    data[:, 2] = 7  # a flat lead
    _write_samples(root, 3, data)
    _base(root, 9).with_suffix(".dat").write_bytes(b"\0" * 10)  # truncated
    items = [(int(e), p) for e, p in zip(_db(root)["ecg_id"], _db(root)["filename_hr"], strict=True)]
    pools = []

    class Pool(record_checks.ThreadPoolExecutor):
        def __init__(self, max_workers):
            pools.append(max_workers)
            super().__init__(max_workers=max_workers)

    monkeypatch.setattr(record_checks, "ThreadPoolExecutor", Pool)
    alone = validate_records(root, items, 500, 5000)
    assert pools == []  # the probe was fast: no threads
    monkeypatch.setattr(record_checks, "PROBE_RECORDS", 5)
    monkeypatch.setattr(record_checks, "THREADS_ABOVE_S", 0.0)
    probed = validate_records(root, items, 500, 5000)
    assert len(pools) == 1 and pools[0] > 1
    assert probed == alone == validate_records(root, items, 500, 5000, workers=3)
    assert [row["reason"] for row in alone[1]] == ["flat_lead", "truncated"]


def test_header_files_outside_the_data_root_are_refused_on_every_path(root, tmp_path):
    """A crafted .hea naming ../../x, /abs/x or a symlink that leads out must not make raybench read that file."""
    import wfdb

    outside = tmp_path / "outside"
    outside.mkdir()
    rel = lambda eid: f"records500/00000/{eid:05d}_hr"  # noqa: E731
    folder = _base(root, 1).parent
    shutil.copy(_base(root, 1).with_suffix(".dat"), outside / "secret.dat")
    leads = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]
    wfdb.wrsamp("secret212", fs=500, units=["mV"] * 12, sig_name=leads, fmt=["212"] * 12, adc_gain=[200.0] * 12,
                p_signal=read_record(root, rel(2)).signal.T.astype(np.float64), baseline=[0] * 12,
                write_dir=str(outside))
    header212 = (outside / "secret212.hea").read_text()
    (folder / "link16.dat").symlink_to(outside / "secret.dat")
    (folder / "link212.dat").symlink_to(outside / "secret212.dat")
    # the direct format-16 reader: relative, absolute, and through a symlink inside the root
    for eid, name in ((1, "../../../outside/secret.dat"), (2, str(outside / "secret.dat")), (3, "link16.dat")):
        _edit_header(root, eid, lambda ls, eid=eid, name=name: [ls[0], *[ln.replace(f"{eid:05d}_hr.dat", name, 1)
                                                                         for ln in ls[1:]]])
    # the wfdb fallback (format 212): through a symlink, a relative and an absolute name
    for eid, name in ((4, "link212.dat"), (5, "../../../outside/secret212.dat"), (6, str(outside / "secret212.dat"))):
        text = header212.replace("secret212 ", f"{eid:05d}_hr ", 1).replace("secret212.dat", name)
        _base(root, eid).with_suffix(".hea").write_text(text)
        _base(root, eid).with_suffix(".dat").unlink()
    for eid in range(1, 7):
        with pytest.raises(RecordError) as err:
            read_record(root, rel(eid), 500, 5000)
        assert err.value.reason == "path_escapes_root", (eid, err.value)
        assert rel(eid) in str(err.value) and "outside the data root" in str(err.value)
        check = check_record(root, rel(eid), 500, 5000)
        assert (check.ok, check.reason) == (False, "path_escapes_root"), (eid, check)
    assert read_record(root, rel(7), 500, 5000).signal.shape == (12, 5000)  # a plain record still reads
    assert check_record(root, rel(7), 500, 5000).ok


def test_other_wfdb_formats_use_the_general_reader(root):
    import wfdb

    rec = read_record(root, "records500/00000/00001_hr", 500, 5000)
    folder = _base(root, 1).parent
    for ext in (".hea", ".dat"):
        _base(root, 1).with_suffix(ext).unlink()
    wfdb.wrsamp("00001_hr", fs=500, units=["mV"] * 12, sig_name=["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2",
                                                                 "V3", "V4", "V5", "V6"],
                p_signal=rec.signal.T.astype(np.float64), fmt=["212"] * 12, adc_gain=[200.0] * 12,
                baseline=[0] * 12, write_dir=str(folder))
    assert check_record(root, "records500/00000/00001_hr", 500, 5000).ok
    flat = rec.signal.T.astype(np.float64).copy()
    flat[:, 4] = 0.0
    wfdb.wrsamp("00001_hr", fs=500, units=["mV"] * 12, sig_name=["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2",
                                                                 "V3", "V4", "V5", "V6"],
                p_signal=flat, fmt=["212"] * 12, adc_gain=[200.0] * 12, baseline=[0] * 12, write_dir=str(folder))
    assert check_record(root, "records500/00000/00001_hr", 500, 5000).reason == "flat_lead"


def _assert_table_error(root: Path, out: Path, match: str, **kw) -> None:
    with pytest.raises(M.ManifestError, match=match):
        build_ptbxl_manifest(root, out, **kw)
    assert not (out / "manifest.parquet").exists()


def test_duplicate_ecg_id_is_an_error_naming_lines(root, tmp_path):
    db = _db(root)
    db = pd.concat([db, db.iloc[[4]]])
    db.to_csv(root / "ptbxl_database.csv", index=False)
    _assert_table_error(root, tmp_path / "m", r"duplicate ecg_id \[5\] at lines \[6, 22\]")


def test_same_ecg_listed_with_two_patients_is_refused(root, tmp_path):
    db = _db(root)
    twin = db.iloc[[2]].copy()
    twin["patient_id"] = "99999.0"
    pd.concat([db, twin]).to_csv(root / "ptbxl_database.csv", index=False)
    _assert_table_error(root, tmp_path / "m", "duplicate ecg_id")


def test_two_records_sharing_a_waveform_file_is_refused(root, tmp_path):
    db = _db(root)
    db.loc[3, "filename_hr"] = db.loc[2, "filename_hr"]
    db.to_csv(root / "ptbxl_database.csv", index=False)
    _assert_table_error(root, tmp_path / "m", "share a filename_hr")


def test_one_patient_written_two_ways_is_refused(root, tmp_path):
    db = _db(root)
    pid = db.loc[0, "patient_id"]
    same = db.index[db["patient_id"] == pid]
    assert len(same) >= 2
    db.loc[same[-1], "patient_id"] = pid.removesuffix(".0")
    db.to_csv(root / "ptbxl_database.csv", index=False)
    _assert_table_error(root, tmp_path / "m", "written in more than one way")


@pytest.mark.parametrize("content,match", [
    (b"", "cannot read"),
    (b"ecg_id,patient_id,filename_lr\n1,2.0,records100/00000/00001_lr\n", r"lacks columns \['filename_hr'\]"),
    (b"ecg_id,patient_id,filename_lr,filename_hr\nx1,2.0,a,b\n", "non-integer ecg_id"),
])
def test_unusable_metadata_csv(root, tmp_path, content, match):
    (root / "ptbxl_database.csv").write_bytes(content)
    _assert_table_error(root, tmp_path / "m", match)


def test_missing_metadata_csv(tmp_path):
    _assert_table_error(tmp_path, tmp_path / "m", "ptbxl_database.csv not found")


def test_non_numeric_concept_cells_become_missing_and_are_reported(root, tmp_path):
    path = root / "features" / "12sl_features.csv"
    t12 = pd.read_csv(path, dtype=str)
    t12.loc[t12["ecg_id"] == "3", "QRS_Dur_Global"] = "12,5"
    t12.loc[t12["ecg_id"] == "4", "R_Amp_V2"] = "abc"
    t12.loc[t12["ecg_id"] == "5", "T_Amp_I"] = ""  # a blank cell is plain missing, not an error
    t12.to_csv(path, index=False)
    df, quarantine, summary = _build(root, tmp_path / "m")
    assert len(df) == 20 and quarantine.empty
    row3 = df.set_index("ecg_id").loc[3]
    assert np.isnan(row3["raw_qrs_duration"]) and row3["qrs_duration"] == 0.0
    assert summary["bad_concept_cells"]["count"] == 2
    assert [3, "QRS_Dur_Global", "12,5"] in summary["bad_concept_cells"]["examples"]
    assert any("non-numeric concept cells" in n for n in summary["notes"])
    # the other leads still give r_amp_global for record 4
    assert np.isfinite(df.set_index("ecg_id").loc[4, "raw_r_amp_global"])


@pytest.mark.parametrize("mutate,match", [
    (lambda t: pd.concat([t, t.iloc[[0]]]), "duplicate ecg_id"),
    (lambda t: t.drop(columns=["ST_Amp_V6"]), r"lacks panel columns \['ST_Amp_V6'\]"),
    (lambda t: t.drop(columns=["ecg_id"]), "no ecg_id column"),
    (lambda t: t.assign(ecg_id=["x"] + t["ecg_id"].tolist()[1:]), "line 2 has ecg_id 'x'"),
])
def test_feature_table_problems_are_errors(root, tmp_path, mutate, match):
    path = root / "features" / "12sl_features.csv"
    mutate(pd.read_csv(path, dtype=str)).to_csv(path, index=False)
    _assert_table_error(root, tmp_path / "m", match)


def test_a_failed_rebuild_keeps_the_previous_manifest(root, tmp_path):
    out = tmp_path / "m"
    _, info = M.load_manifest(build_ptbxl_manifest(root, out))
    db = _db(root)
    pd.concat([db, db.iloc[[0]]]).to_csv(root / "ptbxl_database.csv", index=False)
    with pytest.raises(M.ManifestError):
        build_ptbxl_manifest(root, out)
    assert M.load_manifest(out)[1] == info
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_fast_format16_reader_equals_wfdb(ptbxl_sample):
    """read_record's direct int16 path gives exactly wfdb's physical signal (real PTB-XL records)."""
    import wfdb

    from raybench.cohorts.waveforms import LEADS, read_record

    for rel in ("records500/00000/00001_hr", "records100/00000/00002_lr"):
        ours = read_record(ptbxl_sample, rel).signal
        rec = wfdb.rdrecord(str(ptbxl_sample / rel))
        names = [n.upper() for n in rec.sig_name]
        ref = np.stack([rec.p_signal[:, names.index(lead.upper())] for lead in LEADS]).astype(np.float32)
        np.testing.assert_array_equal(ours, ref)


@pytest.mark.parametrize("table, message", [
    (pd.DataFrame({"ecg_id": [1], "path": ["r1"]}), r"lacks columns \['fs'\]"),
    (pd.DataFrame({"ecg_id": [4, 4, 5], "path": ["a", "b", "c"], "fs": [500.0] * 3}), r"duplicate ecg_id values \[4\]"),
])
def test_the_concept_runners_refuse_a_records_table_they_cannot_measure_before_starting_ray(table, message):
    from raybench.cohorts.waveforms import prepare_records_run

    with pytest.raises(ValueError, match=message):
        prepare_records_run(table, num_cpus=1)
