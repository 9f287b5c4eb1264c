"""Parity of the ECG-FM and CARDIAC-FM adapters with the upstream code (issue 12, item 1), both profiles.

Fixtures: make_fixtures_encoders_fairseq.py ran the upstream models (fairseq-signals' wav2vec2_cmsc as ECG-FM
builds it; CARDIAC-FM's own MMCL on its vendored fairseq-signals; the protocol's published adapters) at full
size with `weights.det_state_dict` weights on a real PTB-XL record and a synthetic 257-Hz record, and stored
the preprocessed inputs and every layer's pooled state. Here raybench builds the same weights from the same
names and must reproduce both:

  * preprocessing, per sample: `preprocess(signal, fs)` vs upstream's input tensor;
  * pooled states, per layer: `layer_states(upstream input)` vs upstream's pooled states (and CARDIAC-FM's
    contrastive embedding vs MMCL.forward_ecg / the published `pooled`).

Error measure: for each record (and layer), max |raybench - upstream| / max |upstream| over the vector; the
test takes the max over records and layers. Tolerance 1e-5 everywhere; observed (torch 2.13 CPU, numpy 2.4):
inputs <= ~1e-7 (float32 rounding: upstream standardizes the float64 wfdb signal, raybench the float32 mV
record, and the published path z-scores ADC integers where raybench z-scores millivolts), pooled states
<= ~1e-6 (raybench's attention is `scaled_dot_product_attention`, upstream's `F.multi_head_attention_forward`:
same math, different summation order).

What the fixtures pin down: the 500-Hz length int(T * 500 / fs) (the synthetic record gives 5001, round()
would give 5002 and shift every sample), per-lead standardization over the whole record before the
segment, the first 5-s segment (ECG-FM) / first 10 s (CARDIAC-FM), the published FFT resampling + float32
z-score, and which tensor is "the layer" (post-LayerNorm block output) and how tokens are pooled. Not pinned:
the native rule `sum / count(non-zero)` vs a plain mean - on unpadded inputs no post-LN output is exactly 0,
so both give the same numbers (the rule is kept because it is upstream's; see `wav2vec2_io.nonzero_mean`).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from raybench.encoders.base import freeze
from raybench.encoders.models.cardiac_fm import CardiacFMEncoder
from raybench.encoders.models.ecg_fm import ECGFMEncoder
from raybench.encoders.models.wav2vec2_config import FULL, W2VConfig

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from synthetic_ecg import synthetic_ecg_digital  # noqa: E402
from weights import det_state_dict  # noqa: E402

META = json.loads((HERE / "encoders_fairseq.json").read_text())
TOL_INPUT = 1e-5
TOL_STATES = 1e-5
CASES = [(m, p) for m in ("ecg_fm", "cardiac_fm") for p in ("native", "published")]
NATIVE_SAMPLES = {"ecg_fm": 2500, "cardiac_fm": 5000}


def rel_err(ours: np.ndarray, ref: np.ndarray) -> float:
    """max over the leading axes of max|ours - ref| / max|ref| taken over the last axis."""
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    return float((np.abs(ours - ref).max(axis=-1) / np.abs(ref).max(axis=-1)).max())


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def states() -> dict[str, np.ndarray]:
    return dict(np.load(HERE / "encoders_fairseq_states.npz"))


@pytest.fixture(scope="module")
def inputs() -> dict[str, np.ndarray]:
    return {p: np.load(HERE / f"encoders_fairseq_{p}_inputs.npz")["inputs"] for p in ("native", "published")}


def upstream_input(inputs: dict[str, np.ndarray], model: str, profile: str) -> np.ndarray:
    x = inputs[profile]
    return x[:, :, : NATIVE_SAMPLES[model]] if profile == "native" else x


_MODELS: dict[str, torch.nn.Module] = {}


def build(model: str, profile: str):
    """The full-size adapter with the fixture's weights (built once per model, profile switched)."""
    if model not in _MODELS:
        seed = META["seeds"][model]
        if model == "ecg_fm":
            enc = ECGFMEncoder(W2VConfig.from_fairseq(META["ecg_fm_model_cfg"], "encoders_fairseq.json"))
            enc.model.load_state_dict(det_state_dict(enc.model.state_dict(), seed), strict=True)
        else:
            enc = CardiacFMEncoder(FULL, 512)
            enc.load_state_dict(det_state_dict(enc.state_dict(), seed), strict=True)
        _MODELS[model] = freeze(enc)
    enc = _MODELS[model]
    enc.profile = profile
    return enc


def synthetic_signal() -> tuple[np.ndarray, float]:
    rec = META["records"][1]
    return (synthetic_ecg_digital(rec["fs"], rec["n"], rec["seed"]) / 1000.0).astype(np.float32), float(rec["fs"])


def real_signal(root: Path) -> tuple[np.ndarray, float]:
    from raybench.cohorts.waveforms import read_record

    rec = META["records"][0]
    dat = root / (rec["path"] + ".dat")
    if not dat.exists():
        pytest.skip(f"PTB-XL record {rec['path']} not in the sample at {root}")
    assert hashlib.sha256(dat.read_bytes()).hexdigest() == rec["dat_sha256"], f"{dat} is not the fixture's record"
    wave = read_record(root, rec["path"])
    return wave.signal, float(wave.fs)


# ---------------------------------------------------------------- preprocessing, per sample

@pytest.mark.parametrize(("model", "profile"), CASES)
def test_preprocessing_synthetic_record(model, profile, inputs):
    signal, fs = synthetic_signal()
    ours = build(model, profile).preprocess(signal, fs)
    ref = upstream_input(inputs, model, profile)[1]
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert rel_err(ours, ref) <= TOL_INPUT


@pytest.mark.parametrize(("model", "profile"), CASES)
def test_preprocessing_real_ptbxl_record(model, profile, inputs, ptbxl_sample):
    signal, fs = real_signal(ptbxl_sample)
    ours = build(model, profile).preprocess(signal, fs)
    ref = upstream_input(inputs, model, profile)[0]
    assert ours.dtype == np.float32 and ours.shape == ref.shape
    assert rel_err(ours, ref) <= TOL_INPUT


# ---------------------------------------------------------------- pooled states, per layer

@pytest.mark.parametrize(("model", "profile"), CASES)
def test_layer_states_match_upstream(model, profile, inputs, states):
    enc = build(model, profile)
    ours = enc.layer_states(torch.from_numpy(upstream_input(inputs, model, profile))).numpy()  # [L, B, D]
    ref = states[f"{model}_{profile}"].transpose(1, 0, 2)  # stored [B, L, D]
    assert ours.shape == ref.shape == (12, 2, 768)
    assert rel_err(ours, ref) <= TOL_STATES


@pytest.mark.parametrize("profile", ["native", "published"])
def test_cardiac_fm_contrastive_embedding_matches_upstream(profile, inputs, states):
    enc = build("cardiac_fm", profile)
    ours = enc.pooled_projection(torch.from_numpy(upstream_input(inputs, "cardiac_fm", profile))).numpy()
    assert rel_err(ours, states[f"cardiac_fm_{profile}_projection"]) <= TOL_STATES


@pytest.mark.parametrize(("model", "profile"), CASES)
def test_end_to_end_synthetic_record(model, profile, states):
    """raybench's own preprocessing feeding raybench's model: the upstream pooled states of the record."""
    enc = build(model, profile)
    signal, fs = synthetic_signal()
    ours = enc.layer_states(torch.from_numpy(enc.preprocess(signal, fs)[None])).numpy()[:, 0]
    assert rel_err(ours, states[f"{model}_{profile}"][1]) <= TOL_STATES


# ---------------------------------------------------------------- the fixtures see the rules

def test_round_instead_of_int_resample_length_fails_parity(inputs, monkeypatch):
    """round(T * 500 / fs) (5002 for the synthetic record) instead of upstream's int() (5001) moves every sample."""
    from raybench.encoders.models import ecg_fm, wav2vec2_io

    def rounded(x, fs_in, fs_out):
        t = x.shape[-1]
        n = round(t * (fs_out / fs_in))
        return np.stack([np.interp(np.arange(n), np.linspace(0, n - 1, t), r) for r in np.asarray(x, np.float64)])

    signal, fs = synthetic_signal()
    assert int(signal.shape[-1] * (500 / fs)) != round(signal.shape[-1] * (500 / fs))
    monkeypatch.setattr(ecg_fm, "linear_resample", rounded)
    assert wav2vec2_io.linear_resample is not rounded
    ours = build("ecg_fm", "native").preprocess(signal, fs)
    assert rel_err(ours, upstream_input(inputs, "ecg_fm", "native")[1]) > 1e-2


def test_standardizing_the_segment_instead_of_the_record_fails_parity(inputs):
    """Upstream standardizes the whole 500-Hz record, then cuts the 5-s segment."""
    from raybench.encoders.models.wav2vec2_io import linear_resample, standardize_leads

    signal, fs = synthetic_signal()
    segment_first = standardize_leads(linear_resample(signal, fs, 500)[:, :2500]).astype(np.float32)
    assert rel_err(segment_first, upstream_input(inputs, "ecg_fm", "native")[1]) > 1e-3


def test_fixture_provenance():
    """The fixtures name the upstream commits they were made from (tests/parity/README.md)."""
    assert META["upstream"] == {
        "ECG-FM": "9cc0d3fb17b95487736fc2db7f5d2ddc4f87356a",
        "fairseq-signals": "6b9e1375bbe6bc2e55ff4d9b95eabe8eee3adec7",
        "CARDIAC-FM": "9440bef3b1837d78c3773949b5724cd7a9d35c7e",
        "ECG-InterpBench": "de4e19d9ee8786eadef9d6530a01d585f933e8fc",
    }
    for f in HERE.glob("encoders_fairseq*.npz"):
        assert f.stat().st_size < 500 * 1024, f
