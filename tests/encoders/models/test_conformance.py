"""The contract every built-in adapter keeps at demo size, checked the same way for all six (per-model
files test what is particular: checkpoint formats, reference forwards, preprocessing details).

Through `build_encoder` (seeded build + profile + freeze): states [n_layers, B, d = 64], finite, frozen,
deterministic for a seed and different across seeds, independent of the batch they are computed in, a
fingerprint that follows the weights, and an error naming the native shape for anything else.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raybench.core.models import DEMO_WIDTH, INFO, MODELS
from raybench.encoders.base import EncoderSpec, build_encoder


def _records(n: int, fs: int = 500, seconds: float = 10.0) -> list[np.ndarray]:
    """ECG-like 12-lead records: a 1.2 Hz rhythm + harmonics, lead gains, a little noise."""
    rng = np.random.default_rng(0)
    t = np.arange(int(fs * seconds)) / fs
    base = np.sin(2 * np.pi * 1.2 * t) + 0.3 * np.sin(2 * np.pi * 7 * t)
    return [(rng.uniform(0.3, 1.5, (12, 1)) * base + 0.05 * rng.standard_normal((12, t.size))).astype(np.float32)
            for _ in range(n)]


@pytest.mark.parametrize("profile", ["native", "published"])
@pytest.mark.parametrize("name", MODELS)
def test_demo_adapter_contract(name, profile):
    build = lambda seed: build_encoder(EncoderSpec(name, size="demo", profile=profile, init_seed=seed))  # noqa: E731
    a, b, c = build(3), build(3), build(4)
    assert (a.name, a.n_layers, a.d) == (name, INFO[name].demo_layers, DEMO_WIDTH)  # sizes from the registry
    assert not a.training and not any(p.requires_grad for p in a.parameters())
    x = torch.from_numpy(np.stack([a.preprocess(r, 500) for r in _records(3)]))
    s = a.layer_states(x)
    assert s.shape == (a.n_layers, 3, DEMO_WIDTH) and torch.isfinite(s).all()
    assert_seeded_and_deterministic(a, b, c, x, s)


def assert_seeded_and_deterministic(a, b, c, x: torch.Tensor, s: torch.Tensor) -> None:
    """The contract's determinism checks: `a` and `b` share a seed, `c` does not; `s` = a.layer_states(x)."""
    assert torch.equal(s, a.layer_states(x)) and torch.equal(s, b.layer_states(x))
    assert not torch.allclose(c.layer_states(x), s)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    torch.testing.assert_close(a.layer_states(x[1:2]), s[:, 1:2], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="expects native inputs"):
        a.layer_states(x[..., : x.shape[-1] // 2])


@pytest.mark.parametrize("profile", ["native", "published"])
@pytest.mark.parametrize("name", ["cardiac_fm", "ecg_fm", "hubert_ecg"])
def test_real_ptbxl_records_at_both_rates(ptbxl_sample, name, profile):
    """The 100-Hz and 500-Hz files of one PTB-XL record give time-aligned native inputs and finite states
    (full size: the models whose native input is built from 500 Hz)."""
    import pandas as pd

    from raybench.cohorts.waveforms import read_record

    model = build_encoder(EncoderSpec(name, profile=profile))
    row = pd.read_csv(ptbxl_sample / "ptbxl_database.csv").iloc[0]
    hr, lr = read_record(ptbxl_sample, row.filename_hr), read_record(ptbxl_sample, row.filename_lr)
    a, b = model.preprocess(hr.signal, hr.fs), model.preprocess(lr.signal, lr.fs)
    assert a.shape == b.shape
    la, lb = a.reshape(12, -1), b.reshape(12, -1)  # per lead (HuBERT's flattening is lead after lead)
    assert min(np.corrcoef(la[i], lb[i])[0, 1] for i in range(12)) > 0.7
    s = model.layer_states(torch.from_numpy(np.stack([a, b])))
    assert s.shape == (model.n_layers, 2, model.d) and torch.isfinite(s).all()
