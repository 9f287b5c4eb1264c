"""The synthetic cohort in the PhysioNet/CinC Challenge layout: `.mat` signals and `.hea` headers with `#Dx`.

`raybench cohort synth --layout challenge` writes the PTB-XL-shaped synthetic cohort (raybench.cohorts.synth)
and converts each 500 Hz record into the layout of the 2020/2021 Challenge collections, which a `wfdb` cohort
reads (docs/protocol.md §2.7): `g<k>/E<ecg_id>.mat` (a MATLAB 4 matrix `val`, int16 [12, T], read by WFDB as
format 16 behind a 24-byte offset) and `.hea` whose signal lines name the `.mat`, whose comments give `#Age`,
`#Sex`, `#Dx` (SNOMED-CT codes of the record's statements) and, beyond the Challenge's keys, `#Patient`, `#Site`,
`#Device` and `#Recording_date`, so patients come from `cohort.patient_key: Patient` and the provenance audit
finds site and device. Planted defects (`bad_fraction`) travel with the samples. `ground_truth.csv` keeps the
generator's truth with a `record` column (the record's path) beside ecg_id.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.diagnostics import parse_codes, record_superclasses
from raybench.core.atomic import atomic_dir

MAT_OFFSET = 24  # MATLAB 4 header (5 int32) + the name "val\0"
# statement -> SNOMED-CT code written in #Dx (the inverse of raybench.cohorts.wfdb_headers.DX_SUPERCLASS for the
# superclasses, plus the rhythm codes the synthetic cohort uses)
DX_CODE = {"NORM": "426783006", "AFIB": "164889003", "MI": "164865005", "STTC": "164934002", "CD": "698252002",
           "HYP": "164873001"}
LAYOUT_MARKER = "challenge"


def write_mat(path: Path, digital: np.ndarray) -> None:
    """digital [T, n_sig] int16 -> a MATLAB 4 file holding `val` [n_sig, T] (column-major: sample-interleaved)."""
    t, n_sig = digital.shape
    head = np.array([30, n_sig, t, 0, 4], dtype="<i4").tobytes() + b"val\x00"  # 30: int16, little-endian
    path.write_bytes(head + np.ascontiguousarray(digital, dtype="<i2").tobytes())


def challenge_header(name: str, fs: float, n_samples: int, digital: np.ndarray, leads: tuple[str, ...],
                     gain: float, comments: dict[str, str]) -> str:
    """The `.hea` of a Challenge record whose samples `digital` [T, n_sig] sit in `<name>.mat`."""
    lines = [f"{name} {len(leads)} {fs:g} {n_samples}"]
    checks = digital.astype(np.int64).sum(0) % 65536 if digital.size else np.zeros(len(leads), np.int64)
    for k, lead in enumerate(leads):
        first = int(digital[0, k]) if len(digital) else 0
        lines.append(f"{name}.mat 16+{MAT_OFFSET} {gain:g}/mV 16 0 {first} {int(checks[k])} 0 {lead}")
    lines += [f"#{key}: {value}" for key, value in comments.items()]
    return "\n".join(lines) + "\n"


def write_challenge_record(folder: Path, name: str, digital: np.ndarray, fs: float, leads: tuple[str, ...],
                           comments: dict[str, str], gain: float = 1000.0, n_samples: int | None = None) -> Path:
    """Write `<folder>/<name>.mat` + `.hea`; n_samples: what the header claims (default: the samples written)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_mat(folder / f"{name}.mat", digital)
    claimed = len(digital) if n_samples is None else n_samples
    (folder / f"{name}.hea").write_text(challenge_header(name, fs, claimed, digital, leads, gain, comments))
    return folder / name


def dx_of(scp_codes: str, classes: dict[str, str] | None = None) -> str:
    """A PTB-XL-style `scp_codes` cell -> the `#Dx` codes of its superclasses and rhythm; `classes`: PTB-XL's
    statement -> superclass table (raybench.cohorts.diagnostics.statement_classes), else superclass names only."""
    codes = [DX_CODE[c] for c in record_superclasses([scp_codes], classes)[0].split(";") if c in DX_CODE]
    if "AFIB" in parse_codes(scp_codes):
        codes.append(DX_CODE["AFIB"])
    return ",".join(codes) or "Unknown"


def _read_ptbxl_record(base: Path) -> tuple[np.ndarray, float, int, tuple[str, ...]]:
    """A synthetic record's format-16 file as written: (digital [T, n_sig], fs, header length, lead names)."""
    lines = [ln.split() for ln in base.with_suffix(".hea").read_text().splitlines() if ln.strip()]
    n_sig, fs, n = int(lines[0][1]), float(lines[0][2]), int(lines[0][3])
    raw = np.fromfile(base.with_suffix(".dat"), dtype="<i2")
    digital = raw[: raw.size - raw.size % n_sig].reshape(-1, n_sig)
    return digital, fs, n, tuple(ln[8] for ln in lines[1:1 + n_sig])


def convert_to_challenge(ptbxl_dir: Path, out: Path) -> None:
    """Each 500 Hz record of a synthetic PTB-XL-shaped cohort -> the Challenge layout under `out` (a new folder)."""
    db = pd.read_csv(ptbxl_dir / "ptbxl_database.csv", dtype=str, keep_default_na=False)
    paths = []
    for row in db.itertuples(index=False):
        eid = int(row.ecg_id)
        digital, fs, n, leads = _read_ptbxl_record(ptbxl_dir / row.filename_hr)
        sex = {"0": "Male", "1": "Female"}.get(str(row.sex).split(".")[0], "Unknown")
        comments = {"Age": str(row.age).split(".")[0] or "Unknown", "Sex": sex, "Dx": dx_of(row.scp_codes),
                    "Rx": "Unknown", "Hx": "Unknown", "Sx": "Unknown", "Patient": row.patient_id,
                    "Site": f"site{str(row.site).split('.')[0]}", "Device": row.device.strip(),
                    "Recording_date": row.recording_date}
        folder = out / f"g{(eid - 1) // 500 + 1}"
        write_challenge_record(folder, f"E{eid:05d}", digital, fs, leads, comments, n_samples=n)
        paths.append(f"{folder.name}/E{eid:05d}")
    truth = pd.read_csv(ptbxl_dir / "ground_truth.csv")
    truth.insert(1, "record", paths)
    truth.to_csv(out / "ground_truth.csv", index=False)


def generate_challenge_cohort(out_dir: str | Path, n_records: int, n_patients: int, seed: int,
                              bad_fraction: float = 0.0) -> Path:
    """The synthetic cohort (same arguments, same records) in the Challenge layout, written atomically."""
    from raybench.cohorts.synth import check_out_dir, generate_synth_cohort

    out_dir = Path(out_dir)
    check_out_dir(out_dir)
    scratch = Path(tempfile.mkdtemp(prefix="raybench-synth-"))
    try:
        generate_synth_cohort(scratch / "ptbxl", n_records, n_patients, seed, bad_fraction)
        with atomic_dir(out_dir) as tmp:
            convert_to_challenge(scratch / "ptbxl", tmp)
            params = json.loads((scratch / "ptbxl" / "params.json").read_text())
            (tmp / "params.json").write_text(json.dumps({**params, "layout": LAYOUT_MARKER}, indent=2))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out_dir
