"""MIMIC-IV-ECG reader: published layout parses, subject-level split rule, manifest format, quarantine."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from test_waveform_concepts import make_record  # every test folder is on sys.path (tests/conftest.py)

from raybench.cohorts.manifest import BASE_COLUMNS, ManifestError, load_manifest
from raybench.cohorts.mimic import build_mimic_manifest
from raybench.cohorts.mimic_pool import select_studies, selection_rank
from raybench.cohorts.mimic_tables import MM_COLUMNS, read_machine_measurements, read_record_list
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.waveforms import LEADS, read_record

MIMIC_HEADER_LEADS = ["I", "II", "III", "aVR", "aVF", "aVL", "V1", "V2", "V3", "V4", "V5", "V6"]
SUBJECTS = [10000032, 10001217, 10002428, 10003046, 10004235, 10005348, 10006053, 10007795, 10009035, 10010471,
            10011398, 10012853]
STUDIES_PER_SUBJECT = [1, 3, 2, 1, 4, 2, 1, 3, 2, 1, 2, 4]  # 26 studies, several subjects with many


def write_mimic_record(root: Path, rel: str, signal_mv: np.ndarray) -> None:
    """WFDB the way MIMIC-IV-ECG ships it: format 16, 200 adu/mV, header leads in MIMIC order."""
    import wfdb

    base = root / rel
    base.parent.mkdir(parents=True, exist_ok=True)
    order = [LEADS.index(name) for name in MIMIC_HEADER_LEADS]
    wfdb.wrsamp(base.name, fs=500, units=["mV"] * 12, sig_name=MIMIC_HEADER_LEADS,
                p_signal=signal_mv[order].T.astype(np.float64), fmt=["16"] * 12, adc_gain=[200.0] * 12,
                baseline=[0] * 12, write_dir=str(base.parent))


def write_mimic_fixture(root: Path, seed: int = 11) -> dict[int, dict]:
    """A small MIMIC-IV-ECG-shaped folder; returns {study_id: ground truth + signal} for good studies."""
    rng = np.random.default_rng(seed)
    rows, mm_rows, truth = [], [], {}
    study = 40000000
    for subject, n_studies in zip(SUBJECTS, STUDIES_PER_SUBJECT, strict=True):
        for _ in range(n_studies):
            study += int(rng.integers(1000, 90000))
            rel = f"files/p{str(subject)[:4]}/p{subject}/s{study}/{study}"
            rows.append({"subject_id": subject, "study_id": study, "file_name": study,
                         "ecg_time": "2180-07-23 08:44:00", "path": rel})
            sig, t = make_record(rng)
            write_mimic_record(root, rel, sig)
            truth[study] = {**t, "signal": sig}
            qrs_on = 40 + t["pr_interval_ms"]
            mm_rows.append({"subject_id": subject, "study_id": study, "cart_id": f"68{subject % 7}",
                            "ecg_time": "2180-07-23 08:44:00", "report_0": "Sinus rhythm", "bandwidth": "0.005-150 Hz",
                            "filtering": "60 Hz notch Baseline filter", "rr_interval": round(t["rr_mean_ms"]),
                            "p_onset": 40, "p_end": 40 + 100, "qrs_onset": round(qrs_on),
                            "qrs_end": round(qrs_on + t["qrs_duration_ms"]), "t_end": round(qrs_on + t["qt_like_ms"]),
                            "p_axis": 60, "qrs_axis": 30, "t_axis": 40})
    mm_rows[0].update(p_onset=29999, p_axis=29999)  # the machine's "not measured" code
    # two bad studies: a truncated .dat and a study whose files are absent
    bad_subject = SUBJECTS[1]
    trunc, absent = study + 11, study + 22
    rel = f"files/p1000/p{bad_subject}/s{trunc}/{trunc}"
    write_mimic_record(root, rel, make_record(rng)[0])
    dat = (root / rel).with_suffix(".dat")
    dat.write_bytes(dat.read_bytes()[:5000])
    rows.append({"subject_id": bad_subject, "study_id": trunc, "file_name": trunc, "ecg_time": "", "path": rel})
    rows.append({"subject_id": bad_subject, "study_id": absent, "file_name": absent, "ecg_time": "",
                 "path": f"files/p1000/p{bad_subject}/s{absent}/{absent}"})
    pd.DataFrame(rows).to_csv(root / "record_list.csv", index=False)
    pd.DataFrame(mm_rows).to_csv(root / "machine_measurements.csv", index=False)
    return truth


def _expected_split(subject_id: int) -> str:
    bucket = int.from_bytes(hashlib.sha256(f"external-head-v1:{subject_id}".encode()).digest()[:8], "big") % 10
    return "train" if bucket <= 6 else "val" if bucket == 7 else "test"


@pytest.fixture(scope="module")
def mimic_root(tmp_path_factory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("mimic-iv-ecg")
    return root, write_mimic_fixture(root)


@pytest.fixture(scope="module")
def built(mimic_root, ray_cluster, tmp_path_factory) -> tuple[Path, pd.DataFrame]:
    root, _ = mimic_root
    out = tmp_path_factory.mktemp("manifest")
    path = build_mimic_manifest(root, out)
    return path, pd.read_parquet(path)


def test_layout_parses(mimic_root):
    root, truth = mimic_root
    rl = read_record_list(root)
    assert len(rl) == sum(STUDIES_PER_SUBJECT) + 2
    assert rl["subject_id"].dtype == np.int64 and rl["study_id"].dtype == np.int64
    assert rl["subject_id"].value_counts().max() >= 4  # several studies per subject
    mm = read_machine_measurements(root)
    assert [f"mm_{c}" for c in MM_COLUMNS] == [c for c in mm.columns if c.startswith("mm_")]
    first = rl["study_id"].iloc[0]
    assert np.isnan(mm.loc[first, "mm_p_onset"]) and np.isnan(mm.loc[first, "mm_p_axis"])
    assert mm.loc[first, "mm_qrs_onset"] > 0
    # header lead order I II III aVR aVF aVL ... comes back in LEADS order
    sid = rl["study_id"].iloc[3]
    wave = read_record(root, rl.loc[rl["study_id"] == sid, "path"].item(), expect_fs=500, expect_samples=5000)
    assert np.allclose(wave.signal, truth[sid]["signal"], atol=0.006)  # 5 uV quantization


def test_split_rule_matches_the_published_formula():
    from raybench.cohorts.split import mimic_split

    for subject in SUBJECTS + list(range(10_000_000, 10_000_200)):
        assert mimic_split(subject) == _expected_split(subject)
    counts = pd.Series([mimic_split(s) for s in range(10_000_000, 10_002_000)]).value_counts(normalize=True)
    assert abs(counts["train"] - 0.7) < 0.04 and abs(counts["val"] - 0.1) < 0.03


def test_manifest_format(built, mimic_root):
    path, df = built
    root, truth = mimic_root
    expected = list(BASE_COLUMNS) + [f"raw_{c}" for c in WAVEFORM_CONCEPTS] + list(WAVEFORM_CONCEPTS)
    assert list(df.columns[: len(expected)]) == expected
    assert [c for c in df.columns[len(expected):]] == ["record_order"] + [f"mm_{c}" for c in MM_COLUMNS]
    assert df["ecg_id"].dtype == np.int64 and df["ecg_id"].is_monotonic_increasing and df["ecg_id"].is_unique
    # record_order: the published records.csv order, ascending sha256("mimic-main-v1:" + study_id) (issue 42)
    ranked = sorted(df["ecg_id"], key=lambda s: selection_rank(int(s)))
    assert df.sort_values("record_order")["ecg_id"].tolist() == ranked
    assert sorted(df["record_order"]) == list(range(len(df))) and ranked != sorted(ranked)
    assert df["patient_id"].map(type).eq(str).all()
    for c in WAVEFORM_CONCEPTS:
        assert df[f"raw_{c}"].dtype == np.float64 and df[c].dtype == np.float32
    assert set(df["ecg_id"]) == set(truth)  # the two bad studies are quarantined
    assert (df["site"] == "BIDMC").all() and df["device"].str.startswith("68").all()
    assert (df["fs"] == 500).all() and (df["n_samples"] == 5000).all()
    meta = pq.read_schema(path).metadata
    assert json.loads(meta[b"raybench.concepts"]) == list(WAVEFORM_CONCEPTS)
    assert meta[b"raybench.concept_source"] == b"waveform"
    assert Path(meta[b"raybench.root"].decode()) == root.resolve()
    loaded, info = load_manifest(path)  # stored hash matches the content
    assert info.manifest_hash == meta[b"raybench.manifest_hash"].decode()


def test_splits_follow_the_rule_and_are_patient_disjoint(built):
    _, df = built
    assert (df["split"] == df["patient_id"].astype(int).map(_expected_split)).all()
    assert df.groupby("patient_id")["split"].nunique().max() == 1
    assert df["patient_id"].nunique() == len(SUBJECTS)


def test_concepts_are_measured_and_standardized_on_train(built, mimic_root):
    _, df = built
    _, truth = mimic_root
    t = pd.DataFrame.from_dict({k: {c: v[c] for c in WAVEFORM_CONCEPTS} for k, v in truth.items()}, orient="index")
    t = t.loc[df["ecg_id"]]
    rr_ok = (df["raw_rr_mean_ms"].to_numpy() - t["rr_mean_ms"].to_numpy()) / t["rr_mean_ms"].to_numpy()
    qrs_err = df["raw_qrs_duration_ms"].to_numpy() - t["qrs_duration_ms"].to_numpy()
    # the 90% / 20 ms recovery criterion is test_waveform_concepts'; here: concepts reach the manifest
    assert (np.abs(rr_ok) <= 0.02).mean() >= 0.9 and (np.abs(qrs_err) <= 20).mean() >= 0.8
    train = df["split"] == "train"
    for c in WAVEFORM_CONCEPTS:
        raw = df.loc[train, f"raw_{c}"]
        mean, std = raw.mean(), max(raw.std(ddof=0), 1e-6)
        z = ((df[f"raw_{c}"] - mean) / std).fillna(0.0).to_numpy(np.float32)
        assert np.allclose(df[c].to_numpy(), z, atol=1e-4)
    # machine measurements kept raw, for cross-checking only
    mm = df.set_index("ecg_id")["mm_rr_interval"]
    assert np.allclose(mm.to_numpy(), np.round(t["rr_mean_ms"].to_numpy()))


def test_quarantine_and_summary(built, mimic_root):
    path, df = built
    q = pd.read_csv(path.parent / "quarantine.csv")
    assert list(q.columns) == ["ecg_id", "path", "reason", "detail"]
    assert sorted(q["reason"]) == ["missing_header", "truncated"]
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["records"] == len(df) == sum(STUDIES_PER_SUBJECT)
    assert summary["records_listed"] == sum(STUDIES_PER_SUBJECT) + 2 and summary["quarantined"] == 2
    assert summary["concept_source"] == "waveform"
    assert sum(v["records"] for v in summary["splits"].values()) == len(df)
    assert summary["machine_agreement"]["rr_mean_ms"]["median_abs_diff"] < 10
    # aggregates only: no study or subject id appears in the exportable summary
    text = (path.parent / "summary.json").read_text()
    assert not any(str(e) in text for e in df["ecg_id"]) and not any(p in text for p in df["patient_id"])


def test_max_records_takes_the_protocol_ranking(mimic_root, ray_cluster, tmp_path):
    root, _ = mimic_root
    rl = read_record_list(root)
    chosen = select_studies(rl, 6)
    ranks = rl["study_id"].map(selection_rank)
    assert set(chosen["study_id"]) == set(rl.loc[ranks.nsmallest(6).index, "study_id"])
    path = build_mimic_manifest(root, tmp_path / "m6", max_records=6)
    df = pd.read_parquet(path)
    q = pd.read_csv(path.parent / "quarantine.csv")
    assert set(df["ecg_id"]) | set(q["ecg_id"]) == set(chosen["study_id"])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda rl: pd.concat([rl, rl.iloc[[0]]]), "duplicate study_id"),
        (lambda rl: rl.assign(subject_id=rl["subject_id"].astype(str).str.replace("10000032", "1e7", regex=False)),
         "non-integer subject_id"),
        (lambda rl: rl.drop(columns=["path"]), "lacks columns"),
        (lambda rl: rl.assign(path=rl["path"].iloc[0]), "share a path"),
    ],
)
def test_table_problems_raise(tmp_path, edit, message):
    rl = pd.DataFrame({"subject_id": [10000032, 10001217], "study_id": [40689238, 40689239],
                       "file_name": [40689238, 40689239], "ecg_time": ["", ""],
                       "path": ["files/p1000/p10000032/s40689238/40689238",
                                "files/p1000/p10001217/s40689239/40689239"]})
    edit(rl).to_csv(tmp_path / "record_list.csv", index=False)
    with pytest.raises(ManifestError, match=message):
        read_record_list(tmp_path)


def test_missing_record_list_names_the_fix(tmp_path):
    with pytest.raises(ManifestError, match="record_list.csv"):
        build_mimic_manifest(tmp_path, tmp_path / "out")


def test_published_rate_concept_is_heart_rate_from_rr(built, mimic_root, tmp_path):
    """cohort.rate_concept heart_rate_bpm (the published MIMIC run's, the paper preset's): 60000 / RR in rr_mean_ms's
    place, RATE_RHYTHM, standardized on train like every concept; the other six concepts are unchanged."""
    from raybench.cohorts.panel import concept_families, heart_rate_bpm, mimic_concepts
    from raybench.core.config import CohortConfig

    assert CohortConfig().rate_concept == "heart_rate_bpm"
    _, rr = built
    root, _ = mimic_root
    path = build_mimic_manifest(root, tmp_path / "hr", rate_concept="heart_rate_bpm")
    hr = pd.read_parquet(path)
    names = list(mimic_concepts("heart_rate_bpm"))
    assert names == ["heart_rate_bpm", *WAVEFORM_CONCEPTS[1:]] and "raw_rr_mean_ms" not in hr
    assert json.loads(pq.read_schema(path).metadata[b"raybench.concepts"]) == names
    assert concept_families(names)[0] == "RATE_RHYTHM"
    np.testing.assert_allclose(hr["raw_heart_rate_bpm"], 60000.0 / rr["raw_rr_mean_ms"], rtol=1e-12)
    train = hr["split"] == "train"
    raw = hr.loc[train, "raw_heart_rate_bpm"]
    z = ((hr["raw_heart_rate_bpm"] - raw.mean()) / raw.std(ddof=0)).fillna(0.0).to_numpy(np.float32)
    assert np.allclose(hr["heart_rate_bpm"].to_numpy(), z, atol=1e-4)
    for c in WAVEFORM_CONCEPTS[1:]:
        pd.testing.assert_series_equal(hr[c], rr[c])
    np.testing.assert_array_equal(heart_rate_bpm(np.array([500.0, 0.0, -3.0, np.nan])), [120.0, np.nan, np.nan, np.nan])
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["machine_agreement"]["heart_rate_bpm"]["median_abs_diff"] < 3
