"""Issue 11, deviations 7 and 8: the published MIMIC-IV-ECG path next to raybench's options.

7. Missing concepts: `eval.missing_concepts: complete_case` (per-concept masks in coordinate selection;
   val/test, fidelity and the patient bootstrap on complete cases) vs `fill_zero`.
8. The published concept extractor vs the refined one, and the published record pool (ICD-linked,
   extraction ok, ranked), named in the manifest summary.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_mimic import SUBJECTS, write_mimic_fixture, write_mimic_record
from test_waveform_concepts import make_record

from raybench.analysis.inference.packed_stats import pack_patient_stats
from raybench.cohorts.extractor_published import measure_record_published, published_concepts
from raybench.cohorts.extractor_refined import concepts_from_points, measure_record
from raybench.cohorts.manifest import complete_case_counts, load_manifest, standardize, write_manifest
from raybench.cohorts.mimic import build_mimic_manifest
from raybench.cohorts.mimic_pool import icd_linked, selection_rank
from raybench.cohorts.mimic_tables import read_admissions, read_record_list
from raybench.cohorts.panel import WAVEFORM_CONCEPTS
from raybench.cohorts.split import mimic_split
from raybench.cohorts.waveform_concepts import measure_signal
from raybench.core.config import EvalProtocol
from raybench.core.paths import RunLayout
from raybench.encoders.store import ActivationStore
from raybench.sae.data import evaluation_test_patients, load_cell_data, missing_policy
from raybench.sae.evaluate import SplitCodes, evaluate_cell, pearson_from_sums, select_coordinates
from raybench.sae.model import Normalizer, StackedBatchTopKSAE

FS = 500.0
IN_STAY = "2180-07-23 08:44:00"  # inside every fixture admission
ADMIT, DISCH = "2180-07-20 10:00:00", "2180-07-30 12:00:00"


# ---------------------------------------------------------------- 8: the extractors


def test_published_pairing_is_by_position_not_by_beat():
    """A P onset the DWT misses on beat 0 shifts the published zip(P onsets, R onsets) by one beat."""
    sig = np.zeros((12, 2500))
    rpeaks = [500, 1000, 1500, 2000]
    waves = {"ECG_P_Onsets": [np.nan, 900, 1400, 1900], "ECG_R_Onsets": [480, 980, 1480, 1980],
             "ECG_R_Offsets": [530, 1030, 1530, 2030], "ECG_T_Offsets": [700, 1200, 1700, 2200],
             "ECG_T_Peaks": [650, 1150, 1650, 2150]}
    pub = published_concepts(sig, rpeaks, waves, FS)
    per_beat = concepts_from_points(sig, None, np.array(rpeaks), waves, FS)  # refined pairing, plain bounds
    assert math.isnan(pub["pr_interval_ms"])  # (900, 480), (1400, 980), ...: every pair has offset < onset
    assert per_beat["pr_interval_ms"] == pytest.approx(160.0)  # beat by beat: 80 samples
    assert pub["qrs_duration_ms"] == per_beat["qrs_duration_ms"] == pytest.approx(100.0)
    assert pub["qt_like_ms"] == pytest.approx(440.0) and pub["rr_mean_ms"] == pytest.approx(1000.0)
    # a missed R onset on beat 1 shifts QRS pairs: (480, 530) ok, then (1465, 1030), (1960, 1530) rejected
    shifted = dict(waves, ECG_R_Onsets=[480, np.nan, 1465, 1960])
    assert published_concepts(sig, rpeaks, shifted, FS)["qrs_duration_ms"] == pytest.approx(100.0)
    assert concepts_from_points(sig, None, np.array(rpeaks), shifted, FS)["qrs_duration_ms"] == \
        pytest.approx(130.0)  # beats 0, 2, 3: 100, 130, 140 ms


def test_published_amplitudes_are_raw_and_refined_are_baseline_referenced():
    """The documented difference on a synthetic record: a DC offset moves published amplitudes only."""
    rng = np.random.default_rng(3)
    sig, truth = make_record(rng)
    offset = 0.5
    pub, pub_off = measure_record_published(sig, FS), measure_record_published(sig + offset, FS)
    ref, ref_off = measure_record(sig, FS), measure_record(sig + offset, FS)
    for name in ("r_amp_global_mv", "st_amp_global_mv", "t_amp_global_mv"):
        assert abs(pub[name] - truth[name]) < 0.02 and abs(ref[name] - truth[name]) < 0.02
        assert pub_off[name] - pub[name] > 0.8 * offset  # raw: max |v + offset| over leads
        assert abs(ref_off[name] - ref[name]) < 0.01  # PR-segment baseline removes it
    assert pub_off["r_amp_global_mv"] - pub["r_amp_global_mv"] == pytest.approx(offset, abs=0.03)  # R: positive
    for name in ("rr_mean_ms", "qt_like_ms"):  # intervals do not see the offset in either
        assert pub_off[name] == pub[name] and ref_off[name] == ref[name]
    # published QRS: lead-II DWT bounds, wider than the template; refined: within 10 ms
    assert pub["qrs_duration_ms"] > truth["qrs_duration_ms"] + 5
    assert abs(ref["qrs_duration_ms"] - truth["qrs_duration_ms"]) < 10
    for v in pub.values():  # the published CSV kept 6 significant digits
        assert math.isnan(v) or float(f"{v:.6g}") == v
    assert measure_signal(sig, FS, "published") == pub and measure_signal(sig, FS, "refined") == ref
    with pytest.raises(ValueError, match="unknown concept extractor"):
        measure_signal(sig, FS, "vendor")


# ---------------------------------------------------------------- 8: the ICD link


def _linked_by_loop(records: pd.DataFrame, adm: pd.DataFrame) -> np.ndarray:
    """The published rule written out: some admission of the subject with admit <= t <= disch."""
    fmt = "%Y-%m-%d %H:%M:%S"
    by_subject: dict[int, list] = {}
    for s, _hadm, a, d in adm.itertuples(index=False):
        try:
            by_subject.setdefault(int(s), []).append((datetime.strptime(a, fmt), datetime.strptime(d, fmt)))
        except ValueError:
            continue
    out = []
    for s, t in zip(records["subject_id"], records["ecg_time"], strict=True):
        try:
            when = datetime.strptime(t, fmt)
        except ValueError:
            out.append(False)
            continue
        out.append(any(a <= when <= d for a, d in by_subject.get(int(s), [])))
    return np.array(out)


def test_icd_link_matches_the_published_rule(tmp_path):
    rng = np.random.default_rng(0)
    base = datetime(2180, 1, 1)

    def stamp(hours: float) -> str:
        return (base + pd.Timedelta(hours=float(hours))).strftime("%Y-%m-%d %H:%M:%S")

    adm_rows = []
    for s in range(20):
        for _ in range(rng.integers(0, 4)):  # overlapping and nested stays, some subjects with none
            a = rng.integers(0, 2000)
            adm_rows.append((s, 1000 + len(adm_rows), stamp(a), stamp(a + rng.integers(0, 400))))
    adm_rows.append((3, 9999, "not a time", stamp(10)))  # skipped, as published
    adm = pd.DataFrame(adm_rows, columns=["subject_id", "hadm_id", "admittime", "dischtime"])
    rec = pd.DataFrame({"subject_id": rng.integers(0, 22, 400), "ecg_time": [stamp(h) for h in
                                                                              rng.integers(0, 2400, 400)]})
    first = adm.iloc[0]
    rec.loc[0] = (first["subject_id"], first["dischtime"])  # both ends inclusive
    rec.loc[1] = (first["subject_id"], first["admittime"])
    rec.loc[2] = (first["subject_id"], "")  # no ecg_time: not linked
    adm.to_csv(tmp_path / "admissions.csv.gz", index=False)
    got = icd_linked(rec, read_admissions(tmp_path / "admissions.csv.gz"))
    want = _linked_by_loop(rec, adm)
    assert got.tolist() == want.tolist()
    assert got[0] and got[1] and not got[2] and 0 < got.sum() < len(rec)


# ---------------------------------------------------------------- 8: the record pool (fixture)


def _val_subjects(n: int) -> list[int]:
    return [s for s in range(10_020_000, 10_030_000) if mimic_split(s) == "val"][:n]


def write_pool_fixture(root: Path) -> dict:
    """The test_mimic fixture plus two val subjects, an ICD-unlinked study, an unlinked subject and a study
    the published extractor cannot measure (2 noise-free beats); admissions.csv.gz beside it."""
    write_mimic_fixture(root)
    rl = pd.read_csv(root / "record_list.csv", dtype=str, keep_default_na=False)
    rl["ecg_time"] = IN_STAY  # the two bad studies too: eligible, then quarantined by the record checks
    rng = np.random.default_rng(5)
    extra, study = [], 49_000_000
    for subject in _val_subjects(2):
        for _ in range(3):
            study += int(rng.integers(1000, 9000))
            rel = f"files/p{str(subject)[:4]}/p{subject}/s{study}/{study}"
            write_mimic_record(root, rel, make_record(rng)[0])
            extra.append({"subject_id": subject, "study_id": study, "file_name": study, "ecg_time": IN_STAY,
                          "path": rel})
    special = {}
    for name, subject, when, kwargs in (("unlinked_study", SUBJECTS[0], "2181-01-01 00:00:00", {}),
                                        ("unlinked_subject", 10_099_999, IN_STAY, {}),
                                        ("at_discharge", SUBJECTS[4], DISCH, {}),
                                        ("extraction_fails", SUBJECTS[6], IN_STAY, {"rr": 6.0, "noise": 0.0})):
        study += int(rng.integers(1000, 9000))
        rel = f"files/p{str(subject)[:4]}/p{subject}/s{study}/{study}"
        write_mimic_record(root, rel, make_record(rng, **kwargs)[0])
        extra.append({"subject_id": subject, "study_id": study, "file_name": study, "ecg_time": when, "path": rel})
        special[name] = study
    rl = pd.concat([rl, pd.DataFrame(extra).astype(str)], ignore_index=True)
    rl.to_csv(root / "record_list.csv", index=False)
    subjects = sorted({int(s) for s in rl["subject_id"]} - {10_099_999})
    pd.DataFrame({"subject_id": subjects, "hadm_id": [20_000_000 + i for i in range(len(subjects))],
                  "admittime": ADMIT, "dischtime": DISCH}).to_csv(root / "admissions.csv.gz", index=False)
    return special


@pytest.fixture(scope="module")
def pool(tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("mimic-pool")
    special = write_pool_fixture(root)
    out = tmp_path_factory.mktemp("pool-manifest")
    path = build_mimic_manifest(root, out, concept_extractor="published", record_pool="published",
                                admissions=root / "admissions.csv.gz")
    return root, special, path


def test_published_pool_keeps_icd_linked_extraction_ok_studies(pool):
    root, special, path = pool
    df, info = load_manifest(path)
    summary = json.loads((path.parent / "summary.json").read_text())
    q = pd.read_csv(path.parent / "quarantine.csv")
    listed = read_record_list(root)
    ids = set(df["ecg_id"])
    assert special["unlinked_study"] not in ids and special["unlinked_subject"] not in ids
    assert special["at_discharge"] in ids  # admit <= ecg_time <= disch, both ends inclusive
    assert special["extraction_fails"] not in ids
    fail = q.loc[q["ecg_id"] == special["extraction_fails"]]
    assert fail["reason"].tolist() == ["extraction_failed"] and "too_few_beats" in fail["detail"].item()
    assert sorted(q["reason"]) == ["extraction_failed", "missing_header", "truncated"]
    pool_info = summary["record_pool"]
    assert pool_info["rule"] == "published" and pool_info["icd_link"].startswith("applied")
    assert pool_info["listed"] == len(listed) and pool_info["icd_linked"] == len(listed) - 2
    assert pool_info["extraction_failed"] == 1 and pool_info["record_check_failed"] == 2
    assert pool_info["selected"] == len(df) == len(listed) - 5
    assert summary["concept_extractor"]["name"] == "published"
    assert summary["waveform_concept_failures"]["count"] == 1
    # every pooled concept value is what the published extractor gives on the stored record
    from raybench.cohorts.waveforms import read_record

    row = df.iloc[3]
    wave = read_record(root, row["path"], expect_fs=500)
    want = measure_record_published(wave.signal, wave.fs)
    got = {c: row[f"raw_{c}"] for c in WAVEFORM_CONCEPTS}
    assert all((math.isnan(want[c]) and math.isnan(got[c])) or want[c] == got[c] for c in WAVEFORM_CONCEPTS)


def test_summary_states_complete_case_counts_per_split(pool):
    _, _, path = pool
    df, _ = load_manifest(path)
    summary = json.loads((path.parent / "summary.json").read_text())
    cc = summary["complete_cases"]
    raw = df[[f"raw_{c}" for c in WAVEFORM_CONCEPTS]].to_numpy(np.float64)
    complete = np.isfinite(raw).all(axis=1)
    assert 0 < cc["records"] == int(complete.sum()) < len(df)  # pairing NaNs
    for s in ("train", "val", "test"):
        m = complete & (df["split"] == s).to_numpy()
        assert cc["splits"][s]["records"] == int(m.sum())
        assert cc["splits"][s]["patients"] == df.loc[m, "patient_id"].nunique()
        assert cc["splits"][s]["of_records"] == int((df["split"] == s).sum())
    text = (path.parent / "summary.json").read_text()  # still aggregates only
    assert not any(str(e) in text for e in df["ecg_id"]) and not any(p in text for p in df["patient_id"])


def test_published_pool_ranks_among_eligible_studies(pool, tmp_path):
    root, special, _ = pool
    listed = read_record_list(root)
    path = build_mimic_manifest(root, tmp_path / "m8", max_records=8, concept_extractor="published",
                                record_pool="published", admissions=root / "admissions.csv.gz")
    df = pd.read_parquet(path)
    q = pd.read_csv(path.parent / "quarantine.csv")
    not_eligible = {special["unlinked_study"], special["unlinked_subject"]}
    failed = set(q["ecg_id"])  # record checks + extraction failures ranked ahead of the 8th pooled study
    ranked = sorted((selection_rank(int(s)), int(s)) for s in listed["study_id"] if int(s) not in not_eligible)
    want, seen = [], set()
    for _, sid in ranked:
        if len(want) == 8:
            break
        seen.add(sid)
        if sid not in failed:
            want.append(sid)
    assert sorted(df["ecg_id"]) == sorted(want)
    assert failed <= seen and len(df) == 8
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["record_pool"]["target"] == 8 and summary["record_pool"]["examined"] == 8 + len(failed)


def test_without_admissions_the_link_is_not_applied_and_refined_is_named(pool, tmp_path):
    root, special, _ = pool
    path = build_mimic_manifest(root, tmp_path / "m4", max_records=4, concept_extractor="refined",
                                record_pool="published")
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["record_pool"]["icd_link"].startswith("not applied") and summary["record_pool"]["icd_linked"] is None
    assert any("ICD link" in n and "not applied" in n for n in summary["notes"])
    assert summary["concept_extractor"]["name"] == "refined"
    path = build_mimic_manifest(root, tmp_path / "all4", max_records=4)  # the raybench default: all, refined
    summary = json.loads((path.parent / "summary.json").read_text())
    assert summary["record_pool"]["rule"] == "all" and summary["concept_extractor"]["name"] == "refined"
    with pytest.raises(ValueError, match="record_pool"):
        build_mimic_manifest(root, tmp_path / "x", record_pool="icd")


# ---------------------------------------------------------------- 7: missing concepts (planted on the fixture)

MODEL, LAYER, D = "ecg_fm", 0, 8
PR = WAVEFORM_CONCEPTS.index("pr_interval_ms")


def _plant(df: pd.DataFrame, rng: np.random.Generator) -> tuple[pd.DataFrame, dict]:
    """Synthetic raw concepts with planted NaNs; standardized as the builder does (missing -> 0)."""
    df = df.copy()
    n = len(df)
    raw = rng.normal(size=(n, len(WAVEFORM_CONCEPTS))) * 10 + 100
    train = np.flatnonzero((df["split"] == "train").to_numpy())
    test = np.flatnonzero((df["split"] == "test").to_numpy())
    val = np.flatnonzero((df["split"] == "val").to_numpy())
    miss_train_pr = train[::3]  # selection records without a PR interval
    raw[miss_train_pr, PR] = np.nan
    test_pat = df["patient_id"].to_numpy()[test]
    gone = test[test_pat == sorted(set(test_pat))[0]]  # every record of one test patient incomplete
    raw[gone, WAVEFORM_CONCEPTS.index("qt_like_ms")] = np.nan
    raw[test[test_pat != sorted(set(test_pat))[0]][0], WAVEFORM_CONCEPTS.index("st_amp_global_mv")] = np.nan
    raw[val[0], WAVEFORM_CONCEPTS.index("t_amp_global_mv")] = np.nan
    is_train = (df["split"] == "train").to_numpy()
    for j, c in enumerate(WAVEFORM_CONCEPTS):
        df[f"raw_{c}"] = raw[:, j]
        df[c] = standardize(raw[:, j], is_train)[0]
    return df, {"miss_train_pr": df["ecg_id"].to_numpy()[miss_train_pr], "gone_patient": sorted(set(test_pat))[0]}


def _plant_acts(df: pd.DataFrame, rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Latent 0 tracks PR exactly where PR is present and is junk where it is missing; latent 1 tracks the
    0-filled PR everywhere with a little noise. Masks pick latent 0 (r = 1), filling 0 picks latent 1."""
    z = df["pr_interval_ms"].to_numpy(np.float64)  # standardized, 0 where missing
    present = np.isfinite(df["raw_pr_interval_ms"].to_numpy())
    x = rng.uniform(1.0, 2.0, size=(len(df), D))
    x[:, 0] = np.where(present, 10 + 3 * z, 10 + np.where(np.arange(len(df)) % 2, 8.0, -8.0))
    x[:, 1] = 10 + 3 * z + rng.normal(0, 0.4, len(df))
    return {int(e): x[i].astype(np.float32) for i, e in enumerate(df["ecg_id"])}


@pytest.fixture(scope="module")
def planted_run(pool, tmp_path_factory):
    root, _, path = pool
    df, info = load_manifest(path)
    rng = np.random.default_rng(2)
    df, planted = _plant(df, rng)
    run = tmp_path_factory.mktemp("planted-run")
    layout = RunLayout.at(run)
    layout.manifest_dir.mkdir(parents=True)
    digest = write_manifest(layout.manifest, df, root, list(WAVEFORM_CONCEPTS), "waveform")
    acts = _plant_acts(df, rng)
    store = ActivationStore(layout.activations_dir)
    splits = {s: df.loc[df["split"] == s, "ecg_id"].to_numpy(np.int64) for s in ("train", "val", "test")}
    with store.writer(MODEL, LAYER, n_layers=1, d=D, manifest_hash=digest, fingerprint="planted",
                      capacity={s: len(v) for s, v in splits.items()}) as w:
        for s, ids in splits.items():
            w.append(s, ids, np.stack([acts[int(e)] for e in ids]))
        w.finalize()
    return run, df, planted


def _identity_sae() -> tuple[StackedBatchTopKSAE, Normalizer]:
    """Codes = the activations themselves (W_enc = I, k = N, no centring): what is planted is what is selected."""
    sae = StackedBatchTopKSAE(1, D, D, D)
    with torch.no_grad():
        sae.W_enc.zero_()
        sae.W_enc[0].copy_(torch.eye(D))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
        sae.W_dec_t[0].copy_(torch.eye(D))
    return sae, Normalizer(np.zeros(D, np.float32), np.ones(D, np.float32))


def _evaluate(data, eval_cfg):
    sae, norm = _identity_sae()
    return evaluate_cell(sae, norm, data.acts, data.concepts, data.test_patient_codes, data.selection_idx, eval_cfg,
                         n_patients=len(data.test_patients), selection_present=data.selection_present)


def test_policy_resolution():
    assert missing_policy(EvalProtocol(), "waveform") == "complete_case"  # the published MIMIC run
    assert missing_policy(EvalProtocol(), "tables") == "fill_zero"  # the published PTB-XL+ run
    assert missing_policy(EvalProtocol(missing_concepts="fill_zero"), "waveform") == "fill_zero"
    assert missing_policy(EvalProtocol(missing_concepts="complete_case"), "tables") == "complete_case"
    with pytest.raises(ValueError, match="missing_concepts"):
        EvalProtocol(missing_concepts="drop").validate()


def test_complete_case_data_keeps_val_test_complete_cases_and_masks_selection(planted_run):
    run, df, planted = planted_run
    cc = load_cell_data(run, MODEL, LAYER, EvalProtocol())  # auto -> complete_case (waveform concepts)
    fz = load_cell_data(run, MODEL, LAYER, EvalProtocol(missing_concepts="fill_zero"))
    assert cc.missing_concepts == "complete_case" and fz.missing_concepts == "fill_zero"
    complete = np.isfinite(df[[f"raw_{c}" for c in WAVEFORM_CONCEPTS]].to_numpy()).all(axis=1)
    counts = complete_case_counts(df, WAVEFORM_CONCEPTS)
    for s in ("val", "test"):
        assert len(fz.acts[s]) == (df["split"] == s).sum()
        assert len(cc.acts[s]) == len(cc.concepts[s]) == counts["splits"][s]["records"] < len(fz.acts[s])
    assert len(cc.acts["train"]) == len(fz.acts["train"])  # selection is drawn from the whole train split
    assert np.array_equal(cc.selection_idx, fz.selection_idx)
    assert fz.selection_present is None
    train_ids = df.loc[df["split"] == "train", "ecg_id"].to_numpy()
    sel_ids = np.sort(train_ids)[cc.selection_idx]
    want = ~np.isin(sel_ids, planted["miss_train_pr"])
    assert cc.selection_present.shape == (len(sel_ids), len(WAVEFORM_CONCEPTS))
    assert np.array_equal(cc.selection_present[:, PR], want) and not want.all()
    # test patients: those with a complete-case test record (the planted patient drops out)
    assert planted["gone_patient"] in fz.test_patients and planted["gone_patient"] not in cc.test_patients
    assert len(cc.test_patients) == counts["splits"]["test"]["patients"] == len(fz.test_patients) - 1
    test_complete = df.loc[(df["split"] == "test").to_numpy() & complete]
    assert len(cc.test_patient_codes) == len(test_complete)
    manifest, info = load_manifest(RunLayout.at(run).manifest)
    assert evaluation_test_patients(manifest, info, EvalProtocol()) == cc.test_patients  # what secondary uses
    assert evaluation_test_patients(manifest, info, EvalProtocol(missing_concepts="fill_zero")) == fz.test_patients


def test_selection_masks_choose_a_different_latent(planted_run):
    run, df, _ = planted_run
    cc = load_cell_data(run, MODEL, LAYER, EvalProtocol())
    fz = load_cell_data(run, MODEL, LAYER, EvalProtocol(missing_concepts="fill_zero"))
    ev_cc, ev_fz = _evaluate(cc, EvalProtocol()), _evaluate(fz, EvalProtocol(missing_concepts="fill_zero"))
    assert ev_cc.selected[PR] == 0 and ev_fz.selected[PR] == 1
    # the masked selection r is the plain Pearson r over the selection records where PR is present
    x_sel = cc.acts["train"][cc.selection_idx].astype(np.float64)
    y_sel = cc.concepts["train"][cc.selection_idx, PR].astype(np.float64)
    keep = cc.selection_present[:, PR]
    assert np.corrcoef(x_sel[keep, 0], y_sel[keep])[0, 1] == pytest.approx(1.0, abs=1e-6)
    assert abs(np.corrcoef(x_sel[:, 0], y_sel)[0, 1]) < abs(np.corrcoef(x_sel[:, 1], y_sel)[0, 1])
    # concepts present on every selection record are selected identically under both policies
    full = cc.selection_present.all(axis=0)
    assert np.array_equal(ev_cc.selected[full], ev_fz.selected[full])


def test_masked_selection_equals_selection_on_the_present_rows():
    rng = np.random.default_rng(4)
    n, n_lat, c = 40, 12, 3
    rows, cols = np.nonzero(rng.random((n, n_lat)) < 0.4)
    vals = rng.uniform(0.1, 2.0, rows.size)
    codes = SplitCodes(n, rows, cols, vals, np.zeros(n), np.zeros(n))
    y = rng.normal(size=(n, c))
    present = rng.random((n, c)) > 0.3
    present[:, 2] = True
    sel, r = select_coordinates(codes, np.where(present, y, 0.0), n_lat, present)
    dense = np.zeros((n, n_lat))
    dense[rows, cols] = vals
    for j in range(c):
        m = present[:, j]
        sub = SplitCodes(int(m.sum()), *_subset(rows, cols, vals, m), np.zeros(m.sum()), np.zeros(m.sum()))
        want_sel, want_r = select_coordinates(sub, y[m][:, [j]], n_lat)
        assert sel[j] == want_sel[0] and r[j] == pytest.approx(want_r[0], abs=1e-12)
    plain_sel, plain_r = select_coordinates(codes, y, n_lat)
    assert sel[2] == plain_sel[2] and r[2] == plain_r[2]  # fully present: the plain sums, bit for bit


def _subset(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, keep: np.ndarray):
    new = np.cumsum(keep) - 1
    m = keep[rows]
    return new[rows[m]], cols[m], vals[m]


def test_bootstrap_statistics_use_complete_cases_only(planted_run):
    run, df, _ = planted_run
    cc = load_cell_data(run, MODEL, LAYER, EvalProtocol())
    ev = _evaluate(cc, EvalProtocol())
    test_complete = (df["split"] == "test").to_numpy() & np.isfinite(
        df[[f"raw_{c}" for c in WAVEFORM_CONCEPTS]].to_numpy()).all(axis=1)
    assert ev.patient_n.sum() == test_complete.sum() and ev.patient_n.shape == (len(cc.test_patients),)
    assert (ev.patient_n > 0).all()  # no patient without a complete-case record is drawn
    # per-patient sums are those of the complete-case test records
    a = cc.acts["test"][:, ev.selected].astype(np.float64)
    y = cc.concepts["test"].astype(np.float64)
    by_patient = np.zeros((len(cc.test_patients), y.shape[1]))
    np.add.at(by_patient, cc.test_patient_codes, a * y)
    assert np.allclose(ev.patient_corr[:, :, 4], by_patient)
    ids = df.loc[test_complete, "ecg_id"].to_numpy()
    y_direct = df.set_index("ecg_id").loc[ids, list(WAVEFORM_CONCEPTS)].to_numpy(np.float64)
    assert np.allclose(np.sort(y_direct, axis=0), np.sort(y, axis=0))
    # the packed bootstrap statistics: complete-case patients, and point r = the cell's test r
    stats = pack_patient_stats([("cell", ev.patient_stats())], ["cell"], len(WAVEFORM_CONCEPTS), 0.2)
    assert stats.n_patients == len(cc.test_patients)
    assert np.allclose(stats.point_r[0], ev.r_test, atol=1e-9)
    direct = [pearson_from_sums(len(a), a[:, j].sum(), y[:, j].sum(), (a[:, j] ** 2).sum(), (y[:, j] ** 2).sum(),
                                (a[:, j] * y[:, j]).sum()) for j in range(y.shape[1])]
    assert np.allclose(ev.r_test, direct, atol=1e-9)
    fz = _evaluate(load_cell_data(run, MODEL, LAYER, EvalProtocol(missing_concepts="fill_zero")),
                   replace(EvalProtocol(), missing_concepts="fill_zero"))
    assert fz.patient_n.sum() == (df["split"] == "test").sum() > ev.patient_n.sum()


def test_secondary_data_under_complete_cases_draws_the_subset_among_complete_train_records(planted_run):
    """Calibration and intervention (SecondaryConfig.complete_case_train, the published rule): train is cut to
    complete cases and the selection subset drawn among them; False keeps the atlas's data (docs/protocol.md §9.6)."""
    from raybench.sae.data import complete_case_selection_ecg_ids, load_secondary_data, selection_ecg_ids

    run, df, planted = planted_run
    ev = EvalProtocol(selection_records=8)  # fewer than the complete-case train records: a real draw
    manifest, _ = load_manifest(RunLayout.at(run).manifest)
    complete = np.isfinite(df[[f"raw_{c}" for c in WAVEFORM_CONCEPTS]].to_numpy()).all(axis=1)
    train = (df["split"] == "train").to_numpy()
    assert (train & complete).sum() > 8 and (train & ~complete).any()
    sec = load_secondary_data(run, MODEL, LAYER, ev, True)
    np.testing.assert_array_equal(sec.ecg_ids["train"], np.sort(df.loc[train & complete, "ecg_id"].to_numpy()))
    assert len(sec.acts["train"]) == len(sec.concepts["train"]) == (train & complete).sum()
    want = complete_case_selection_ecg_ids(manifest, WAVEFORM_CONCEPTS, ev)
    np.testing.assert_array_equal(sec.ecg_ids["train"][sec.selection_idx], want)
    assert len(want) == 8 and sec.selection_present is None
    assert not np.array_equal(want, selection_ecg_ids(manifest, ev))  # the atlas subset is another draw
    atlas = load_secondary_data(run, MODEL, LAYER, ev, False)
    plain = load_cell_data(run, MODEL, LAYER, ev)
    np.testing.assert_array_equal(atlas.selection_idx, plain.selection_idx)
    assert len(atlas.acts["train"]) == train.sum()
    for s in ("val", "test"):  # complete cases either way
        np.testing.assert_array_equal(sec.ecg_ids[s], plain.ecg_ids[s])
