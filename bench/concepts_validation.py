"""Check the waveform49 measurements against references no part of raybench's measurement wrote.

    python bench/concepts_validation.py [--synth-records 1500] [--real PTBXL_FOLDER ...] [--boot 2000]

(a) synthetic: each of the 49 concepts measured on a generated synthetic cohort (`raybench cohort synth`,
    as Ray tasks through the waveform49 manifest builder) against the generator's ground truth
    (ground_truth.csv, `raybench.cohorts.synth_truth`): Pearson r and median absolute error in the concept's
    unit (axes compared on the circle), and r of the absolute values (a concept's signed lead-group extreme
    flips sign when two leads of opposite sign are nearly equal; r_of_abs shows whether that is all).
    Goal: r >= 0.9 for every RATE_RHYTHM, INTERVAL, AXIS and AMPLITUDE concept.
(b) real: PTB-XL records (records500) against the statements cardiologists wrote in ptbxl_database.csv
    (scp_codes, heart_axis): AUC of one measured concept separating a statement's records from the
    comparison group, with a percentile interval from a bootstrap that resamples each group, for waveform49
    and beside it for the seven-concept extractors (refined, published) where they measure the concept.
    Goal: AUC >= 0.9 for the interval, rate, rhythm and axis pairs.
(c) speed: the manifest build's records/s (Ray tasks, --cpus), its tasks' records per CPU-second (what a
    loaded machine does not change), and one process's records/s.
A folder that is absent is skipped with a line saying so.
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.extractor_rules import ConceptError
from raybench.cohorts.panel import concept_names, family_of
from raybench.cohorts.waveform49.beats import record_beats
from raybench.cohorts.waveform49.delineation import delineate
from raybench.cohorts.waveform49.measures import concepts49, per_lead
from raybench.cohorts.waveform_concepts import measure_signal
from raybench.cohorts.waveforms import LEADS, read_record

GOAL_FAMILIES = ("RATE_RHYTHM", "INTERVAL", "AXIS", "AMPLITUDE")
UNITS = {"RATE_RHYTHM": "bpm|ms|0/1", "INTERVAL": "ms", "AXIS": "deg", "AMPLITUDE": "uV|uV*ms", "ST_T": "uV|uV*ms|ms"}
# (label, concept, positive statements, comparison, sign: +1 higher = positive, goal applies)
PAIRS: tuple[tuple[str, str, tuple[str, ...], str, int, bool], ...] = (
    ("CLBBB vs NORM", "qrs_duration", ("CLBBB",), "NORM", 1, True),
    ("CRBBB vs NORM", "qrs_duration", ("CRBBB",), "NORM", 1, True),
    ("1AVB vs NORM", "pr_interval", ("1AVB",), "NORM", 1, True),
    ("SBRAD vs NORM", "hr_ventricular", ("SBRAD",), "NORM", -1, True),
    ("STACH vs NORM", "hr_ventricular", ("STACH",), "NORM", 1, True),
    ("axis LAD/ALAD vs MID", "qrs_axis_front", ("LAD", "ALAD"), "MID", -1, True),
    ("axis AXR/ARAD vs MID", "qrs_axis_front", ("AXR", "ARAD"), "MID", 1, True),
    ("AFIB vs NORM", "rr_iqr", ("AFIB",), "NORM", 1, True),
    ("AFIB vs NORM", "p_found", ("AFIB",), "NORM", -1, True),
    ("LVH vs NORM", "sokolow_lyon", ("LVH",), "NORM", 1, False),
    ("STD_/ISC_ vs NORM", "st_amp_global", ("STD_", "ISC_"), "NORM", -1, False),
    ("INVT/LOWT vs NORM", "t_amp_global", ("INVT", "LOWT"), "NORM", -1, False),
    ("LNGQT vs NORM", "qtc_bazett", ("LNGQT",), "NORM", 1, False),
)
# the seven-concept extractors' stand-in for a waveform49 concept and its sign (None: the pair's); their ST and T
# amplitudes are magnitudes (largest |value| over the leads), so a larger ST and a smaller T point to the statement
SEVEN: dict[str, tuple[str, int | None]] = {
    "qrs_duration": ("qrs_duration_ms", None), "pr_interval": ("pr_interval_ms", None), "hr_ventricular": ("hr", None),
    "st_amp_global": ("st_amp_global_mv", 1), "t_amp_global": ("t_amp_global_mv", -1),
    "qtc_bazett": ("qtc_bazett", None)}


def auc(pos: np.ndarray, neg: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counting one half (Mann-Whitney)."""
    pos, neg = np.asarray(pos, float), np.asarray(neg, float)
    if pos.size == 0 or neg.size == 0:
        return math.nan
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (pos.size * neg.size))


def auc_interval(pos: np.ndarray, neg: np.ndarray, boot: int, seed: int) -> tuple[float, float]:
    """2.5 / 97.5 percentiles of the AUC over `boot` draws resampling each group with replacement."""
    if pos.size == 0 or neg.size == 0 or boot < 1:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    draws = [auc(rng.choice(pos, pos.size), rng.choice(neg, neg.size)) for _ in range(boot)]
    lo, hi = np.percentile(draws, [2.5, 97.5])
    return float(lo), float(hi)


def circular(measured: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Measured angles moved by whole turns to lie within 180 degrees of the truth."""
    return truth + np.mod(measured - truth + 180.0, 360.0) - 180.0


def synth_table(cohort: Path, manifest: Path, cpus: int) -> tuple[pd.DataFrame, dict]:
    """(a): build the waveform49 manifest (timed) and compare its raw concepts with ground_truth.csv."""
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.core.config import ResourceConfig
    from raybench.infra.ray_session import init_ray

    t0 = time.perf_counter()
    init_ray(ResourceConfig(num_cpus=cpus))  # started once per run by `raybench grid`: timed apart
    ray_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    build_synth_manifest(cohort, manifest, concepts="waveform49", num_cpus=cpus)
    build_s = time.perf_counter() - t0
    df, _ = load_manifest(manifest / "manifest.parquet")
    truth = pd.read_csv(cohort / "ground_truth.csv").set_index("ecg_id").reindex(df["ecg_id"])
    rows = []
    for name in concept_names():
        got, want = df[f"raw_{name}"].to_numpy(float), truth[name].to_numpy(float)
        if family_of(name) == "AXIS" and name != "qrst_angle":
            got = circular(got, want)
        ok = np.isfinite(got) & np.isfinite(want)
        r, r_abs = _pearson(got[ok], want[ok]), _pearson(np.abs(got[ok]), np.abs(want[ok]))
        fam = family_of(name)
        rows.append({"concept": name, "family": fam, "n": int(ok.sum()), "r": r, "r_of_abs": r_abs,
                     "median_abs_err": float(np.median(np.abs(got[ok] - want[ok]))) if ok.any() else math.nan,
                     "median_err": float(np.median(got[ok] - want[ok])) if ok.any() else math.nan,
                     "unit": UNITS[fam], "goal": "r>=0.9" if fam in GOAL_FAMILIES else "-",
                     "meets": (r >= 0.9) if fam in GOAL_FAMILIES else None})
    cpu = json.loads((manifest / "summary.json").read_text())["waveform49_cpu"]
    speed = {"records": int(len(df)), "manifest_s": build_s, "records_per_s": len(df) / build_s, "cpus": cpus,
             "ray_start_s": ray_s, "records_per_cpu_s": cpu["records_per_cpu_s"]}
    return pd.DataFrame(rows), speed


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1]) if a.size > 2 and np.std(a) > 0 and np.std(b) > 0 else math.nan


def _statements(db: pd.DataFrame) -> list[set[str]]:
    out = []
    for codes, axis in zip(db["scp_codes"], db["heart_axis"].fillna(""), strict=True):
        found = set(ast.literal_eval(codes)) if isinstance(codes, str) and codes.strip() else set()
        if str(axis).strip():
            found.add(str(axis).strip())
        out.append(found)
    return out


def measure_real(folder: Path, limit: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Every record of one PTB-XL folder (the first `limit`): waveform49 + Sokolow-Lyon, both seven-concept
    extractors."""
    db = pd.read_csv(folder / "ptbxl_database.csv")
    db = db.head(limit) if limit else db
    rows, times = [], {"waveform49": 0.0, "refined": 0.0, "published": 0.0}
    v1, v5, v6 = LEADS.index("V1"), LEADS.index("V5"), LEADS.index("V6")
    for ecg_id, rel, stm in zip(db["ecg_id"], db["filename_hr"], _statements(db), strict=True):
        wave = read_record(folder, rel)
        row: dict = {"ecg_id": int(ecg_id), "statements": stm}
        t0 = time.perf_counter()
        try:
            beats = record_beats(wave.signal.astype(np.float64), wave.fs)
            d = delineate(beats)
            row.update(concepts49(beats, d)[0])
            lead = per_lead(beats, d)
            row["sokolow_lyon"] = float(-lead["S_Amp"][v1] + max(lead["R_Amp"][v5], lead["R_Amp"][v6]))
        except ConceptError:
            pass
        times["waveform49"] += time.perf_counter() - t0
        for ext in ("refined", "published"):
            t0 = time.perf_counter()
            try:
                seven = measure_signal(wave.signal, wave.fs, ext)
            except ConceptError:
                seven = {}
            times[ext] += time.perf_counter() - t0
            rr = seven.get("rr_mean_ms", math.nan)
            seven["hr"] = 60000.0 / rr if rr and rr > 0 else math.nan
            seven["qtc_bazett"] = seven.get("qt_like_ms", math.nan) / math.sqrt(rr / 1000.0) if rr > 0 else math.nan
            row.update({f"{ext}:{k}": v for k, v in seven.items()})
        rows.append(row)
    speed = {k: len(rows) / v for k, v in times.items() if v > 0}
    return pd.DataFrame(rows), speed


def real_table(df: pd.DataFrame, boot: int, seed: int) -> pd.DataFrame:
    """(b): one row per pair: n, AUC [interval] for waveform49 and the seven-concept extractors."""
    rows = []
    for k, (label, concept, positives, negative, sign, goal) in enumerate(PAIRS):
        is_pos = df["statements"].map(lambda s, p=positives: bool(s & set(p))).to_numpy()
        is_neg = df["statements"].map(lambda s, n=negative: n in s).to_numpy() & ~is_pos
        row = {"pair": label, "concept": concept, "goal": "AUC>=0.9" if goal else "-"}
        seven, seven_sign = SEVEN.get(concept, ("", None))
        for tag, col, sgn in (("waveform49", concept, sign), ("refined", f"refined:{seven}", seven_sign or sign),
                              ("published", f"published:{seven}", seven_sign or sign)):
            if col not in df or (tag != "waveform49" and not seven):
                row[tag] = "n/a"
                continue
            score = sgn * df[col].to_numpy(float)
            ok = np.isfinite(score)
            pos, neg = score[is_pos & ok], score[is_neg & ok]
            a = auc(pos, neg)
            lo, hi = auc_interval(pos, neg, boot, seed + k)
            n = f"n={pos.size}/{neg.size}"
            row[tag] = f"{a:.2f} [{lo:.2f}, {hi:.2f}] {n}" if pos.size else n
            if tag == "waveform49":
                row["auc"], row["meets"] = a, (a >= 0.9) if goal and pos.size else None
        rows.append(row)
    return pd.DataFrame(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--synth-records", type=int, default=1500)
    ap.add_argument("--synth-patients", type=int, default=500)
    ap.add_argument("--real", type=Path, action="append", default=None,
                    help="PTB-XL folder(s) with statements (default: $RAYBENCH_PTBXL_VALIDATION when set)")
    ap.add_argument("--real-records", type=int, default=None, help="only the first N records of each folder")
    ap.add_argument("--boot", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpus", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None, help="also write every figure here")
    args = ap.parse_args()
    pd.set_option("display.width", 250)
    pd.set_option("display.max_columns", 20)
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    print(f"cpu: {cpu}; cpus={os.cpu_count()}; load_avg_1min={os.getloadavg()[0]:.1f}")
    report: dict = {"cpu": cpu}
    if args.synth_records > 0:
        from raybench.cohorts.synth import generate_synth_cohort

        with tempfile.TemporaryDirectory() as tmp:
            cohort = generate_synth_cohort(Path(tmp) / "cohort", args.synth_records,
                                           min(args.synth_patients, args.synth_records), seed=7)
            table, speed = synth_table(cohort, Path(tmp) / "manifest", args.cpus)
        short = table[table["meets"] == False]  # noqa: E712 (None: no goal)
        print(f"\n(a) synthetic: {speed['records']} records vs the generator's ground truth")
        print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
        print(f"short of r >= 0.9: {', '.join(short['concept']) or 'none'}")
        print(f"\n(c) speed: waveform49 manifest of {speed['records']} records in {speed['manifest_s']:.1f} s = "
              f"{speed['records_per_s']:.0f} records/s (Ray tasks, {args.cpus} CPUs, incl. reading and the manifest; "
              f"Ray itself started in {speed['ray_start_s']:.1f} s before); the tasks' CPU time: "
              f"{speed['records_per_cpu_s']:.0f} records per CPU-second, i.e. "
              f"{speed['records'] / (args.cpus * speed['records_per_cpu_s']):.1f} s of measurement on {args.cpus} "
              f"idle cores")
        report["synth"], report["speed_manifest"] = table.to_dict("records"), speed
    default = os.environ.get("RAYBENCH_PTBXL_VALIDATION")
    if not args.real and not default:
        print("\n(b) real: no PTB-XL folder given (--real DIR or RAYBENCH_PTBXL_VALIDATION); skipped")
    for folder in args.real or ([Path(default)] if default else []):
        if not (folder / "ptbxl_database.csv").exists():
            print(f"\n(b) real: {folder} absent; skipped")
            continue
        measured, speed = measure_real(folder, args.real_records)
        table = real_table(measured, args.boot, args.seed)
        print(f"\n(b) real: {len(measured)} records of {folder.name} vs the cardiologists' statements "
              f"(AUC [95% bootstrap interval, {args.boot} draws] n=positives/comparison)")
        print(table.drop(columns=["auc", "meets"]).to_string(index=False))
        short = table[table["meets"] == False]  # noqa: E712
        print(f"short of AUC >= 0.9: {', '.join(short['pair'] + ' ' + short['concept']) or 'none'}")
        print("(c) speed, one process incl. reading: " + ", ".join(f"{k} {v:.0f} records/s" for k, v in speed.items()))
        report[f"real:{folder.name}"] = {"table": table.to_dict("records"), "records_per_s": speed}
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
