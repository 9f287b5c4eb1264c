"""Patient-level split rules. Pure functions of the patient key: no state, no randomness.

PTB-XL: bucket = int(sha256("ecg_fm_interpretability_benchmark_v1:" + patient_id).hexdigest()[:8], 16)
/ 0xFFFFFFFF; < 0.70 train, < 0.85 val, else test. The key is the patient_id exactly as written in
`ptbxl_database.csv` ("15709.0"), so the id must be passed as the csv string, never re-formatted.

MIMIC-IV-ECG: int.from_bytes(sha256("external-head-v1:" + subject_id).digest()[:8], "big") % 10;
0-6 train, 7 val, 8-9 test. subject_id is the integer id written without decimals ("10000032").
"""

from __future__ import annotations

import hashlib

SPLITS: tuple[str, ...] = ("train", "val", "test")
PTBXL_SALT = "ecg_fm_interpretability_benchmark_v1:"
MIMIC_SALT = "external-head-v1:"
# the rules as summary.json states them
PTBXL_SPLIT_RULE = f"sha256('{PTBXL_SALT}' + patient_id)[:8] / 0xFFFFFFFF: <0.70 train, <0.85 val, else test"
MIMIC_SPLIT_RULE = (f"int.from_bytes(sha256('{MIMIC_SALT}' + subject_id).digest()[:8], 'big') % 10: "
                    "0-6 train, 7 val, 8-9 test")


def ptbxl_bucket(patient_id: str) -> float:
    if not isinstance(patient_id, str) or not patient_id.strip():
        raise ValueError(f"patient_id must be the non-empty csv string (e.g. '15709.0'), got {patient_id!r}")
    digest = hashlib.sha256((PTBXL_SALT + patient_id).encode("utf-8")).hexdigest()
    return int(digest[:8], 16) / 0xFFFFFFFF


def ptbxl_split(patient_id: str) -> str:
    bucket = ptbxl_bucket(patient_id)
    if bucket < 0.70:
        return "train"
    if bucket < 0.85:
        return "val"
    return "test"


def _mimic_key(subject_id: int | str) -> str:
    if isinstance(subject_id, bool):
        raise ValueError(f"subject_id must be an integer id, got {subject_id!r}")
    if isinstance(subject_id, int):
        return str(subject_id)
    if isinstance(subject_id, float):
        if not subject_id.is_integer():
            raise ValueError(f"subject_id must be an integer id, got {subject_id!r}")
        return str(int(subject_id))
    text = str(subject_id).strip()
    if not text.isdigit():
        raise ValueError(f"subject_id must be digits as written in record_list.csv, got {subject_id!r}")
    return text


def mimic_split(subject_id: int | str) -> str:
    digest = hashlib.sha256((MIMIC_SALT + _mimic_key(subject_id)).encode("utf-8")).digest()
    bucket = int.from_bytes(digest[:8], "big") % 10
    if bucket <= 6:
        return "train"
    if bucket == 7:
        return "val"
    return "test"
