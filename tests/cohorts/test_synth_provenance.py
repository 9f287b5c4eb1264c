"""The synthetic cohort's planted provenance shortcut: a device artifact and a device-associated diagnosis."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from raybench.cohorts.synth import generate_synth_cohort
from raybench.cohorts.synth_provenance import ProvenancePlant
from raybench.cohorts.waveforms import read_record


def _cohort(tmp_path, name, plant):
    out = generate_synth_cohort(tmp_path / name, 60, 30, 11, plant=plant)
    return out, pd.read_csv(out / "ptbxl_database.csv")


def test_the_default_cohort_is_unchanged_and_has_device_and_site(tmp_path):
    plain, db = _cohort(tmp_path, "plain", None)
    same, db2 = _cohort(tmp_path, "none", ProvenancePlant())  # an inactive plant changes nothing
    pd.testing.assert_frame_equal(db, db2)
    assert (plain / "records500/00000/00001_hr.dat").read_bytes() == (same / "records500/00000/00001_hr.dat"
                                                                       ).read_bytes()
    assert db.device.notna().all() and db.site.notna().all() and db.device.nunique() > 1
    assert "provenance_plant" not in json.loads((plain / "params.json").read_text())


def test_planted_association_and_offset_artifact(tmp_path):
    plant = ProvenancePlant(artifact="offset", amplitude_mv=0.5, device="CS-12   E", association=1.0)
    out, db = _cohort(tmp_path, "planted", plant)
    labels_only, db2 = _cohort(tmp_path, "labels", ProvenancePlant(device="CS-12   E", association=1.0))
    pd.testing.assert_frame_equal(db, db2)  # the artifact leaves the tables alone
    on = db.device == plant.device
    assert on.any() and (~on).any()
    norm = db.scp_codes.str.contains("NORM")
    assert norm[on].all() and not norm[~on].any()  # association 1: NORM exactly on the artifact device
    assert json.loads((out / "params.json").read_text())["provenance_plant"]["association"] == 1.0
    for i in (int(db.index[on][0]), int(db.index[~on][0])):
        diff = read_record(out, db.filename_hr[i]).signal - read_record(labels_only, db.filename_hr[i]).signal
        np.testing.assert_allclose(diff, 0.5 if on[i] else 0.0, atol=1e-3)  # 1 uV quantization


def test_hum_artifact_is_50_hz(tmp_path):
    plant = ProvenancePlant(artifact="hum", amplitude_mv=0.4, device="CS-12   E")
    out, db = _cohort(tmp_path, "hum", plant)
    _cohort(tmp_path, "base", None)
    i = int(db.index[db.device == plant.device][0])
    diff = read_record(out, db.filename_hr[i]).signal - read_record(tmp_path / "base", db.filename_hr[i]).signal
    spectrum = np.abs(np.fft.rfft(diff[0]))
    assert np.fft.rfftfreq(diff.shape[1], 1 / 500)[spectrum.argmax()] == pytest.approx(50.0)
    assert np.sqrt(2) * diff[0].std() == pytest.approx(0.4, rel=0.02)


def test_bad_plants_are_refused(tmp_path):
    with pytest.raises(ValueError, match="association"):
        generate_synth_cohort(tmp_path / "x", 10, 5, 1, plant=ProvenancePlant(association=1.5))
