"""Test helpers: WFDB record folders for `cohort.kind: wfdb` (Challenge-style .mat + .hea, or format-16 .dat).

Everything is written under a test's tmp folder, never into the repository: `ecg` draws a plausible 12-lead
signal, `write_mat_record` / `write_dat_record` write one record, `ptbxl_challenge_folder` turns the shared
PTB-XL sample's 500 Hz records into a Challenge-style folder (no PTB-XL csv; #Age/#Sex/#Dx headers) with a
patients CSV.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd

from raybench.cohorts.diagnostics import statement_classes
from raybench.cohorts.synth_challenge import dx_of, write_challenge_record

LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")


def ecg(seconds: float, fs: float, seed: int = 0, n_leads: int = 12) -> np.ndarray:
    """[n_leads, T] mV: 72 bpm beats (a P, a QRS spike and a T on each lead, lead-specific gains) plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * fs))) / fs
    phase = (t % (60 / 72)) / (60 / 72)
    beat = (0.15 * np.exp(-((phase - 0.15) / 0.03) ** 2) + 1.0 * np.exp(-((phase - 0.3) / 0.012) ** 2)
            + 0.3 * np.exp(-((phase - 0.6) / 0.06) ** 2))
    gains = rng.uniform(0.4, 1.5, n_leads) * rng.choice([-1, 1], n_leads)
    return (gains[:, None] * beat[None] + 0.01 * rng.standard_normal((n_leads, t.size))).astype(np.float64)


def _digital(signal_mv: np.ndarray, gain: float = 1000.0) -> np.ndarray:
    digital = np.clip(np.rint(np.nan_to_num(signal_mv, nan=-32768 / gain) * gain), -32768, 32767)
    return digital.T.astype("<i2")  # [T, n_sig]


def write_mat_record(folder: Path, name: str, signal_mv: np.ndarray, fs: float, leads: tuple[str, ...] = LEADS,
                     comments: dict[str, str] | None = None) -> str:
    """A Challenge-style record (NaN samples written as WFDB's invalid value); returns its name."""
    write_challenge_record(folder, name, _digital(signal_mv), fs, tuple(leads), comments or {})
    return name


def write_dat_record(folder: Path, name: str, signal_mv: np.ndarray, fs: float, leads: tuple[str, ...] = LEADS,
                     comments: dict[str, str] | None = None) -> str:
    """A format-16 `.dat` record as PTB-XL writes them, with header comments."""
    folder.mkdir(parents=True, exist_ok=True)
    digital = _digital(signal_mv)
    lines = [f"{name} {len(leads)} {fs:g} {len(digital)}"]
    lines += [f"{name}.dat 16 1000.0(0)/mV 16 0 {int(digital[0, k])} 0 0 {lead}" for k, lead in enumerate(leads)]
    lines += [f"#{k}: {v}" for k, v in (comments or {}).items()]
    (folder / f"{name}.hea").write_text("\n".join(lines) + "\n")
    (folder / f"{name}.dat").write_bytes(digital.tobytes())
    return name


def ptbxl_challenge_folder(sample: Path, dest: Path, n: int | None = None) -> Path:
    """The sample's records500 copied under `dest` with Challenge-style headers (#Age, #Sex, #Dx from scp_codes),
    and `dest/patients.csv` (record, patient_id, site, device, recording_date). No ptbxl_database.csv."""
    db = pd.read_csv(sample / "ptbxl_database.csv", dtype=str, keep_default_na=False)
    db = db.head(n) if n is not None else db
    classes = statement_classes(sample / "scp_statements.csv")
    rows = []
    for row in db.itertuples(index=False):
        src = sample / row.filename_hr
        name = src.name
        folder = dest / src.parent.name
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src.with_suffix(".dat"), folder / f"{name}.dat")
        sex = {"0": "Male", "1": "Female"}.get(row.sex, "Unknown")
        header = src.with_suffix(".hea").read_text().rstrip("\n")
        header += f"\n#Age: {row.age.split('.')[0] or 'Unknown'}\n#Sex: {sex}\n#Dx: {dx_of(row.scp_codes, classes)}\n"
        (folder / f"{name}.hea").write_text(header + "#Rx: Unknown\n#Hx: Unknown\n#Sx: Unknown\n")
        rows.append({"record": name, "patient_id": row.patient_id, "site": f"site{row.site.split('.')[0]}",
                     "device": row.device, "recording_date": row.recording_date})
    pd.DataFrame(rows).to_csv(dest / "patients.csv", index=False)
    return dest
