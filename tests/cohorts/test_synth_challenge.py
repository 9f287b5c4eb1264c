"""`raybench cohort synth --layout challenge`: the synthetic cohort as .mat + .hea with #Dx, read back by WFDB."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from click.testing import CliRunner

from raybench.cohorts.synth_challenge import dx_of
from raybench.cohorts.waveforms import read_record


def test_the_challenge_layout_holds_the_same_records_as_the_ptbxl_layout(tmp_path):
    from raybench.app.cli import main
    from raybench.cohorts.synth import generate_synth_cohort

    res = CliRunner().invoke(main, ["cohort", "synth", "--layout", "challenge", "--out", str(tmp_path / "ch"),
                                    "--records", "12", "--patients", "5", "--seed", "9"])
    assert res.exit_code == 0, res.output
    generate_synth_cohort(tmp_path / "px", 12, 5, 9)
    ch = tmp_path / "ch"
    assert sorted(p.relative_to(ch).as_posix() for p in ch.rglob("*.mat"))[:2] == ["g1/E00001.mat", "g1/E00002.mat"]
    assert not list(ch.rglob("*.dat")) and not (ch / "ptbxl_database.csv").exists()
    assert json.loads((ch / "params.json").read_text())["layout"] == "challenge"
    db = pd.read_csv(tmp_path / "px" / "ptbxl_database.csv", dtype=str, keep_default_na=False)
    for row in db.head(3).itertuples():
        mat = read_record(ch, f"g1/E{int(row.ecg_id):05d}")
        dat = read_record(tmp_path / "px", row.filename_hr)
        np.testing.assert_array_equal(mat.signal, dat.signal)
        header = (ch / "g1" / f"E{int(row.ecg_id):05d}.hea").read_text()
        assert f"#Dx: {dx_of(row.scp_codes)}" in header and f"#Patient: {row.patient_id}" in header
        assert f"#Device: {row.device.strip()}" in header and ".mat 16+24 " in header
    truth = pd.read_csv(ch / "ground_truth.csv")
    assert list(truth["record"][:2]) == ["g1/E00001", "g1/E00002"] and len(truth) == 12


def test_dx_codes_of_the_synthetic_statements():
    assert dx_of("{'NORM': 100.0, 'SR': 0.0}") == "426783006"
    assert dx_of("{'AFIB': 100.0}") == "164889003"
    assert dx_of("{'IMI': 100.0}") == "Unknown"  # without scp_statements.csv only superclass names map
    assert dx_of("{'IMI': 100.0, 'LVH': 50.0}", {"IMI": "MI", "LVH": "HYP"}) == "164873001,164865005"
