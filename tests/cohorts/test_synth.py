"""Synthetic cohort: PTB-XL shape, determinism, planted defects, and concepts that shape the waveform."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.signal import find_peaks

from raybench.cohorts.panel import WAVEFORM_CONCEPTS, concept_names
from raybench.cohorts.synth import DEFECTS, PTBXL_COLUMNS, ensure_synth_cohort, generate_synth_cohort
from raybench.cohorts.waveforms import LEADS, read_record

SAMPLE_HEADER = Path(__file__).resolve().parents[3] / "shared" / "ptbxl-sample" / "ptbxl_database.csv"


@pytest.fixture(scope="module")
def cohort(tmp_path_factory) -> Path:
    return generate_synth_cohort(tmp_path_factory.mktemp("synth") / "c", n_records=60, n_patients=20, seed=11,
                                 bad_fraction=0.1)


def test_layout_and_database_columns(cohort):
    for name in ("ptbxl_database.csv", "ground_truth.csv", "features/12sl_features.csv",
                 "features/ecgdeli_features.csv", "params.json"):
        assert (cohort / name).is_file(), name
    db = pd.read_csv(cohort / "ptbxl_database.csv", dtype=str, keep_default_na=False)
    assert tuple(db.columns) == PTBXL_COLUMNS and len(PTBXL_COLUMNS) == 28
    if SAMPLE_HEADER.exists():
        with SAMPLE_HEADER.open() as fh:
            assert tuple(next(csv.reader(fh))) == PTBXL_COLUMNS
    assert db["ecg_id"].tolist() == [str(i) for i in range(1, 61)]
    assert all(p.endswith(".0") for p in db["patient_id"])
    assert db["patient_id"].nunique() == 20
    assert db.groupby("patient_id").size().max() >= 3  # several records per patient
    assert db["site"].nunique() >= 2 and db["device"].nunique() >= 2
    assert db["filename_hr"].iloc[0] == "records500/00000/00001_hr"
    assert db["filename_lr"].iloc[0] == "records100/00000/00001_lr"


def test_records_read_back_at_both_rates_with_real_lead_names(cohort):
    header = (cohort / "records500/00000/00002_hr.hea").read_text().splitlines()
    assert header[0] == "00002_hr 12 500 5000"
    assert [line.split()[-1] for line in header[1:]] == ["I", "II", "III", "AVR", "AVL", "AVF",
                                                        "V1", "V2", "V3", "V4", "V5", "V6"]
    gt = pd.read_csv(cohort / "ground_truth.csv", keep_default_na=False)
    good = gt.loc[gt["planted_defect"] == "", "ecg_id"].tolist()
    for eid in good[:5]:
        hr = read_record(cohort, f"records500/00000/{eid:05d}_hr", 500, 5000)
        lr = read_record(cohort, f"records100/00000/{eid:05d}_lr", 100, 1000)
        assert hr.signal.shape == (12, 5000) and lr.signal.shape == (12, 1000)
        # the same continuous signal: 100 Hz samples track every 5th 500 Hz sample (noise differs only)
        assert np.abs(hr.signal[:, ::5] - lr.signal).max() < 0.01


def test_ground_truth_columns_and_planted_defects(cohort):
    gt = pd.read_csv(cohort / "ground_truth.csv", keep_default_na=False)
    assert list(gt.columns) == ["ecg_id", "planted_defect", *concept_names(), *WAVEFORM_CONCEPTS]
    defects = gt["planted_defect"][gt["planted_defect"] != ""]
    assert len(defects) == 6  # round(0.1 * 60)
    assert set(defects) == set(DEFECTS)


def test_ground_truth_is_internally_consistent(cohort):
    gt = pd.read_csv(cohort / "ground_truth.csv")
    rr_s = gt["rr_mean"] / 1000.0
    np.testing.assert_allclose(gt["hr_ventricular"], 60000.0 / gt["rr_mean"])
    np.testing.assert_allclose(gt["qtc_bazett"], gt["qt_interval"] / np.sqrt(rr_s))
    np.testing.assert_allclose(gt["qtc_fridericia"], gt["qt_interval"] / np.cbrt(rr_s))
    np.testing.assert_allclose(gt["qtc_framingham"], gt["qt_interval"] + 154 * (1 - rr_s))
    np.testing.assert_allclose(gt["qrs_duration"], gt["qrs_duration_ms"])
    np.testing.assert_allclose(gt["qt_interval"], gt["qt_like_ms"])
    assert gt["hr_ventricular"].between(40, 130).all()
    assert gt["qrs_duration"].between(70, 140).all()
    assert gt["pr_interval"].dropna().between(120, 220).all()
    no_p = gt["p_found"] == 0
    assert gt.loc[no_p, ["pr_interval", "pr_interval_ms", "hr_atrial"]].isna().all().all()
    assert (gt.loc[~no_p, "pr_interval"] == gt.loc[~no_p, "pr_interval_ms"]).all()
    # RR median (waveform) and mean (table) agree closely for low beat-to-beat jitter
    assert (np.abs(gt["rr_mean_ms"] - gt["rr_mean"]) < 0.1 * gt["rr_mean"]).all()


def test_concepts_shape_the_waveform(cohort):
    """Measured on the written 500 Hz signal: RR, R amplitude and per-lead R amplitudes follow the truth."""
    gt = pd.read_csv(cohort / "ground_truth.csv", keep_default_na=False).set_index("ecg_id")
    t12 = pd.read_csv(cohort / "features/12sl_features.csv").set_index("ecg_id")
    good = gt.index[gt["planted_defect"] == ""]
    rr_meas, r_meas, lead_corr = [], [], []
    for eid in good:
        sig = read_record(cohort, f"records500/{(eid // 1000) * 1000:05d}/{eid:05d}_hr", 500, 5000).signal
        energy = np.abs(np.diff(sig, axis=1)).sum(0)
        peaks, _ = find_peaks(energy, distance=150, height=0.5 * np.percentile(energy, 99.5))
        # R peak = the sample of largest |value| within 20 ms of the slope burst
        r_idx = np.array([p - 10 + np.abs(sig[:, max(p - 10, 0):p + 10]).max(0).argmax() for p in peaks])
        r_idx = r_idx[(r_idx > 0) & (r_idx < 4999)]
        rr_meas.append(np.median(np.diff(peaks)) * 2.0)
        r_meas.append(np.median(np.abs(sig[:, r_idx]).max(0)))
        table_r = t12.loc[eid, [f"R_Amp_{lead}" for lead in LEADS]].to_numpy(float) / 1000.0
        lead_corr.append(np.corrcoef(table_r, np.median(sig[:, r_idx], axis=1))[0, 1])
    rr_meas, r_meas = np.array(rr_meas), np.array(r_meas)
    np.testing.assert_allclose(rr_meas, gt.loc[good, "rr_mean_ms"].astype(float), rtol=0.02)  # the RR criterion
    truth_r = gt.loc[good, "r_amp_global_mv"].astype(float).to_numpy()
    assert np.corrcoef(r_meas, truth_r)[0, 1] > 0.95
    assert np.abs(r_meas - truth_r).max() < 0.3  # noise + baseline wander only
    assert np.median(lead_corr) > 0.9


def test_deterministic_for_a_seed(tmp_path):
    def digest(folder: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(folder.rglob("*")):
            if f.is_file():
                h.update(str(f.relative_to(folder)).encode())
                h.update(f.read_bytes())
        return h.hexdigest()

    a = generate_synth_cohort(tmp_path / "a", 8, 3, seed=5, bad_fraction=0.25)
    b = generate_synth_cohort(tmp_path / "b", 8, 3, seed=5, bad_fraction=0.25)
    c = generate_synth_cohort(tmp_path / "c", 8, 3, seed=6, bad_fraction=0.25)
    assert digest(a) == digest(b)
    assert digest(a) != digest(c)


def test_ensure_reuses_a_matching_cohort_and_rejects_bad_arguments(tmp_path):
    path = ensure_synth_cohort(tmp_path / "c", 4, 2, seed=1)
    stamp = (path / "ground_truth.csv").stat().st_mtime_ns
    assert ensure_synth_cohort(tmp_path / "c", 4, 2, seed=1) == path
    assert (path / "ground_truth.csv").stat().st_mtime_ns == stamp
    ensure_synth_cohort(tmp_path / "c", 5, 2, seed=1)  # different arguments: regenerated
    assert len(pd.read_csv(path / "ptbxl_database.csv")) == 5
    with pytest.raises(ValueError, match="n_patients"):
        generate_synth_cohort(tmp_path / "x", 2, 3, seed=1)
    with pytest.raises(ValueError, match="bad_fraction"):
        generate_synth_cohort(tmp_path / "x", 4, 2, seed=1, bad_fraction=0.6)
    assert not (tmp_path / "x").exists()


def test_refuses_to_replace_a_folder_that_is_not_a_synthetic_cohort(tmp_path, monkeypatch):
    """--out DIR used to rmtree DIR: a user's folder (or `--out .`) lost everything but the new cohort."""
    from click.testing import CliRunner

    from raybench.app.cli import main

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("years of work")
    with pytest.raises(FileExistsError, match=r"mine.*not a synthetic cohort") as err:
        generate_synth_cohort(mine, 4, 2, seed=1)
    assert "empty" in str(err.value) and "delete" in str(err.value)  # says how to fix it
    (mine / "params.json").write_text('{"learning_rate": 0.1}')  # someone else's params.json is no marker
    with pytest.raises(FileExistsError, match="not a synthetic cohort"):
        ensure_synth_cohort(mine, 4, 2, seed=1)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "params.json"]
    monkeypatch.chdir(mine)
    result = CliRunner().invoke(main, ["cohort", "synth", "--out", ".", "--records", "4", "--patients", "2"])
    assert result.exit_code != 0 and "not a synthetic cohort" in result.output, result.output
    assert (mine / "notes.txt").read_text() == "years of work"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]  # no temp folder left beside it
    # `--out .` in an empty folder would replace the working directory itself
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    result = CliRunner().invoke(main, ["cohort", "synth", "--out", ".", "--records", "4", "--patients", "2"])
    assert result.exit_code != 0 and "current directory" in result.output, result.output
    assert empty.is_dir() and not list(empty.iterdir())
    # a file where the folder should be
    (tmp_path / "afile").write_text("x")
    with pytest.raises(FileExistsError, match="not a folder"):
        generate_synth_cohort(tmp_path / "afile", 4, 2, seed=1)
    assert (tmp_path / "afile").read_text() == "x"
    # an empty folder and a previous synthetic cohort are (re)generated as before
    monkeypatch.chdir(tmp_path)
    assert generate_synth_cohort(empty, 4, 2, seed=1) == empty
    assert generate_synth_cohort(Path("empty"), 5, 2, seed=1) == Path("empty")
    assert len(pd.read_csv(empty / "ptbxl_database.csv")) == 5
    result = CliRunner().invoke(main, ["cohort", "synth", "--out", "empty", "--records", "6", "--patients", "2"])
    assert result.exit_code == 0, result.output
    assert len(pd.read_csv(empty / "ptbxl_database.csv")) == 6


def test_drawn_qrs_amplitudes_and_exact_qrs_extent():
    """Q/S table values are what the beat shows; every lead's QRS deflection spans exactly [0, QRS_Dur]."""
    from raybench.cohorts.synth_beats import beat_waves, drawn_qrs_amplitudes

    q, s = drawn_qrs_amplitudes(np.array([0.0, -0.5, -0.2]), np.array([1.0, 0.0, 1.0]), np.array([-0.3, 0.0, 0.0]),
                                np.zeros(3))
    assert q[0] == 0.0 and s[0] == pytest.approx(-0.3)  # no q; S peak overlaps nothing
    assert q[1] == pytest.approx(-0.5, abs=1e-4)  # q alone: the planted amplitude
    assert -0.2 < q[2] < -0.05  # a q under an R upstroke: visible, shallower than planted
    d, pr, qt, t_dur = 100.0, 160.0, 400.0, 150.0
    start = np.array([-pr, 0.0, 0.0, 0.42 * d, qt - t_dur])
    dur = np.array([100.0, 0.25 * d, 0.62 * d, 0.58 * d, t_dur])
    t = np.arange(-pr - 5, qt + 5, 0.25)
    waves = beat_waves(t, start, dur, d, qt)  # [6, T]: P Q R S T ST
    qrs = np.abs(waves[1:4]).sum(0)
    inside = t[qrs > 1e-9]
    assert inside.min() == pytest.approx(0.0, abs=0.5) and inside.max() == pytest.approx(d, abs=0.5)
    # R alone (no q) and S alone (no ST) already span the extent: any lead with an R and an S shows it
    assert t[waves[2] > 1e-9].min() == pytest.approx(0.0, abs=0.5)
    assert t[waves[3] > 1e-9].max() == pytest.approx(d, abs=0.5)
    assert t[waves[0] > 1e-9].min() == pytest.approx(-pr, abs=0.5)  # PR = P onset -> QRS onset
    assert t[(waves[4] + waves[5]) > 1e-9].max() == pytest.approx(qt, abs=0.5)  # QT = QRS onset -> T end
