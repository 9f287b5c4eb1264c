"""CSFM adapter: upstream checkpoint format, strict keys, forward vs an explicit reference, preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import signal as sps

from raybench.encoders.base import CheckpointError, EncoderSpec, freeze
from raybench.encoders.models import csfm


def make(size: str = "demo", checkpoint: str | None = None, profile: str = "native", seed: int = 0):
    """What build_encoder does for this factory: seed, build, set the profile, freeze."""
    torch.manual_seed(seed)
    model = csfm.build(EncoderSpec("csfm", size=size, checkpoint=checkpoint, profile=profile, init_seed=seed))
    return freeze(model)


def upstream_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Names (without the `encoder.` prefix) and shapes of the published CSFM .pth entries, head included;
    written from upstream's module tree, not from our module."""
    d, inner = cfg.dim, cfg.heads * cfg.dim_head
    shapes = {
        "cls_token": (1, 1, d), "ts_channel_type_embedding": (1, 13, d), "text_type_embedding": (1, 1, d),
        "ts_pos_embedding": (1, cfg.signal_len // cfg.patch_size, d), "text_pos_embedding": (1, cfg.text_len, d),
        "ts_to_patch_embedding.1.weight": (cfg.patch_size,), "ts_to_patch_embedding.1.bias": (cfg.patch_size,),
        "ts_to_patch_embedding.2.weight": (d, cfg.patch_size), "ts_to_patch_embedding.2.bias": (d,),
        "ts_to_patch_embedding.3.weight": (d,), "ts_to_patch_embedding.3.bias": (d,),
        "text_to_embedding.0.weight": (cfg.vocab_size, d),
        "text_to_embedding.1.weight": (d,), "text_to_embedding.1.bias": (d,),
        "transformer.norm.weight": (d,), "transformer.norm.bias": (d,),
        "mlp_head.weight": (1, d), "mlp_head.bias": (1,),
    }
    for i in range(cfg.depth):
        a, f = f"transformer.layers.{i}.0", f"transformer.layers.{i}.1.net"
        shapes |= {f"{a}.norm.weight": (d,), f"{a}.norm.bias": (d,), f"{a}.to_qkv.weight": (3 * inner, d),
                   f"{a}.to_out.0.weight": (d, inner), f"{a}.to_out.0.bias": (d,),
                   f"{f}.0.weight": (d,), f"{f}.0.bias": (d,), f"{f}.1.weight": (cfg.mlp_dim, d),
                   f"{f}.1.bias": (cfg.mlp_dim,), f"{f}.4.weight": (d, cfg.mlp_dim), f"{f}.4.bias": (d,)}
    return shapes


def upstream_checkpoint(cfg, seed: int = 1) -> dict[str, torch.Tensor]:
    """The flat `.pth`: `encoder.`-prefixed random tensors, plus an entry the loader must ignore."""
    g = torch.Generator().manual_seed(seed)
    state = {f"encoder.{k}": torch.randn(s, generator=g) * 0.2 for k, s in upstream_shapes(cfg).items()}
    state["decoder.proj.weight"] = torch.randn(3, 3, generator=g)  # pre-training leftovers are ignored
    return state


def reference_states(sd: dict[str, torch.Tensor], cfg, x: torch.Tensor) -> list[torch.Tensor]:
    """Upstream CSFM forward written out with explicit tensor algebra (no code shared with the adapter)."""
    b, c, t = x.shape
    n, p, d = t // cfg.patch_size, cfg.patch_size, cfg.dim

    def ln(v, key):
        return F.layer_norm(v, (v.shape[-1],), sd[f"{key}.weight"], sd[f"{key}.bias"], eps=1e-5)

    tok = ln(x.reshape(b, c, n, p), "ts_to_patch_embedding.1")
    tok = ln(tok @ sd["ts_to_patch_embedding.2.weight"].T + sd["ts_to_patch_embedding.2.bias"],
             "ts_to_patch_embedding.3")
    for lead in range(c):
        tok[:, lead] += sd["ts_channel_type_embedding"][0, lead]
    tok = tok + sd["ts_pos_embedding"][0]
    h = torch.cat([sd["cls_token"].expand(b, 1, d), tok.reshape(b, c * n, d)], dim=1)
    out = []
    for i in range(cfg.depth):
        a, f = f"transformer.layers.{i}.0", f"transformer.layers.{i}.1.net"
        q, k, v = (ln(h, f"{a}.norm") @ sd[f"{a}.to_qkv.weight"].T).chunk(3, dim=-1)
        heads = [torch.softmax(qh @ kh.transpose(1, 2) / cfg.dim_head ** 0.5, dim=-1) @ vh
                 for qh, kh, vh in zip(q.split(cfg.dim_head, -1), k.split(cfg.dim_head, -1),
                                       v.split(cfg.dim_head, -1), strict=True)]
        h = h + torch.cat(heads, -1) @ sd[f"{a}.to_out.0.weight"].T + sd[f"{a}.to_out.0.bias"]
        mlp = F.gelu(ln(h, f"{f}.0") @ sd[f"{f}.1.weight"].T + sd[f"{f}.1.bias"])
        h = h + mlp @ sd[f"{f}.4.weight"].T + sd[f"{f}.4.bias"]
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
    state = upstream_checkpoint(csfm.DEMO)
    path = tmp_path_factory.mktemp("csfm") / "CSFM_tiny.pth"
    torch.save(state, path)
    return path, state


def test_published_checkpoint_loads_strictly(ckpt):
    path, state = ckpt
    model = make(checkpoint=str(path))
    loaded = model.state_dict()
    expected = {k[len("encoder."):]: v for k, v in state.items()
                if k.startswith("encoder.") and not k.startswith("encoder.mlp_head.")}
    assert set(loaded) == set(expected)
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), key


def test_forward_matches_reference_on_loaded_weights(ckpt):
    path, state = ckpt
    model = make(checkpoint=str(path))
    sd = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    x = torch.from_numpy(np.stack([model.preprocess(r, 500) for r in records()]))
    ref = reference_states(sd, csfm.DEMO, x)
    ours = model.block_outputs(x)
    for r, o in zip(ref, ours, strict=True):
        torch.testing.assert_close(o, r, atol=2e-4, rtol=1e-4)
    model.profile = "published"  # mean over all tokens incl. CLS
    torch.testing.assert_close(model.layer_states(x), torch.stack([h.mean(1) for h in ref]), atol=2e-4, rtol=1e-4)
    # native: upstream's representation rule (pool='cls'): the CLS token, the last one after the final norm.
    # (Before issue 12 this expected the mean over the ECG patch tokens, a rule upstream never applies.)
    model.profile = "native"
    cls = [h[:, 0] for h in ref]
    cls[-1] = F.layer_norm(cls[-1], (csfm.DEMO.dim,), sd["transformer.norm.weight"], sd["transformer.norm.bias"])
    torch.testing.assert_close(model.layer_states(x), torch.stack(cls), atol=2e-4, rtol=1e-4)


def test_renamed_key_is_named_in_the_error(ckpt, tmp_path):
    _, state = ckpt
    bad = dict(state)
    bad["encoder.transformer.layers.0.0.to_qkv.weights"] = bad.pop("encoder.transformer.layers.0.0.to_qkv.weight")
    path = tmp_path / "renamed.pth"
    torch.save(bad, path)
    with pytest.raises(CheckpointError, match=r"to_qkv\.weights") as err:
        make(checkpoint=str(path))
    assert "transformer.layers.0.0.to_qkv.weight" in str(err.value) and str(path) in str(err.value)


def test_wrong_format_and_wrong_shape_fail(ckpt, tmp_path):
    _, state = ckpt
    path = tmp_path / "wrapped.pth"
    torch.save({"model": {k[len("encoder."):]: v for k, v in state.items()}}, path)
    with pytest.raises(CheckpointError, match="encoder"):
        make(checkpoint=str(path))
    wide = dict(state)
    wide["encoder.cls_token"] = torch.zeros(1, 1, csfm.DEMO.dim + 1)
    torch.save(wide, path)
    with pytest.raises(CheckpointError, match="cls_token"):
        make(checkpoint=str(path))
    with pytest.raises(CheckpointError, match="not found"):
        make(checkpoint=str(tmp_path / "missing.pth"))


def test_preprocess_shapes_and_normalisation():
    native, published = make(profile="native"), make(profile="published")
    for fs, seconds in ((500, 10), (100, 10), (500, 12), (250, 8)):
        rec = records(1, fs, seconds)[0]
        for model in (native, published):
            x = model.preprocess(rec, fs)
            assert x.shape == (12, 2500) and x.dtype == np.float32 and np.isfinite(x).all()
    rec = records(1)[0]
    x = native.preprocess(rec, 500)  # z-scored last: exact per-lead moments
    np.testing.assert_allclose(x.mean(1), 0, atol=1e-4)
    np.testing.assert_allclose(x.std(1), 1, atol=1e-4)
    # published: per-lead z-score at 500 Hz, then FFT resampling to 2,500 samples (the protocol's order)
    z = (rec - rec.mean(1, keepdims=True)) / rec.std(1, keepdims=True)
    np.testing.assert_allclose(published.preprocess(rec, 500), sps.resample(z, 2500, axis=1), atol=1e-4)
    # native cleans (removes baseline wander), published does not
    rec = records(1)[0] + 3 * np.sin(2 * np.pi * 0.1 * np.arange(5000) / 500)[None].astype(np.float32)
    low = np.abs(np.fft.rfft(native.preprocess(rec, 500)[0]))[:3].sum()
    assert low < 0.2 * np.abs(np.fft.rfft(published.preprocess(rec, 500)[0]))[:3].sum()
    assert np.isfinite(native.preprocess(np.zeros((12, 5000), np.float32), 500)).all()  # flat leads


def test_named_extra_groups_are_dropped_and_reported(ckpt, tmp_path):
    """Upstream loads with strict=False; raybench drops only the named groups (head, dense head, decoder)."""
    _, state = ckpt
    extra = {"encoder.dense_head.0.weight": torch.zeros(2, 3), "encoder.dense_scratch.layer1_rn.weight": torch.zeros(1),
             "decoder_pos_embedding": torch.zeros(1, 4, 8), "mask_token": torch.zeros(1, 1, 8)}
    path = tmp_path / "pretrain.pth"
    torch.save(state | extra, path)
    loaded = make(checkpoint=str(path)).state_dict()
    torch.testing.assert_close(loaded["cls_token"], state["encoder.cls_token"], rtol=0, atol=0)
    report = csfm.inspect_checkpoint(str(path), size="demo")
    assert report["dropped"] == {
        "decoder": ["decoder.proj.weight", "decoder_pos_embedding", "mask_token"],
        "dense_head": ["encoder.dense_head.0.weight", "encoder.dense_scratch.layer1_rn.weight"],
        "mlp_head": ["encoder.mlp_head.bias", "encoder.mlp_head.weight"]}
    assert report["missing"] == report["extra"] == report["shape_mismatch"] == []
    assert report["n_params"] == report["n_params_model"] == sum(v.numel() for v in loaded.values())
    assert report["published_params"] == csfm.UPSTREAM_TINY_PARAMS and report["variant"].startswith("not an upstream")


def test_unexpected_keys_are_refused_and_listed(ckpt, tmp_path):
    _, state = ckpt
    unknown = {"encoder.adapter.weight": torch.zeros(3), "projector.weight": torch.zeros(2, 2),
               "logit_scale": torch.zeros(())}
    path = tmp_path / "other.pth"
    torch.save(state | unknown, path)
    with pytest.raises(CheckpointError) as err:
        make(checkpoint=str(path))
    assert all(k in str(err.value) for k in unknown) and "missing []" in str(err.value)
    report = csfm.inspect_checkpoint(str(path), size="demo")  # inspect reports instead of failing
    assert report["extra"] == sorted(unknown) and report["missing"] == []
    assert len(report["loaded"]) == len(make().state_dict())


def test_other_upstream_variant_is_named(tmp_path):
    """A CSFM-Base file (12 x 768, mlp 3072) is refused with its name, not a flood of shape errors."""
    base = {"encoder.cls_token": torch.zeros(1, 1, 768), "encoder.transformer.layers.0.0.to_qkv.weight":
            torch.zeros(3 * 768, 1), "encoder.transformer.layers.0.1.net.1.weight": torch.zeros(3072, 1),
            "encoder.transformer.layers.11.0.norm.weight": torch.zeros(1)}
    path = tmp_path / "CSFM_base.pth"
    torch.save(base, path)
    with pytest.raises(CheckpointError, match="CSFM-Base"):
        make(checkpoint=str(path))
    assert csfm.inspect_checkpoint(str(path), size="demo")["variant"] == "CSFM-Base"


@pytest.mark.slow
def test_full_size_states():
    model = make(size="full")
    assert (model.n_layers, model.d) == (6, 768)
    x = torch.from_numpy(np.stack([model.preprocess(r, 500) for r in records(2)]))
    s = model.layer_states(x)
    assert s.shape == (6, 2, 768) and torch.isfinite(s).all()
    torch.testing.assert_close(make(size="full").layer_states(x), s, atol=0, rtol=0)
    # the published tiny geometry: upstream names and shapes (checked without writing a ~350 MB file)
    expected = {k: v for k, v in upstream_shapes(csfm.FULL).items() if not k.startswith("mlp_head.")}
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected


def test_vectorized_cleaning_equals_neurokit_ecg_clean():
    import neurokit2 as nk

    from raybench.encoders.models.csfm import nk_clean

    rng = np.random.default_rng(0)
    t = np.arange(2500) / 250.0
    x = (np.sin(2 * np.pi * 1.2 * t)[None] + 0.3 * np.sin(2 * np.pi * 50 * t)[None] + 0.5 * t[None]
         + 0.05 * rng.standard_normal((12, 2500))).astype(np.float32)
    ref = np.stack([nk.ecg_clean(lead.astype(np.float64), sampling_rate=250) for lead in x])
    np.testing.assert_allclose(nk_clean(x, 250), ref, atol=1e-5)
