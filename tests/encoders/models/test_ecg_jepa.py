"""ECG-JEPA adapter: upstream checkpoint format, strict keys, forward vs an explicit reference, preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import signal as sps

from raybench.encoders.base import CheckpointError, EncoderSpec, freeze
from raybench.encoders.models import ecg_jepa


def make(size: str = "demo", checkpoint: str | None = None, profile: str = "native", seed: int = 0):
    """What build_encoder does for this factory: seed, build, set the profile, freeze."""
    torch.manual_seed(seed)
    spec = EncoderSpec("ecg_jepa", size=size, checkpoint=checkpoint, profile=profile, init_seed=seed)
    return freeze(ecg_jepa.build(spec))


def upstream_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Key names and shapes of upstream's MaskTransformer (the JEPA context encoder)."""
    d, hidden = cfg.dim, int(cfg.dim * cfg.mlp_ratio)
    shapes = {"pos_embed": (cfg.leads * cfg.patches, d), "W_P.weight": (d, cfg.patch), "W_P.bias": (d,),
              "norm.weight": (d,), "norm.bias": (d,)}
    for i in range(cfg.depth):
        b = f"encoder_blocks.blocks.{i}"
        shapes |= {f"{b}.norm1.weight": (d,), f"{b}.norm1.bias": (d,), f"{b}.attn.qkv.weight": (3 * d, d),
                   f"{b}.attn.proj.weight": (d, d), f"{b}.attn.proj.bias": (d,), f"{b}.norm2.weight": (d,),
                   f"{b}.norm2.bias": (d,), f"{b}.mlp.fc1.weight": (hidden, d), f"{b}.mlp.fc1.bias": (hidden,),
                   f"{b}.mlp.fc2.weight": (d, hidden), f"{b}.mlp.fc2.bias": (d,)}
    return shapes


def upstream_state(cfg, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * 0.2 for k, s in upstream_shapes(cfg).items()}


def reference_states(sd: dict[str, torch.Tensor], cfg, x: torch.Tensor) -> list[torch.Tensor]:
    """Upstream ECG-JEPA `representation` up to each block output, written out explicitly."""
    b = x.shape[0]
    heads, hd = cfg.heads, cfg.dim // cfg.heads
    lead = torch.arange(cfg.leads * cfg.patches) // cfg.patches
    step = torch.arange(cfg.leads * cfg.patches) % cfg.patches
    allowed = (lead[:, None] == lead[None]) | (step[:, None] == step[None])

    def ln(v, key):
        return F.layer_norm(v, (v.shape[-1],), sd[f"{key}.weight"], sd[f"{key}.bias"], eps=1e-5)

    h = x.reshape(b, -1, cfg.patch) @ sd["W_P.weight"].T + sd["W_P.bias"]
    out = []
    for i in range(cfg.depth):
        k_ = f"encoder_blocks.blocks.{i}"
        h = h + sd["pos_embed"]
        qkv = (ln(h, f"{k_}.norm1") @ sd[f"{k_}.attn.qkv.weight"].T).reshape(b, -1, 3, heads, hd)
        q, k, v = (qkv[:, :, j].transpose(1, 2) for j in range(3))
        scores = (q @ k.transpose(-1, -2)) * hd ** -0.5
        att = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1) @ v
        att = att.transpose(1, 2).reshape(b, -1, cfg.dim)
        h = h + att @ sd[f"{k_}.attn.proj.weight"].T + sd[f"{k_}.attn.proj.bias"]
        mlp = F.gelu(ln(h, f"{k_}.norm2") @ sd[f"{k_}.mlp.fc1.weight"].T + sd[f"{k_}.mlp.fc1.bias"])
        h = h + mlp @ sd[f"{k_}.mlp.fc2.weight"].T + sd[f"{k_}.mlp.fc2.bias"]
        out.append(h)
    return out


def records(n: int = 2, fs: int = 500, seconds: float = 10.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(fs * seconds)) / fs
    base = np.sin(2 * np.pi * 1.2 * t) + 0.3 * np.sin(2 * np.pi * 7 * t)
    return (base[None, None] * rng.uniform(0.2, 2, (n, 12, 1)) + 0.05 * rng.standard_normal((n, 12, t.size))
            ).astype(np.float32)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    state = upstream_state(ecg_jepa.DEMO)
    path = tmp_path_factory.mktemp("jepa") / "multiblock_epoch100.pth"
    torch.save({"encoder": state, "epoch": 100}, path)
    return path, state


def test_published_checkpoint_loads_strictly(ckpt):
    path, state = ckpt
    loaded = make(checkpoint=str(path)).state_dict()
    assert set(loaded) == set(state)
    for key, value in state.items():
        assert torch.equal(loaded[key], value), key


def test_forward_matches_reference_on_loaded_weights(ckpt):
    path, state = ckpt
    model = make(checkpoint=str(path))
    x = torch.from_numpy(np.stack([model.preprocess(r, 500) for r in records()]))
    ref = reference_states(state, ecg_jepa.DEMO, x)
    for r, o in zip(ref, model.block_outputs(x), strict=True):
        torch.testing.assert_close(o, r, atol=2e-4, rtol=1e-4)
    expected = torch.stack([h.mean(1) for h in ref])
    model.profile = "published"  # the protocol's hooks: pre-norm block outputs, mean over every token
    torch.testing.assert_close(model.layer_states(x), expected, atol=2e-4, rtol=1e-4)
    # native: upstream's `representation` rule, the last layer through the final norm before the token mean.
    # (Before issue 12 the last native layer was pre-norm, as published.)
    model.profile = "native"
    d = ecg_jepa.DEMO.dim
    expected[-1] = F.layer_norm(ref[-1], (d,), state["norm.weight"], state["norm.bias"]).mean(1)
    torch.testing.assert_close(model.layer_states(x), expected, atol=2e-4, rtol=1e-4)


def test_sincos_table_and_mask_by_hand():
    d, leads, patches = 16, 3, 5
    table = ecg_jepa.sincos_2d(d, leads, patches)
    q = d // 4
    torch.testing.assert_close(table[0], torch.tensor([0.0] * q + [1.0] * q + [0.0] * q + [1.0] * q))
    # token (lead 0, patch 1): time half = [sin(1 * w_i), cos(1 * w_i)], lead half = position 0
    w = 1.0 / 10000 ** (np.arange(q) / q)
    torch.testing.assert_close(table[1, :2 * q], torch.tensor(np.r_[np.sin(w), np.cos(w)], dtype=torch.float32))
    # token (lead 1, patch 0): time half = position 0, lead half = position 1
    torch.testing.assert_close(table[patches, 2 * q:], torch.tensor(np.r_[np.sin(w), np.cos(w)], dtype=torch.float32))
    mask = ecg_jepa.lead_time_mask(leads, patches)
    assert mask.sum(1).tolist() == [leads + patches - 1] * (leads * patches)
    assert mask[0, patches] and mask[0, 1] and not mask[0, patches + 1]  # same time / same lead / neither


def test_renamed_key_is_named_in_the_error(ckpt, tmp_path):
    _, state = ckpt
    bad = dict(state)
    bad["encoder_blocks.blocks.3.mlp.fc_1.weight"] = bad.pop("encoder_blocks.blocks.3.mlp.fc1.weight")
    path = tmp_path / "renamed.pth"
    torch.save({"encoder": bad}, path)
    with pytest.raises(CheckpointError, match=r"fc_1\.weight") as err:
        make(checkpoint=str(path))
    assert "encoder_blocks.blocks.3.mlp.fc1.weight" in str(err.value) and str(path) in str(err.value)


def test_wrong_format_fails(ckpt, tmp_path):
    _, state = ckpt
    path = tmp_path / "flat.pth"
    torch.save(state, path)  # a bare state dict is not the published {'encoder': ...} format
    with pytest.raises(CheckpointError, match="'encoder'"):
        make(checkpoint=str(path))


def test_preprocess_leads_rate_and_profiles():
    native, published = make(profile="native"), make(profile="published")
    for fs, seconds in ((500, 10), (100, 10), (500, 12), (250, 8)):
        rec = records(1, fs, seconds)[0]
        for model in (native, published):
            x = model.preprocess(rec, fs)
            assert x.shape == (8, 2500) and x.dtype == np.float32 and np.isfinite(x).all()
    rec = records(1)[0]
    rec[2:6] = 100.0  # III, aVR, aVL, aVF are not used
    x = native.preprocess(rec, 500)  # millivolts kept: FFT resampling of leads I, II, V1-V6 only
    np.testing.assert_allclose(x, sps.resample(rec[[0, 1, 6, 7, 8, 9, 10, 11]], 2500, axis=1), atol=1e-5)
    z = published.preprocess(rec, 500)
    np.testing.assert_allclose(z, (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True), atol=1e-4)


@pytest.mark.slow
def test_full_size_states():
    model = make(size="full")
    assert (model.n_layers, model.d) == (12, 768)
    x = torch.from_numpy(np.stack([model.preprocess(r, 500) for r in records(2)]))
    s = model.layer_states(x)
    assert s.shape == (12, 2, 768) and torch.isfinite(s).all()
    torch.testing.assert_close(make(size="full").layer_states(x), s, atol=0, rtol=0)
    # the published ViT-B geometry (16 heads): upstream names and shapes (checked without writing a ~350 MB file)
    expected = upstream_shapes(ecg_jepa.FULL)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
