"""HuBERT-ECG vs the upstream code (issue 12, item 1): preprocessing and per-layer pooled states, both profiles.

Fixtures: `encoders_hubert_{native,published}.npz` + `encoders_hubert.json`, written by
`make_fixtures_encoders_hubert.py` from Edoar-do/HuBERT-ECG (native) and the published protocol's adapter
(published) with the deterministic weights of `weights.det_state_dict`. Error measure: max |raybench - upstream|
over the array (a record's input, or one layer's pooled states of all records) divided by max |upstream| of
that array; tolerance 1e-5 everywhere (observed ~1e-7 on inputs, ~1e-6 on states: float32 vs float64 steps and
transformers 5 vs upstream's 4.46 kernels).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from make_fixtures_encoders_hubert import SEED, SYNTH_FS, SYNTH_GAIN, synthetic_record
from transformers import HubertConfig
from weights import det_state_dict

from raybench.cohorts.waveforms import read_record
from raybench.encoders.base import freeze
from raybench.encoders.models import hubert_ecg as H
from raybench.encoders.preprocess import bandpass

HERE = Path(__file__).resolve().parent
META = json.loads((HERE / "encoders_hubert.json").read_text())
FIXTURES = {profile: dict(np.load(HERE / f"encoders_hubert_{profile}.npz")) for profile in ("native", "published")}
TOL = 1e-5
RECORDS = {"native": ("ptbxl_500hz", "ptbxl_100hz", "synthetic"), "published": ("ptbxl_500hz",
                                                                                        "synthetic")}


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - ref).max() / np.abs(ref).max())


def raw_signals(root: Path) -> dict[str, tuple[np.ndarray, float]]:
    """The fixture's records as raybench reads them (the PTB-XL record through read_record)."""
    rec500 = META["ptbxl_record"]
    rec100 = rec500.replace("records500", "records100")[: -len("_hr")] + "_lr"
    a, b = read_record(root, rec500), read_record(root, rec100)
    synth = synthetic_record().astype(np.float32) / np.float32(SYNTH_GAIN)
    return {"ptbxl_500hz": (a.signal, a.fs), "ptbxl_100hz": (b.signal, b.fs), "synthetic": (synth, SYNTH_FS)}


def preprocess(profile: str, signal: np.ndarray, fs: float) -> np.ndarray:
    return H.native_preprocess(signal, fs) if profile == "native" else H.published_preprocess(signal)


@pytest.fixture(scope="module")
def signals(ptbxl_sample) -> dict[str, tuple[np.ndarray, float]]:
    return raw_signals(ptbxl_sample)


@pytest.fixture(scope="module")
def model() -> H.HuBERTECGEncoder:
    """Full-size base HuBERT-ECG with the fixture's config and the shared deterministic weights."""
    config = HubertConfig.from_dict(META["config"])
    shapes_from = H.HuBERTECGEncoder(config)
    shapes = {**shapes_from.hubert.state_dict(), **shapes_from.heads.state_dict()}
    assert sorted(shapes) == META["parameter_names"]  # upstream HuBERTECG's names, heads included
    del shapes_from
    encoder = H.from_state(config, det_state_dict(shapes, META["seed"]), "deterministic weights")
    return freeze(encoder)


def test_fixture_provenance():
    assert META["seed"] == SEED
    assert META["upstream"]["Edoar-do/HuBERT-ECG"] == "affe1f94d06d61a346fa7520be441af5642616b4"
    assert META["config"]["conv_kernel"] == [10, 3, 3, 2, 2] and META["config"]["hidden_size"] == 768


@pytest.mark.parametrize("profile,key", [(p, k) for p, keys in RECORDS.items() for k in keys])
def test_preprocessing_matches_upstream(signals, profile, key):
    sig, fs = signals[key]
    got = preprocess(profile, sig, fs)
    ref = FIXTURES[profile][f"{key}/input"]
    assert got.shape == ref.shape == ((6000,) if profile == "native" else (30000,))
    assert got.dtype == np.float32
    assert rel_err(got, ref) <= TOL


@pytest.mark.slow
@pytest.mark.parametrize("profile", ["native", "published"])
def test_layer_states_match_upstream(signals, model, profile):
    model.profile = profile
    keys = RECORDS[profile]
    x = np.stack([preprocess(profile, *signals[k]) for k in keys])
    got = model.layer_states(torch.from_numpy(x)).numpy()  # [12, B, 768]
    ref = np.stack([FIXTURES[profile][f"{k}/states"] for k in keys], axis=1)  # [12, B, 768]
    assert got.shape == ref.shape == (12, len(keys), 768)
    errs = [rel_err(got[layer], ref[layer]) for layer in range(12)]
    assert max(errs) <= TOL, errs
    # the same weights fed upstream's own input give the same states (isolates the model from preprocessing)
    x_up = np.stack([FIXTURES[profile][f"{k}/input"] for k in keys])
    got_up = model.layer_states(torch.from_numpy(x_up)).numpy()
    assert max(rel_err(got_up[layer], ref[layer]) for layer in range(12)) <= TOL


# ---------------------------------------------------------------- the comparisons bite

def test_previous_butterworth_band_pass_fails_parity(signals, monkeypatch):
    """raybench's earlier native filter (order-4 Butterworth, upper edge clipped to 0.45 fs) is far off the FIR."""
    monkeypatch.setattr(H, "fir_bandpass", lambda x, fs, lo, hi, order_per_hz: bandpass(x, fs, lo, hi).astype(float))
    for key in ("ptbxl_500hz", "ptbxl_100hz"):
        assert rel_err(H.native_preprocess(*signals[key]), FIXTURES["native"][f"{key}/input"]) > 100 * TOL


def test_resample_length_rounding_matters(signals, monkeypatch):
    """int(T * 500 / fs) (3,000 for 6 s at 201 Hz) instead of upstream's int(T * (500 / fs)) (2,999) breaks parity."""
    sig, fs = signals["synthetic"]
    assert int(sig.shape[-1] * (500 / fs)) == 2999 and int(sig.shape[-1] * 500 / fs) == 3000
    real = H.sps.resample
    monkeypatch.setattr(H.sps, "resample", lambda x, n, axis: real(x, int(x.shape[-1] * 500 / fs), axis=axis))
    assert rel_err(H.native_preprocess(sig, fs), FIXTURES["native"]["synthetic/input"]) > 100 * TOL


@pytest.mark.slow
def test_off_by_one_layer_fails_parity(signals, model):
    """Pooling hidden_states[i] (the layer's input) instead of [i + 1] is caught by the per-layer comparison."""
    model.profile = "native"
    x = np.stack([FIXTURES["native"][f"{k}/input"] for k in RECORDS["native"]])
    with torch.no_grad():
        out = model.hubert(torch.from_numpy(x), output_hidden_states=True, return_dict=True)
    shifted = torch.stack([h.mean(dim=1) for h in out.hidden_states[:-1]]).numpy()
    ref = np.stack([FIXTURES["native"][f"{k}/states"] for k in RECORDS["native"]], axis=1)
    assert min(rel_err(shifted[layer], ref[layer]) for layer in range(12)) > 100 * TOL
