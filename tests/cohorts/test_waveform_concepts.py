"""Waveform-derived concepts: recovery of known intervals/amplitudes, failure reasons, Ray extraction."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.cohorts.extractor_refined import (
    beat_baseline,
    beat_points,
    global_abs,
    measure_record,
    qrs_bounds,
    r_apex,
    spatial_slope,
)
from raybench.cohorts.extractor_rules import ConceptError
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.waveform_concepts import extract_concepts
from raybench.cohorts.waveforms import LEADS

FS = 500.0
# per-lead gains of the (P, QRS, ST, T) components: aVR inverted, V1 mostly negative QRS, ST largest in V1-V3
GAINS = np.array([
    [0.6, 0.7, 0.5, 0.7], [1.0, 1.0, 1.0, 1.0], [0.4, 0.3, 0.5, 0.3], [-0.8, -0.85, -0.7, -0.8],
    [0.1, 0.2, 0.0, 0.2], [0.7, 0.65, 0.8, 0.65], [0.3, -0.6, 1.2, -0.2], [0.3, -0.3, 1.5, 0.9],
    [0.3, 0.6, 1.0, 1.1], [0.3, 1.3, 0.6, 1.0], [0.3, 1.2, 0.3, 0.8], [0.3, 0.9, 0.2, 0.6],
])


def _bump(t: np.ndarray, start: float, dur: float, amp: float) -> np.ndarray:
    x = (t - start) / dur
    return np.where((x >= 0) & (x <= 1), amp * 0.5 * (1 - np.cos(2 * np.pi * x)), 0.0)


def _plateau(t: np.ndarray, start: float, stop: float, rise: float, fall: float, amp: float) -> np.ndarray:
    y = np.zeros_like(t)
    up = (t >= start) & (t < start + rise)
    y[up] = 0.5 * (1 - np.cos(np.pi * (t[up] - start) / rise))
    y[(t >= start + rise) & (t <= stop - fall)] = 1.0
    down = (t > stop - fall) & (t <= stop)
    y[down] = 0.5 * (1 + np.cos(np.pi * (t[down] - (stop - fall)) / fall))
    return amp * y


def _components(t, pr, qrs, qt, r_amp, t_amp, p_amp, st):
    """(P, QRS, ST, T) of one beat, QRS onset at t = 0 s; every wave has an exact onset and end."""
    p = _bump(t, -pr, min(0.11, 0.55 * pr), p_amp)
    q = (_bump(t, 0, 0.2 * qrs, -0.1 * r_amp) + _bump(t, 0.2 * qrs, 0.55 * qrs, r_amp)
         + _bump(t, 0.75 * qrs, 0.25 * qrs, -0.25 * r_amp))
    t_dur = 0.45 * qt
    s = _plateau(t, qrs, qt - 0.2 * t_dur, 0.04, 0.5 * t_dur, st)
    return p, q, s, _bump(t, qt - t_dur, t_dur, t_amp)


def make_record(rng: np.random.Generator, seconds: float = 10.0, fs: float = FS, noise: float = 0.005,
                wander: float = 0.0, **fixed: float) -> tuple[np.ndarray, dict[str, float]]:
    """A [12, T] mV record of identical P-QRS-T beats and its ground truth (same names as the concepts).

    Intervals are the template's by construction; amplitudes are the largest |value| across leads of
    the noiseless template at the R peak, 60 ms after the QRS end and at the T peak (0 baseline).
    """
    rr = fixed.get("rr", rng.uniform(0.55, 1.25))
    pr = fixed.get("pr", rng.uniform(0.12, 0.22))
    qrs = fixed.get("qrs", rng.uniform(0.07, 0.14))
    qt = fixed.get("qt", min(rng.uniform(0.33, 0.45), 0.62 * rr))
    params = dict(pr=pr, qrs=qrs, qt=qt, r_amp=fixed.get("r_amp", rng.uniform(0.6, 1.6)),
                  t_amp=fixed.get("t_amp", rng.uniform(0.15, 0.45)), p_amp=fixed.get("p_amp", rng.uniform(0.08, 0.2)),
                  st=fixed.get("st", rng.uniform(-0.1, 0.15)))
    t = np.arange(int(seconds * fs)) / fs
    sig = np.zeros((12, t.size))
    for onset in np.arange(pr + 0.1, seconds - 0.05, rr):
        for k, comp in enumerate(_components(t - onset, **params)):
            sig += GAINS[:, k:k + 1] * comp[None, :]
    at = np.array([0.475 * qrs, qrs + 0.06, qt - 0.225 * qt])  # R peak, ST point, T peak
    comps = _components(at, **params)
    vals = np.abs(sum(GAINS[:, k:k + 1] * comps[k][None, :] for k in range(4)))
    truth = dict(rr_mean_ms=rr * 1000, qrs_duration_ms=qrs * 1000, pr_interval_ms=pr * 1000, qt_like_ms=qt * 1000,
                 r_amp_global_mv=float(vals[:, 0].max()), st_amp_global_mv=float(vals[:, 1].max()),
                 t_amp_global_mv=float(vals[:, 2].max()))
    sig += rng.normal(0.0, noise, sig.shape)
    if wander:
        sig += wander * np.sin(2 * np.pi * 0.25 * t + rng.uniform(0, 2 * np.pi))[None, :] * rng.uniform(0.5, 1, (12, 1))
    return sig.astype(np.float32), truth


def write_wfdb(folder: Path, name: str, signal: np.ndarray, fs: float = FS, lead_names: list[str] | None = None,
               order: list[int] | None = None) -> None:
    """Write a [12, T] mV signal as WFDB (format 16, 1 uV resolution); `order` picks channels for the header."""
    import wfdb

    folder.mkdir(parents=True, exist_ok=True)
    order = order if order is not None else list(range(12))
    names = lead_names if lead_names is not None else [LEADS[i] for i in order]
    wfdb.wrsamp(name, fs=fs, units=["mV"] * 12, sig_name=names, p_signal=signal[order].T.astype(np.float64),
                fmt=["16"] * 12, adc_gain=[1000.0] * 12, baseline=[0] * 12, write_dir=str(folder))


# ---- pure helpers ---------------------------------------------------------------------------------


def test_point_pads_front_when_neurokit_dropped_sample_zero():
    assert np.array_equal(beat_points({"k": [5.0, 9.0]}, "k", 3), np.array([np.nan, 5.0, 9.0]), equal_nan=True)
    assert np.array_equal(beat_points({}, "k", 2), np.array([np.nan, np.nan]), equal_nan=True)
    assert beat_points({"k": [1.0, 2.0, 3.0]}, "k", 2).tolist() == [1.0, 2.0]


def test_qrs_bounds_take_the_slope_cluster_around_r():
    fs = 1000.0
    mag = np.zeros(600)
    mag[200:250] = 1.0  # QRS upstroke ...
    mag[256:300] = 0.8  # ... and downstroke, after a 6 ms gap at the R apex (bridged)
    mag[100:140] = 0.2  # a P wave: significant, but 60 ms away from the QRS
    mag[340:400] = 0.3  # an ST/T slope 40 ms after the QRS end
    mag[150] = 0.9  # a single noisy sample is never a bound
    assert qrs_bounds(mag, r=253, lo_limit=0, hi_limit=600, fs=fs) == (200.0, 300.0)
    # limits (halfway to the neighbouring beats) and the search window bound the result
    assert qrs_bounds(mag, r=253, lo_limit=220, hi_limit=600, fs=fs) == (220.0, 300.0)
    assert all(math.isnan(v) for v in qrs_bounds(np.zeros(600), r=253, lo_limit=0, hi_limit=600, fs=fs))


def test_spatial_slope_sees_an_end_that_lead_ii_does_not_show():
    """Global QRS: lead II ends with its R; V1's terminal S (to 100 ms) sets the end, as in 12SL."""
    fs = 500.0
    t = np.arange(500) / fs * 1000.0  # ms

    def hann(start: float, dur: float) -> np.ndarray:
        x = (t - start) / dur
        return np.where((x > 0) & (x < 1), 0.5 * (1 - np.cos(2 * np.pi * x)), 0.0)

    sig = np.zeros((12, t.size))
    sig[LEADS.index("II")] = 1.2 * hann(400, 60)  # QRS 400..460 ms in lead II only
    sig[LEADS.index("V1")] = 0.2 * hann(400, 60) - 1.0 * hann(440, 60)  # rS: ends at 500 ms
    on, off = qrs_bounds(spatial_slope(sig, fs), r=215, lo_limit=0, hi_limit=500, fs=fs)
    assert abs(on * 2 - 400) <= 6 and abs(off * 2 - 500) <= 6


def test_r_apex_is_lead_ii_positive_peak_within_the_qrs():
    lead = np.zeros(100)
    lead[40:45] = [0.05, 0.1, 0.15, 0.1, 0.05]  # small r (apex 42) ...
    lead[45:60] = -0.8  # ... then a deep S where a detector may have marked the beat
    assert r_apex(lead, 0.0, r=50, on=38.0, off=62.0) == 42
    assert r_apex(-np.abs(lead), 0.0, r=50, on=38.0, off=62.0) == 50  # QS complex: keep the detector's
    assert r_apex(lead, 0.0, r=50, on=math.nan, off=62.0) == 50


def test_baseline_and_global_abs_use_pr_segment():
    fs = 1000.0
    sig = np.zeros((12, 400))
    sig[:, :] = np.arange(12)[:, None] * 0.1  # per-lead offsets
    sig[3, 200] = -2.0  # the largest deviation, negative, in lead aVR
    base = beat_baseline(sig, r=200, qrs_on=180.0, fs=fs)  # window 150..174 ms
    assert np.allclose(base, np.arange(12) * 0.1)
    assert global_abs(sig, base, 200.0) == pytest.approx(2.3)
    assert math.isnan(global_abs(sig, base, 400.0))
    assert math.isnan(global_abs(sig, base, math.nan))


# ---- recovery on generated clean records ----------------------------------------------------------


def _errors(n: int, seed: int, **kw) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        sig, truth = make_record(rng, **kw)
        got = measure_record(sig, FS)
        rows.append({**{f"{k}_err": got[k] - v for k, v in truth.items()}, **{k: v for k, v in truth.items()}})
    return pd.DataFrame(rows)


def test_recovers_known_intervals_and_amplitudes():
    err = _errors(24, seed=1)
    qrs_ok = err["qrs_duration_ms_err"].abs() <= 20
    rr_ok = err["rr_mean_ms_err"].abs() <= 0.02 * err["rr_mean_ms"]
    assert qrs_ok.mean() >= 0.9 and rr_ok.mean() >= 0.9, err
    # the other intervals: P onset and T end of smooth waves are ambiguous by ~10-25 ms
    assert (err["pr_interval_ms_err"].abs() <= 25).mean() >= 0.9
    assert (err["qt_like_ms_err"].abs() <= 40).mean() >= 0.85
    for amp in ("r_amp_global_mv", "st_amp_global_mv", "t_amp_global_mv"):
        assert (err[f"{amp}_err"].abs() <= 0.05).mean() >= 0.9, (amp, err[f"{amp}_err"].describe())


def test_amplitudes_are_relative_to_the_isoelectric_level():
    rng = np.random.default_rng(3)
    sig, truth = make_record(rng, noise=0.0, st=0.12)
    plain = measure_record(sig, FS)
    shifted = measure_record(sig + np.linspace(-0.4, 0.6, 12, dtype=np.float32)[:, None], FS)
    for name in ("r_amp_global_mv", "st_amp_global_mv", "t_amp_global_mv"):
        assert shifted[name] == pytest.approx(plain[name], abs=1e-4)
        assert plain[name] == pytest.approx(truth[name], abs=0.03)
    wander = _errors(10, seed=4, wander=0.15)
    assert (wander["st_amp_global_mv_err"].abs() <= 0.05).mean() >= 0.9


def test_plain_dwt_overestimates_narrow_qrs_and_refinement_fixes_it():
    rng = np.random.default_rng(5)
    sig, truth = make_record(rng, qrs=0.072, rr=0.9)
    dwt = measure_record(sig, FS, refine_qrs=False)["qrs_duration_ms"]
    refined = measure_record(sig, FS)["qrs_duration_ms"]
    assert dwt - truth["qrs_duration_ms"] > 20  # the wavelet kernel's width floor (module doc)
    assert abs(refined - truth["qrs_duration_ms"]) <= 20


def test_rate_is_independent_of_sampling_rate():
    rng = np.random.default_rng(6)
    sig, truth = make_record(rng, fs=250.0, rr=0.75)
    got = measure_record(sig, 250.0)
    assert got["rr_mean_ms"] == pytest.approx(truth["rr_mean_ms"], rel=0.02)
    assert abs(got["qrs_duration_ms"] - truth["qrs_duration_ms"]) <= 24  # one 4 ms sample more slack


# ---- failures --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("signal", "fs", "reason"),
    [
        (np.zeros((8, 5000)), FS, "bad_shape"),
        (np.full((12, 5000), np.nan), FS, "nan_signal"),
        (np.ones((12, 500)), FS, "too_short"),
        (np.ones((12, 5000)), FS, "flat_lead_ii"),
    ],
)
def test_unusable_signals_raise_reasons(signal, fs, reason):
    with pytest.raises(ConceptError) as info:
        measure_record(signal, fs)
    assert info.value.reason == reason


def test_too_few_beats_is_a_reason_not_a_crash():
    sig = np.zeros((12, 5000), dtype=np.float32)
    sig[:, 2500:2510] = 1.0  # one blip
    with pytest.raises(ConceptError) as info:
        measure_record(sig, FS)
    assert info.value.reason in ("too_few_beats", "peak_detection_failed")


# ---- Ray extraction over WFDB files ----------------------------------------------------------------


def test_extract_concepts_over_files(tmp_path, ray_cluster):
    rng = np.random.default_rng(7)
    truths, rows = {}, []
    for i in range(6):
        sig, truth = make_record(rng)
        write_wfdb(tmp_path / "rec", f"r{i}", sig)
        truths[100 + i] = truth
        rows.append((100 + i, f"rec/r{i}", FS))
    (tmp_path / "rec" / "broken.hea").write_text("broken 12 500 5000\n")  # header without signals
    write_wfdb(tmp_path / "rec", "flat", np.zeros((12, 5000), dtype=np.float32) + 0.1)
    rows += [(200, "rec/broken", FS), (201, "rec/missing", FS), (202, "rec/r0", 100.0), (203, "rec/flat", FS),
             (204, "../outside", FS)]
    records = pd.DataFrame(rows, columns=["ecg_id", "path", "fs"])
    table, failures = extract_concepts(tmp_path, records, num_cpus=2, chunk_size=3)
    assert list(table.columns) == list(WAVEFORM_CONCEPTS)
    assert table.index.tolist() == records["ecg_id"].tolist()
    reasons = dict(zip(failures["ecg_id"], failures["reason"], strict=True))
    assert set(reasons) == {200, 201, 202, 203, 204}
    assert reasons[201] == "missing_header" and reasons[202] == "rate_mismatch"
    assert reasons[203] == "flat_lead" and reasons[204] == "path_escapes_root"
    assert table.loc[list(reasons)].isna().all().all()
    for ecg_id, truth in truths.items():
        assert table.loc[ecg_id, "rr_mean_ms"] == pytest.approx(truth["rr_mean_ms"], rel=0.02)
        assert abs(table.loc[ecg_id, "qrs_duration_ms"] - truth["qrs_duration_ms"]) <= 20
    # same numbers as measuring in-process
    from raybench.cohorts.waveforms import read_record

    direct = measure_record(read_record(tmp_path, "rec/r1").signal, FS)
    assert table.loc[101].to_dict() == pytest.approx(direct, nan_ok=True)


def test_extract_concepts_rejects_duplicate_ids(tmp_path, ray_cluster):
    records = pd.DataFrame({"ecg_id": [1, 1], "path": ["a", "b"], "fs": [FS, FS]})
    with pytest.raises(ValueError, match="duplicate ecg_id"):
        extract_concepts(tmp_path, records)


@pytest.mark.slow
def test_real_ptbxl_sample(ptbxl_sample, ray_cluster):
    meta = pd.read_csv(ptbxl_sample / "ptbxl_database.csv")
    records = pd.DataFrame({"ecg_id": meta["ecg_id"].astype("int64"), "path": meta["filename_hr"], "fs": FS})
    table, failures = extract_concepts(ptbxl_sample, records)
    assert len(table) == len(records)
    rr = table["rr_mean_ms"]
    assert rr.between(250, 2500).mean() >= 0.9, failures
    # every record without a rate is either listed with a reason or a partial measurement
    assert failures["reason"].str.len().gt(0).all()
    assert set(failures["ecg_id"]) <= set(table.index[table.isna().all(axis=1)])
    plausible = table.dropna()
    assert plausible["qrs_duration_ms"].between(40, 220).all()
    assert plausible["r_amp_global_mv"].between(0.05, 10).all()


@pytest.mark.slow
def test_synth_cohort_ground_truth(tmp_path, ray_cluster):
    """The issue's criterion on a synthetic cohort: QRS within 20 ms and RR within 2% for >= 90% of clean
    records. The generator's waves have exact onsets/ends (compact support) and its QRS extent is global
    (earliest onset to latest end over the 12 leads), which the 12-lead slope bounds recover.

    Measured (80 records, seed 5): QRS 98% within 20 ms (median error +1 ms), RR 99% within 2%,
    PR 95% within 20 ms, R amplitude 98% and ST amplitude 99% within 0.05 mV; T amplitude 71% and QT
    73% within 30 ms (lead-II DWT T delineation misses inverted/ST-depressed T waves).
    """
    from raybench.cohorts.synth import generate_synth_cohort

    cohort = generate_synth_cohort(tmp_path / "synth", n_records=40, n_patients=20, seed=5)
    db = pd.read_csv(cohort / "ptbxl_database.csv")
    truth = pd.read_csv(cohort / "ground_truth.csv").set_index("ecg_id")[list(WAVEFORM_CONCEPTS)]
    records = pd.DataFrame({"ecg_id": db["ecg_id"], "path": db["filename_hr"], "fs": FS})
    table, failures = extract_concepts(cohort, records)
    # neurokit's DWT occasionally raises on a record (seen: 1 of 40, "cannot convert float NaN to integer");
    # such a record is reported with a reason and counts as a miss below
    assert len(failures) <= 2 and failures["reason"].str.len().gt(0).all(), failures
    truth = truth.loc[table.index]
    err = table - truth
    # unmeasured counts as a miss
    assert (err["qrs_duration_ms"].abs() <= 20).mean() >= 0.9, err["qrs_duration_ms"].describe()
    assert (err["rr_mean_ms"].abs() <= 0.02 * truth["rr_mean_ms"]).mean() >= 0.9
    assert abs(err["qrs_duration_ms"].median()) <= 5  # no systematic offset
    has_p = truth["pr_interval_ms"].notna()
    assert (err.loc[has_p, "pr_interval_ms"].abs() <= 20).mean() >= 0.85
    assert (err["r_amp_global_mv"].abs() <= 0.05).mean() >= 0.9
    assert (err["st_amp_global_mv"].abs() <= 0.05).mean() >= 0.9
    assert (err["t_amp_global_mv"].abs() <= 0.05).mean() >= 0.6
    assert (err["qt_like_ms"].abs() <= 40).mean() >= 0.6


def test_a_long_record_is_measured_on_the_central_window_the_encoders_see(tmp_path):
    """(ecg_id, path, fs, window, record_samples) rows: a wfdb cohort's 30 s record measured on its central 10 s."""
    from raybench.cohorts.waveform_concepts import measure_rows, measure_signal
    from raybench.cohorts.waveforms import read_record
    from tests.cohorts.wfdb_folders import ecg, write_dat_record

    sig = ecg(30, 500, seed=4)
    sig[:, :7500] *= 3.0  # the first 15 s differ: a whole-record measurement would see them
    write_dat_record(tmp_path, "long", sig, 500)
    values, failures = measure_rows(str(tmp_path), [(1, "long", 500.0, 5000, 15000)])
    assert failures == []
    window = read_record(tmp_path, "long").signal[:, 5000:10000]
    assert values[0][1] == measure_signal(window, 500.0)
    _, whole = measure_rows(str(tmp_path), [(2, "long", 500.0, 5000, None)])
    assert whole[0][1] == "length_mismatch"
