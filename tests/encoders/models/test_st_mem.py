"""ST-MEM adapter: upstream checkpoint format, strict keys, forward vs an explicit reference, preprocessing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy import signal as sps

from raybench.encoders.base import CheckpointError, EncoderSpec, freeze
from raybench.encoders.models import st_mem


def make(size: str = "demo", checkpoint: str | None = None, profile: str = "native", seed: int = 0):
    """What build_encoder does for this factory: seed, build, set the profile, freeze."""
    torch.manual_seed(seed)
    spec = EncoderSpec("st_mem", size=size, checkpoint=checkpoint, profile=profile, init_seed=seed)
    return freeze(st_mem.build(spec))


def upstream_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Key names and shapes of upstream's ST_MEM_ViT encoder (no head)."""
    d, inner = cfg.dim, cfg.heads * cfg.dim_head
    shapes = {"to_patch_embedding.1.weight": (cfg.patch,), "to_patch_embedding.1.bias": (cfg.patch,),
              "to_patch_embedding.2.weight": (d, cfg.patch), "to_patch_embedding.2.bias": (d,),
              "to_patch_embedding.3.weight": (d,), "to_patch_embedding.3.bias": (d,),
              "pos_embedding": (1, cfg.patches + 2, d), "sep_embedding": (d,),
              "norm.weight": (d,), "norm.bias": (d,)}
    shapes |= {f"lead_embeddings.{i}": (d,) for i in range(cfg.leads)}
    for i in range(cfg.depth):
        a, f = f"block{i}.attn", f"block{i}.ff"
        shapes |= {f"{a}.norm.weight": (d,), f"{a}.norm.bias": (d,), f"{a}.fn.to_qkv.weight": (3 * inner, d),
                   f"{a}.fn.to_qkv.bias": (3 * inner,), f"{a}.fn.to_out.0.weight": (d, inner),
                   f"{a}.fn.to_out.0.bias": (d,), f"{f}.norm.weight": (d,), f"{f}.norm.bias": (d,),
                   f"{f}.fn.net.0.weight": (cfg.mlp_dim, d), f"{f}.fn.net.0.bias": (cfg.mlp_dim,),
                   f"{f}.fn.net.3.weight": (d, cfg.mlp_dim), f"{f}.fn.net.3.bias": (d,)}
    return shapes


def upstream_state(cfg, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(s, generator=g) * 0.2 for k, s in upstream_shapes(cfg).items()}


def reference_states(sd: dict[str, torch.Tensor], cfg, x: torch.Tensor) -> list[torch.Tensor]:
    """Upstream ST-MEM `forward_encoding` up to each block output, written out lead by lead."""
    b, n = x.shape[0], cfg.patches

    def ln(v, key):
        return F.layer_norm(v, (v.shape[-1],), sd[f"{key}.weight"], sd[f"{key}.bias"], eps=1e-5)

    pos, sep = sd["pos_embedding"][0], sd["sep_embedding"]
    seq = []
    for lead in range(cfg.leads):
        patches = ln(x[:, lead].reshape(b, n, cfg.patch), "to_patch_embedding.1")
        patches = ln(patches @ sd["to_patch_embedding.2.weight"].T + sd["to_patch_embedding.2.bias"],
                     "to_patch_embedding.3")
        row = torch.cat([(sep + pos[0]).expand(b, 1, -1), patches + pos[1:n + 1], (sep + pos[n + 1]).expand(b, 1, -1)],
                        dim=1)
        seq.append(row + sd[f"lead_embeddings.{lead}"])
    h = torch.cat(seq, dim=1)
    out = []
    for i in range(cfg.depth):
        a, f = f"block{i}.attn", f"block{i}.ff"
        q, k, v = (ln(h, f"{a}.norm") @ sd[f"{a}.fn.to_qkv.weight"].T + sd[f"{a}.fn.to_qkv.bias"]).chunk(3, -1)
        heads = [torch.softmax(qh @ kh.transpose(1, 2) / cfg.dim_head ** 0.5, dim=-1) @ vh
                 for qh, kh, vh in zip(q.split(cfg.dim_head, -1), k.split(cfg.dim_head, -1),
                                       v.split(cfg.dim_head, -1), strict=True)]
        h = h + torch.cat(heads, -1) @ sd[f"{a}.fn.to_out.0.weight"].T + sd[f"{a}.fn.to_out.0.bias"]
        mlp = F.gelu(ln(h, f"{f}.norm") @ sd[f"{f}.fn.net.0.weight"].T + sd[f"{f}.fn.net.0.bias"])
        h = h + mlp @ sd[f"{f}.fn.net.3.weight"].T + sd[f"{f}.fn.net.3.bias"]
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
    state = upstream_state(st_mem.DEMO)
    path = tmp_path_factory.mktemp("stmem") / "encoder.pth"
    # upstream's save_model layout; the encoder file carries the same entries
    torch.save({"epoch": 800, "model": state, "optimizer": None, "scaler": None,
                "config": {"model_name": "st_mem_vit_base", "train": {"blr": 1.0e-3}}}, path)
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
    ref = reference_states(state, st_mem.DEMO, x)
    for r, o in zip(ref, model.block_outputs(x), strict=True):
        torch.testing.assert_close(o, r, atol=2e-4, rtol=1e-4)
    n = st_mem.DEMO.patches
    model.profile = "published"  # mean over every token, SEP included
    torch.testing.assert_close(model.layer_states(x), torch.stack([h.mean(1) for h in ref]), atol=2e-4, rtol=1e-4)
    model.profile = "native"  # upstream's own pooling: drop the two SEP tokens of every lead
    patch_only = [h.reshape(2, 12, n + 2, -1)[:, :, 1:-1].mean(dim=(1, 2)) for h in ref]
    # the last one through the final norm, applied to the pooled vector as `forward_encoding` does
    # (before issue 12 the last native layer was the pre-norm mean)
    patch_only[-1] = F.layer_norm(patch_only[-1], (st_mem.DEMO.dim,), state["norm.weight"], state["norm.bias"])
    torch.testing.assert_close(model.layer_states(x), torch.stack(patch_only), atol=2e-4, rtol=1e-4)


def test_renamed_key_is_named_in_the_error(ckpt, tmp_path):
    _, state = ckpt
    bad = dict(state)
    bad["lead_embedding.7"] = bad.pop("lead_embeddings.7")
    path = tmp_path / "renamed.pth"
    torch.save({"model": bad}, path)
    with pytest.raises(CheckpointError, match=r"lead_embedding\.7") as err:
        make(checkpoint=str(path))
    assert "lead_embeddings.7" in str(err.value) and str(path) in str(err.value)


def test_wrong_format_and_head_fail(ckpt, tmp_path):
    _, state = ckpt
    path = tmp_path / "other.pth"
    torch.save({"encoder": state}, path)
    with pytest.raises(CheckpointError, match="'model'"):
        make(checkpoint=str(path))
    torch.save({"model": state | {"head.weight": torch.zeros(3, st_mem.DEMO.dim)}}, path)  # a fine-tuned model
    with pytest.raises(CheckpointError, match=r"unexpected \[head\.weight\]"):
        make(checkpoint=str(path))


def test_preprocess_shapes_and_profiles():
    native, published = make(profile="native"), make(profile="published")
    for fs, seconds in ((500, 10), (100, 10), (500, 12), (250, 8)):
        rec = records(1, fs, seconds)[0]
        for model in (native, published):
            x = model.preprocess(rec, fs)
            assert x.shape == (12, 2250) and x.dtype == np.float32 and np.isfinite(x).all()
    rec = records(1)[0]
    rec[3] *= 10  # relative lead amplitudes survive the joint z-score (native) but not per-lead (published)
    x = native.preprocess(rec, 500)
    assert abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-4
    assert x[3].std() / x[0].std() == pytest.approx(rec[3].std() / rec[0].std(), rel=0.1)
    # published: per-lead z-score at 500 Hz, FFT to 250 Hz (2,500), centre 2,250 - no filtering
    z = (rec - rec.mean(1, keepdims=True)) / rec.std(1, keepdims=True)
    np.testing.assert_allclose(published.preprocess(rec, 500), sps.resample(z, 2500, axis=1)[:, 125:2375], atol=1e-4)
    # native: upstream's eval transforms on the 250 Hz record: centre crop, order-5 zero-phase Butterworth
    # high-pass 0.67 Hz then low-pass 40 Hz, one z-score over all leads and samples
    hp = sps.butter(5, 0.67, btype="highpass", fs=250, output="sos")
    lp = sps.butter(5, 40, btype="lowpass", fs=250, output="sos")
    y = sps.sosfiltfilt(lp, sps.sosfiltfilt(hp, sps.resample(rec, 2500, axis=1)[:, 125:2375], axis=1), axis=1)
    np.testing.assert_allclose(x, (y - y.mean()) / y.std(), atol=1e-4)
    # a 0.1 Hz baseline drift is removed, a 10 Hz tone kept
    t = np.arange(5000) / 500
    tone = np.tile(np.sin(2 * np.pi * 10 * t), (12, 1)).astype(np.float32)
    drifted = native.preprocess(tone + 2 * np.sin(2 * np.pi * 0.1 * t).astype(np.float32), 500)[0]
    assert np.corrcoef(drifted, native.preprocess(tone, 500)[0])[0, 1] > 0.999


@pytest.mark.slow
def test_full_size_states():
    model = make(size="full")
    assert (model.n_layers, model.d) == (12, 768)
    x = torch.from_numpy(np.stack([model.preprocess(r, 500) for r in records(2)]))
    s = model.layer_states(x)
    assert s.shape == (12, 2, 768) and torch.isfinite(s).all()
    torch.testing.assert_close(make(size="full").layer_states(x), s, atol=0, rtol=0)
    # the published ViT-B/75 geometry: upstream names and shapes (checked without writing a ~350 MB file)
    expected = upstream_shapes(st_mem.FULL)
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected
