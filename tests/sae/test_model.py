"""BatchTopK SAE module: codes, init, normalizer."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raybench.core.config import SAEProtocol
from raybench.sae.model import (
    Normalizer,
    SAECellConfig,
    StackedBatchTopKSAE,
    _subsample,
    batch_topk,
    flat_nonzero,
    positions_at_least,
    sparse_decode,
    topk_mask,
)


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_cell_config_from_protocol():
    sae = SAEProtocol()
    c = SAECellConfig.from_protocol(sae, d=768, n_latents=6144, k=96, seed=4311)
    assert (c.d, c.n_latents, c.k, c.seed) == (768, 6144, 96, 4311)
    assert (c.steps, c.batch_size, c.lr, c.beta1, c.beta2) == (8000, 256, 3e-4, 0.9, 0.99)
    assert (c.aux_k, c.aux_coef, c.dead_after_batches, c.std_floor) == (512, 1 / 32, 5, 1e-6)
    with pytest.raises(ValueError, match="k=9 exceeds"):
        SAECellConfig.from_protocol(sae, d=8, n_latents=8, k=9, seed=1).validate()


def test_cell_config_takes_every_field_it_shares_with_the_protocol():
    """A field added to both SAEProtocol and SAECellConfig reaches the cell without touching from_protocol."""
    import dataclasses

    shared = {f.name for f in dataclasses.fields(SAEProtocol)} & {f.name for f in dataclasses.fields(SAECellConfig)}
    assert shared >= {"steps", "batch_size", "lr", "sampler", "grad_clip", "std_floor"}
    sae = SAEProtocol(steps=7, batch_size=9, lr=1e-3, beta1=0.5, beta2=0.6, aux_k=3, aux_coef=0.5,
                      dead_after_batches=2, std_floor=1e-3, sampler="epoch", grad_clip=2.0)
    c = SAECellConfig.from_protocol(sae, d=8, n_latents=16, k=2, seed=1)
    assert {name: getattr(c, name) for name in shared} == {name: getattr(sae, name) for name in shared}


def test_normalizer_zscores_with_floor():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(500, 4)).astype(np.float32)
    x[:, 2] = 7.0  # constant dimension
    norm = Normalizer.fit(x, std_floor=1e-6)
    np.testing.assert_allclose(norm.mean, x.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.std[[0, 1, 3]], x.std(0)[[0, 1, 3]], rtol=1e-5)
    assert norm.std[2] == pytest.approx(1e-6)
    z = norm.apply(x)
    assert z.dtype == np.float32 and np.allclose(z[:, 2], 0.0)
    np.testing.assert_allclose(z[:, [0, 1, 3]].std(0), 1.0, rtol=1e-4)
    np.testing.assert_allclose(norm.apply(torch.from_numpy(x)).numpy(), z, rtol=1e-6)
    with pytest.raises(ValueError, match="NaN"):
        Normalizer.fit(np.full((3, 2), np.nan, dtype=np.float32))


# the last two take the threshold path (the demo-sized one with a stride moved off N's factors)
@pytest.mark.parametrize("b,n,k", [(16, 64, 3), (64, 8192, 4), (128, 512, 8)])
def test_batch_topk_keeps_exactly_bk_largest(b, n, k):
    g = torch.Generator().manual_seed(1)
    p = torch.relu(torch.randn(2, b, n, generator=g))
    vals, flat = batch_topk(p, k)
    assert vals.shape == flat.shape == (2, b * k)
    for s in range(2):
        assert flat[s].unique().numel() == b * k
        ref = torch.sort(p[s].flatten(), descending=True).values[: b * k]
        torch.testing.assert_close(torch.sort(vals[s], descending=True).values, ref)
        torch.testing.assert_close(p[s].flatten()[flat[s]], vals[s])
    ex_vals, ex_flat = batch_topk(p, k, exact=True)
    for s in range(2):
        assert set(ex_flat[s].tolist()) == set(flat[s].tolist())


def test_topk_mask_is_batch_topks_set_or_none():
    """The band threshold keeps the exact top B*k; where it cannot know them it says so (None) instead."""
    g = torch.Generator().manual_seed(2)
    b, n, k = 64, 768, 96  # E = 1's density over a row long enough for the subsample (49,152 entries)
    p = torch.relu(torch.randn(3, b, n, generator=g))
    mask = topk_mask(p, k)
    _, flat = batch_topk(p, k, exact=True)
    assert mask.shape == (3, b * n) and mask.dtype == torch.bool
    for s in range(3):
        assert set(mask[s].nonzero().flatten().tolist()) == set(flat[s].tolist())
    sparse = p * (torch.rand(3, b, n, generator=g) < 0.05)  # under b*k positive entries: zeros would tie
    assert topk_mask(sparse, k) is None
    skewed = p.clone().view(3, -1)
    off = torch.ones(b * n, dtype=torch.bool)
    off[_subsample(torch.arange(b * n)[None], n)[0]] = False
    skewed[:, off] += 10.0  # the subsample sees only the small entries: its thresholds keep far too many
    assert topk_mask(skewed.view(3, b, n), k) is None
    assert topk_mask(p[:, :8], k) is None  # too short for a subsample
    assert topk_mask(p, n) is None  # the whole slice: nothing to select


def test_numpy_positions_equal_torch_nonzero():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 50, generator=g)
    x[1, 7] = 0.5  # on the threshold: kept (>=)
    assert torch.equal(flat_nonzero(x > 0), (x > 0).reshape(-1).nonzero().squeeze(1))
    assert torch.equal(flat_nonzero(torch.zeros(4, dtype=torch.bool)), torch.zeros(0, dtype=torch.long))
    got = positions_at_least(x[1], torch.tensor(0.5))
    assert torch.equal(got, (x[1] >= 0.5).nonzero().squeeze(1)) and 7 in got.tolist()


def test_encode_code_has_bk_nonzeros_and_sparse_dense_agree():
    sae = StackedBatchTopKSAE.from_seeds([1, 2], d=8, n_latents=32, k=3)
    x = torch.randn(2, 10, 8, generator=torch.Generator().manual_seed(0))
    dense, p = sae.encode(x, sparse=False)
    sparse, _ = sae.encode(x, sparse=True)
    assert p.shape == (2, 10, 32) and bool((p >= 0).all())
    for s in range(2):
        assert int((dense[s] != 0).sum()) == 10 * 3  # whole-batch budget, not per-row
        kept = dense[s][dense[s] != 0]
        assert kept.min() >= p[s][dense[s] == 0].max()  # nothing discarded beats anything kept
    torch.testing.assert_close(sparse.to_dense(), dense)
    torch.testing.assert_close(sae.decode(sparse), sae.decode(dense), atol=1e-6, rtol=1e-5)
    one = sparse_decode(sparse.values[0], sparse.flat[0], 10, 32, sae.W_dec_t[0])
    torch.testing.assert_close(one, dense[0] @ sae.W_dec[0].T, atol=1e-6, rtol=1e-5)


def test_init_per_seed_kaiming_and_unit_decoder():
    d, n = 16, 40
    stack = StackedBatchTopKSAE.from_seeds([7, 8, 9], d, n, 2)
    alone = [StackedBatchTopKSAE.from_seeds([s], d, n, 2) for s in (7, 8, 9)]
    for i, one in enumerate(alone):
        for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
            assert torch.equal(getattr(stack, name)[i], getattr(one, name)[0])
    w = stack.W_enc[0].detach()
    bound = 1 / math.sqrt(d)  # kaiming_uniform with a = sqrt(5)
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.8 * bound
    assert not torch.equal(stack.W_enc[0], stack.W_enc[1])
    assert stack.W_dec.shape == (3, d, n)
    torch.testing.assert_close(stack.W_dec.norm(dim=1), torch.ones(3, n))
    torch.testing.assert_close(stack.W_dec[0], (w / w.norm(dim=1, keepdim=True)).T)
    assert not stack.b_enc.detach().any() and not stack.b_dec.detach().any()
    assert torch.equal(stack.single(1).W_enc[0], stack.W_enc[1])
    assert torch.equal(StackedBatchTopKSAE.stack(alone).W_dec_t, stack.W_dec_t)
