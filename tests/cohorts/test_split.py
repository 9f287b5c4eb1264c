"""Split rules: reproduce hand-computed hashes and fixed values; patient-level by construction."""

from __future__ import annotations

import hashlib
from collections import Counter

import pytest

from raybench.cohorts.split import mimic_split, ptbxl_bucket, ptbxl_split


def _by_hand_ptbxl(patient_id: str) -> str:
    digest = hashlib.sha256(("ecg_fm_interpretability_benchmark_v1:" + patient_id).encode()).hexdigest()
    bucket = int(digest[:8], 16) / 0xFFFFFFFF
    return "train" if bucket < 0.70 else "val" if bucket < 0.85 else "test"


def test_ptbxl_hand_computed_example():
    # sha256("ecg_fm_interpretability_benchmark_v1:15709.0") starts with these 8 hex digits
    digest = hashlib.sha256(b"ecg_fm_interpretability_benchmark_v1:15709.0").hexdigest()
    assert ptbxl_bucket("15709.0") == int(digest[:8], 16) / 0xFFFFFFFF
    assert ptbxl_split("15709.0") == _by_hand_ptbxl("15709.0")


@pytest.mark.parametrize("pid,expected", [("15709.0", "train"), ("13243.0", "train"), ("20372.0", "test"),
                                          ("17014.0", "train"), ("19005.0", "train")])
def test_ptbxl_fixed_values(pid, expected):
    assert ptbxl_split(pid) == expected


def test_ptbxl_key_is_the_csv_text():
    # "15709" and "15709.0" are different keys: the rule hashes the text exactly as written
    assert ptbxl_bucket("15709") != ptbxl_bucket("15709.0")
    for pid in ("1.0", "2.0", "999.0", "21000.0", "abc"):
        assert ptbxl_split(pid) == _by_hand_ptbxl(pid)
    with pytest.raises(ValueError, match="patient_id"):
        ptbxl_split("")
    with pytest.raises(ValueError, match="patient_id"):
        ptbxl_split(15709.0)  # type: ignore[arg-type]


def test_ptbxl_proportions_near_70_15_15():
    counts = Counter(ptbxl_split(f"{i}.0") for i in range(20000))
    assert abs(counts["train"] / 20000 - 0.70) < 0.015
    assert abs(counts["val"] / 20000 - 0.15) < 0.015
    assert abs(counts["test"] / 20000 - 0.15) < 0.015


def _by_hand_mimic(subject_id: str) -> str:
    digest = hashlib.sha256(("external-head-v1:" + subject_id).encode()).digest()
    bucket = int.from_bytes(digest[:8], "big") % 10
    return "train" if bucket <= 6 else "val" if bucket == 7 else "test"


@pytest.mark.parametrize("sid,expected", [(10000032, "train"), (10000084, "train"), (10001217, "test"),
                                          (10002428, "test"), (19999987, "train")])
def test_mimic_fixed_values_and_hand_rule(sid, expected):
    assert mimic_split(sid) == expected
    assert mimic_split(str(sid)) == expected
    assert mimic_split(sid) == _by_hand_mimic(str(sid))


def test_mimic_rule_over_many_ids_and_bad_ids():
    counts = Counter(mimic_split(10_000_000 + i) for i in range(20000))
    assert abs(counts["train"] / 20000 - 0.70) < 0.015
    assert abs(counts["val"] / 20000 - 0.10) < 0.015
    assert all(mimic_split(s) == _by_hand_mimic(str(s)) for s in range(10_000_000, 10_000_200))
    assert mimic_split(10000032.0) == mimic_split(10000032)
    for bad in ("10000032.5", "p10000032", 1.5, True):
        with pytest.raises(ValueError, match="subject_id"):
            mimic_split(bad)
