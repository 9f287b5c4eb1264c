"""Bad signals at the encoder boundary (issue 12, item 4): each is resampled / padded / reordered / rescaled
with a note, or quarantined with a reason; never changed silently, never a crash that loses finished records.

Records are written with `wfdb.wrsamp` and run through `native_input` (read_record -> the model's native
preprocessing) for one case each, with HuBERT-ECG's native pipeline as the model (its FIR band-pass and 5-s
window give the rate and length limits); one Ray extraction mixes bad and good records.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import ray.cloudpickle
import torch
from torch import nn

from raybench.cohorts.waveforms import RecordError, read_record
from raybench.core.config import EncoderConfig
from raybench.encoders.base import ECGEncoder, EncoderSpec, build_encoder, freeze
from raybench.encoders.extract import extract_activations
from raybench.encoders.loading import native_input
from raybench.encoders.preprocess import crop_or_pad_start, resample
from raybench.encoders.reference import plain_loop_activations
from raybench.encoders.store import ActivationStore

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this module

NAMES = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6"]  # as PTB-XL headers spell them


def ecg(fs: float, seconds: float, seed: int = 0) -> np.ndarray:
    """[T, 12] millivolts: beats + wander + noise, every lead different."""
    t = np.arange(int(round(fs * seconds))) / fs
    rng = np.random.default_rng(seed)
    beat = np.exp(-(((t % 0.8) - 0.3) ** 2) / 3e-4)
    gains = rng.uniform(0.3, 1.5, 12) * np.where(np.arange(12) % 4 == 3, -1, 1)
    return (beat[:, None] * gains + 0.1 * np.sin(2 * np.pi * 0.3 * t)[:, None]
            + 0.02 * rng.standard_normal((len(t), 12)))


def write(root: Path, name: str, sig: np.ndarray, fs: float, names=NAMES, units=None, gain=1000.0) -> dict:
    """A WFDB record (format 16) under root; returns the manifest row extraction reads."""
    import wfdb

    n = sig.shape[1]
    wfdb.wrsamp(name, fs=fs, units=units or ["mV"] * n, sig_name=list(names), p_signal=sig, fmt=["16"] * n,
                adc_gain=[gain] * n if np.isscalar(gain) else list(gain), baseline=[0] * n, write_dir=str(root))
    return {"path": name, "fs": fs, "n_samples": sig.shape[0]}


@pytest.fixture(scope="module")
def hubert():
    return build_encoder(EncoderSpec("hubert_ecg"))  # native profile; preprocessing needs no weights


def run(root: Path, row: dict, encoder) -> tuple[np.ndarray, list[str]]:
    notes: list[str] = []
    x = native_input(str(root), row, encoder.preprocess, encoder.name, notes=notes)
    return x, notes


def refused(root: Path, row: dict, encoder) -> RecordError:
    with pytest.raises(RecordError) as err:
        run(root, row, encoder)
    return err.value


# ---------------------------------------------------------------- values

def test_nan_samples_are_quarantined(tmp_path, hubert):
    sig = ecg(500, 10)
    sig[1000:1100, 7] = np.nan  # WFDB's invalid sample (-32768)
    err = refused(tmp_path, write(tmp_path, "nan", sig, 500), hubert)
    assert err.reason == "nan_lead" and "V2" in err.detail and "NaN" in err.detail


def test_inf_samples_from_a_corrupt_gain_are_quarantined(tmp_path, hubert):
    row = write(tmp_path, "inf", ecg(500, 10), 500)
    hea = tmp_path / "inf.hea"
    lines = hea.read_text().splitlines()
    lines[3] = re.sub(r" 1000(\.0)?(\(0\))?/mV ", " 1e-40(0)/mV ", lines[3])  # lead III: values beyond float32
    hea.write_text("\n".join(lines) + "\n")
    err = refused(tmp_path, row, hubert)
    assert err.reason == "inf_lead" and "III" in err.detail


def test_all_zero_lead_is_quarantined(tmp_path, hubert):
    sig = ecg(500, 10)
    sig[:, 9] = 0.0  # V4 not recorded: an empty channel
    err = refused(tmp_path, write(tmp_path, "zero", sig, 500), hubert)
    assert err.reason == "flat_lead" and "all-zero leads ['V4']" in err.detail


# ---------------------------------------------------------------- rates

@pytest.mark.parametrize("fs", [257, 360, 1000])
def test_unusual_rates_are_resampled_with_a_note(tmp_path, hubert, fs):
    x, notes = run(tmp_path, write(tmp_path, f"r{fs}", ecg(fs, 10), fs), hubert)
    assert x.shape == (6000,) and np.isfinite(x).all()
    assert notes == [f"resampled {fs} Hz -> 500 Hz"]
    # time-aligned with the same signal at 500 Hz (lead-major flattening, 500 samples per lead at 100 Hz)
    ref, ref_notes = run(tmp_path, write(tmp_path, "r500", ecg(500, 10), 500), hubert)
    assert ref_notes == []
    a, b = x.reshape(12, 500), ref.reshape(12, 500)
    assert min(np.corrcoef(a[i], b[i])[0, 1] for i in range(12)) > 0.95


def test_rate_below_the_models_band_is_quarantined(tmp_path, hubert):
    """HuBERT-ECG's 47-Hz band edge needs a rate above 94 Hz (upstream's firwin refuses it otherwise)."""
    err = refused(tmp_path, write(tmp_path, "r50", ecg(50, 10), 50), hubert)
    assert err.reason == "rate_unsupported" and "hubert_ecg" in err.detail and "94" in err.detail


def test_rate_disagreeing_with_the_manifest_is_quarantined(tmp_path, hubert):
    row = write(tmp_path, "r360m", ecg(360, 10), 360) | {"fs": 500}
    assert refused(tmp_path, row, hubert).reason == "rate_mismatch"


# ---------------------------------------------------------------- length

def test_short_record_is_padded_with_a_note(tmp_path, hubert):
    x, notes = run(tmp_path, write(tmp_path, "short", ecg(500, 3), 500), hubert)
    assert x.shape == (6000,) and np.isfinite(x).all()
    assert notes == ["zero-padded 1500 -> 2500 samples (record shorter than the model's window)"]


def test_a_long_record_is_read_as_its_central_window_when_the_manifest_says_so(tmp_path, hubert):
    """A wfdb cohort's 60 s record: the manifest's window (n_samples) and full length (record_samples); the encoder
    sees the central 10 s, with a note, exactly as if that window had been the record."""
    sig = ecg(500, 60, seed=3)
    row = write(tmp_path, "long", sig, 500) | {"n_samples": 5000, "record_samples": 30000}
    x, notes = run(tmp_path, row, hubert)
    ref, _ = run(tmp_path, write(tmp_path, "mid", sig[12500:17500], 500), hubert)
    np.testing.assert_array_equal(x, ref)
    assert notes == ["cropped 30000 -> 5000 samples (the central window, from sample 12500)"]
    assert refused(tmp_path, row | {"record_samples": 29000}, hubert).reason == "length_mismatch"
    assert refused(tmp_path, row | {"record_samples": None}, hubert).reason == "length_mismatch"  # ptbxl: exact


def test_record_too_short_for_the_models_filter_is_quarantined(tmp_path, hubert):
    err = refused(tmp_path, write(tmp_path, "tiny", ecg(500, 0.5), 500), hubert)
    assert err.reason == "too_short" and "453" in err.detail


def test_adapter_errors_and_wrong_shapes_quarantine_the_record(tmp_path):
    """An adapter whose preprocessing raises on one record, or returns another shape for it, costs that record
    only (reasons `preprocess_failed`, `bad_input_shape`)."""
    row = write(tmp_path, "any", ecg(100, 10), 100)

    def boom(signal, fs):
        raise ZeroDivisionError("division by zero in a filter")

    with pytest.raises(RecordError) as err:
        native_input(str(tmp_path), row, boom, "broken")
    assert err.value.reason == "preprocess_failed" and "ZeroDivisionError" in err.value.detail
    with pytest.raises(RecordError) as err:
        native_input(str(tmp_path), row, lambda s, fs: s[:, :900], "cropper", x_shape=(12, 1000))
    assert err.value.reason == "bad_input_shape" and "[12, 900]" in err.value.detail


# ---------------------------------------------------------------- leads

def test_permuted_leads_are_reordered_with_a_note(tmp_path, hubert):
    sig = ecg(500, 10)
    perm = [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 5, 4]
    row = write(tmp_path, "perm", sig[:, perm], 500, names=[NAMES[i] for i in perm])
    write(tmp_path, "std", sig, 500)
    wave, ref = read_record(tmp_path, "perm"), read_record(tmp_path, "std")
    np.testing.assert_array_equal(wave.signal, ref.signal)
    assert ref.notes == ()
    x, notes = run(tmp_path, row, hubert)
    np.testing.assert_array_equal(x, hubert.preprocess(ref.signal, 500))
    assert notes == ["leads reordered to the standard order (header order V1, V2, V3, V4, V5, V6, I, II, III, aVR, "
                     "aVF, aVL)"]


@pytest.mark.parametrize("names,reason,detail", [
    (NAMES[:11] + ["ECG12"], "missing_leads", "['V6'] absent"),
    (NAMES[:6] + [f"ECG{i}" for i in range(6)], "missing_leads", "['V1', 'V2', 'V3', 'V4', 'V5', 'V6'] absent"),
    (NAMES[:11] + ["v5"], "duplicate_leads", "['V5'] appear more than once"),  # names compare case-blind
])
def test_missing_unknown_or_duplicate_leads_are_quarantined(tmp_path, hubert, names, reason, detail):
    row = write(tmp_path, "leads", ecg(500, 10), 500, names=names[:11] + ["TMP"])
    hea = tmp_path / "leads.hea"  # wfdb.wrsamp refuses duplicate names: the last one is put in by hand
    hea.write_text(hea.read_text().replace(" TMP\n", f" {names[11]}\n"))
    err = refused(tmp_path, row, hubert)
    assert err.reason == reason and detail in err.detail


def test_extra_signals_are_left_out_with_a_note(tmp_path, hubert):
    sig = np.concatenate([ecg(500, 10), ecg(500, 10, seed=1)[:, :2]], axis=1)
    x, notes = run(tmp_path, write(tmp_path, "extra", sig, 500, names=NAMES + ["RESP", "Pleth"]), hubert)
    assert notes == ["signals ['RESP', 'Pleth'] left out (not one of the 12 standard leads)"]
    write(tmp_path, "std", sig[:, :12], 500)
    np.testing.assert_array_equal(x, run(tmp_path, {"path": "std", "fs": 500, "n_samples": 5000}, hubert)[0])


# ---------------------------------------------------------------- units

@pytest.mark.parametrize("unit,scale,gain", [("uV", 1000.0, 1.0), ("V", 0.001, 1e6)])
def test_microvolt_and_volt_records_are_scaled_to_millivolts_with_a_note(tmp_path, hubert, unit, scale, gain):
    sig = ecg(500, 10)
    row = write(tmp_path, f"u{unit}", sig * scale, 500, units=[unit] * 12, gain=gain)
    write(tmp_path, "mv", sig, 500)
    wave, ref = read_record(tmp_path, row["path"]), read_record(tmp_path, "mv")
    np.testing.assert_allclose(wave.signal, ref.signal, atol=1.5e-3)  # mV, up to the 1-uV quantization
    assert wave.notes == (f"units {unit} -> mV (x{1 / scale:g}) in all leads",)
    _, notes = run(tmp_path, row, hubert)
    assert notes == [f"units {unit} -> mV (x{1 / scale:g}) in all leads"]


def test_mixed_units_per_lead(tmp_path, hubert):
    sig = ecg(500, 10)
    sig[:, 6:] *= 1000.0  # the chest leads stored in microvolts
    row = write(tmp_path, "mixed", sig, 500, units=["mV"] * 6 + ["uV"] * 6, gain=[1000.0] * 6 + [1.0] * 6)
    wave = read_record(tmp_path, row["path"])
    assert wave.notes == ("units uV -> mV (x0.001) in leads ['V1', 'V2', 'V3', 'V4', 'V5', 'V6']",)
    assert np.abs(wave.signal).max() < 5  # millivolts everywhere


def test_non_voltage_units_are_quarantined(tmp_path, hubert):
    err = refused(tmp_path, write(tmp_path, "mmhg", ecg(500, 10), 500, units=["mV"] * 11 + ["mmHg"]), hubert)
    assert err.reason == "bad_units" and "'mmHg' in ['V6']" in err.detail


# ---------------------------------------------------------------- one Ray extraction, bad and good mixed

class NotingEncoder(ECGEncoder):
    """3 audited states of width 8; native input: 100 Hz (polyphase, noted), first 10 s (padded, noted).
    Its preprocessing raises on 333-Hz records (a stand-in for an adapter bug on one kind of record)."""

    name = "noting"
    n_layers = 3
    d = 8

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(12, self.d, kernel_size=5, padding=2)

    def preprocess(self, signal: np.ndarray, fs: float) -> np.ndarray:
        if fs == 333:
            raise RuntimeError("simulated adapter bug at 333 Hz")
        return crop_or_pad_start(resample(signal, fs, 100), 1000)

    def layer_states(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.conv(x))
        return torch.stack([h.mean(-1), h.amax(-1), (h * h).mean(-1)])


def build_noting(spec: EncoderSpec) -> ECGEncoder:
    torch.manual_seed(spec.init_seed)
    model = NotingEncoder()
    model.profile = spec.profile
    return freeze(model)


def test_ray_extraction_keeps_finished_records_and_records_notes_and_reasons(ray_cluster, tmp_path):
    from raybench.cohorts.manifest import write_manifest

    data = tmp_path / "data"
    data.mkdir()
    rows = []

    def add(ecg_id: int, row: dict) -> None:
        rows.append({"ecg_id": ecg_id, "patient_id": str(ecg_id), "split": ("train", "val", "test")[ecg_id % 3],
                     "site": 0, "device": "dev", **row})

    for i in range(6):
        add(10 + i, write(data, f"good{i}", ecg(100, 10, seed=i), 100))
    sig = ecg(100, 10, seed=20)
    add(20, write(data, "uv", sig * 1000, 100, units=["uV"] * 12, gain=1.0))
    add(21, write(data, "perm", sig[:, ::-1], 100, names=NAMES[::-1]))
    add(22, write(data, "r257", ecg(257, 10, seed=22), 257))
    add(23, write(data, "short", ecg(100, 4, seed=23), 100))
    nan = ecg(100, 10, seed=24)
    nan[5:9, 2] = np.nan
    add(24, write(data, "nan", nan, 100))
    zero = ecg(100, 10, seed=25)
    zero[:, 0] = 0.0
    add(25, write(data, "zero", zero, 100))
    add(26, write(data, "leads11", ecg(100, 10, seed=26)[:, :11], 100, names=NAMES[:11]))
    add(27, write(data, "r333", ecg(333, 10, seed=27), 333))
    add(28, write(data, "mmhg", ecg(100, 10, seed=28), 100, units=["mmHg"] * 12))
    manifest = tmp_path / "manifest.parquet"
    write_manifest(manifest, pd.DataFrame(rows), data.resolve(), [], "none")

    spec = EncoderSpec("noting")
    summary = extract_activations(manifest, tmp_path / "run", spec, EncoderConfig(size="demo", batch_size=3),
                                  builder=build_noting, progress=False)
    assert summary["records"] == 10 and summary["quarantined"] == 5
    assert summary["quarantine_reasons"] == {"nan_lead": 1, "flat_lead": 1, "missing_leads": 1,
                                             "preprocess_failed": 1, "bad_units": 1}
    store = ActivationStore.for_run(tmp_path / "run")
    kept = sorted(np.concatenate([store.ecg_ids("noting", 0, s) for s in ("train", "val", "test")]).tolist())
    assert kept == [10, 11, 12, 13, 14, 15, 20, 21, 22, 23]
    q = pd.read_csv(store.quarantine_path("noting")).set_index("ecg_id")
    assert q.loc[27, "reason"] == "preprocess_failed" and "simulated adapter bug" in q.loc[27, "detail"]
    assert q.loc[28, "reason"] == "bad_units" and q.loc[24, "reason"] == "nan_lead"
    for layer in range(3):
        notes = store.index("noting", layer)["record_notes"]
        assert notes["units uV -> mV (x0.001) in all leads"] == {"n": 1, "ecg_ids": [20]}
        assert notes["resampled 257 Hz -> 100 Hz"] == {"n": 1, "ecg_ids": [22]}
        assert notes["zero-padded 400 -> 1000 samples (record shorter than the model's window)"] == {
            "n": 1, "ecg_ids": [23]}
        assert [k for k in notes if k.startswith("leads reordered")] and notes[
            next(k for k in notes if k.startswith("leads reordered"))]["ecg_ids"] == [21]
        assert len(notes) == 4  # the good records carry no note
    assert summary["record_notes"]["resampled 257 Hz -> 100 Hz"] == 1
    # the kept records are exactly what the plain loop computes; the uV and permuted copies of one signal
    # give the same states as each other (the reader undid both changes)
    ref = plain_loop_activations(manifest, spec, builder=build_noting)
    for layer, by_split in ref.items():
        for split, want in by_split.items():
            np.testing.assert_allclose(store.load("noting", layer, split), want, atol=1e-6)
    states = {int(i): store.load("noting", 1, s)[j] for s in ("train", "val", "test")
              for j, i in enumerate(store.ecg_ids("noting", 1, s))}
    np.testing.assert_array_equal(states[20], states[21])
    json.dumps(summary, default=str)  # the summary stays serializable
