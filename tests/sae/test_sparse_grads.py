"""The AuxK gradient kernels: each of the three layouts (dense block over every dead latent, dense block over the
touched dead latents, per-entry kernels) against autograd on the dense formula."""

from __future__ import annotations

import pytest
import torch

import raybench.sae.sparse_grads as sparse_grads


def _case():
    g = torch.Generator().manual_seed(3)
    b, n, d, aux_k, coef = 6, 40, 5, 3, 0.25
    w_enc = torch.randn(n, d, generator=g, dtype=torch.float64)
    b_enc = torch.randn(n, generator=g, dtype=torch.float64) * 0.1
    w_dec = torch.nn.functional.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=1)
    xc = torch.randn(b, d, generator=g, dtype=torch.float64)
    e = torch.randn(b, d, generator=g, dtype=torch.float64)  # x_hat - x of the main code
    dead = torch.zeros(n, dtype=torch.bool)
    dead[10:] = True  # 30 dead latents
    b_enc[[12, 17, 25, 33]] += 8.0  # four dead latents dominate every sample's top-aux_k: few touched
    return b, n, d, aux_k, coef, w_enc, b_enc, w_dec, xc, e, dead


def _autograd(case):
    b, n, d, aux_k, coef, w_enc, b_enc, w_dec, xc, e, dead = case
    we, be, wd = (t.clone().requires_grad_() for t in (w_enc, b_enc, w_dec))
    p = torch.relu(xc @ we.T + be)
    pd = p[:, dead]
    v, j = pd.topk(aux_k, dim=1)
    zd = torch.zeros_like(pd).scatter(1, j, v)
    aux = (zd @ wd[dead] + e).square().mean()
    (coef * aux).backward()
    return aux.detach(), we.grad, be.grad, wd.grad, (wd.grad * w_dec).sum(dim=1)


@pytest.mark.parametrize("select_ratio", [64, 0])  # row top-k by argpartition / by torch.topk
@pytest.mark.parametrize("ratio, layout", [(16, "all dead"), (2, "touched"), (1, "entries")])
def test_aux_grads_layouts_equal_autograd(ratio, layout, select_ratio, monkeypatch):
    monkeypatch.setattr(sparse_grads, "AUX_BLOCK_MAX_RATIO", ratio)
    monkeypatch.setattr(sparse_grads, "ROW_SELECT_MAX_RATIO", select_ratio)
    case = _case()
    b, n, d, aux_k, coef, w_enc, b_enc, w_dec, xc, e, dead = case
    p = torch.relu(xc @ w_enc.T + b_enc)
    touched_cols = torch.unique(p[:, dead].topk(aux_k, dim=1).indices)
    n_dead = int(dead.sum())
    want = {"all dead": n_dead <= ratio * aux_k,
            "touched": n_dead > ratio * aux_k >= touched_cols.numel(),
            "entries": touched_cols.numel() > ratio * aux_k}
    assert want[layout], (n_dead, touched_cols.numel())  # the case really takes the layout under test
    gwd, gwe = torch.zeros(n, d, dtype=torch.float64), torch.zeros(n, d, dtype=torch.float64)
    gbe, cdot = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)
    out = sparse_grads.aux_grads(p, dead, aux_k, coef, e, w_dec, xc, gwd, gwe, gbe, cdot)
    aux, g_we, g_be, g_wd, ref_cdot = _autograd(case)
    torch.testing.assert_close(out.loss, aux, rtol=1e-12, atol=0)
    for got, ref in ((gwd, g_wd), (gwe, g_we), (gbe, g_be), (cdot, ref_cdot)):
        torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-15)
    assert set(torch.nonzero(g_wd.abs().sum(dim=1)).squeeze(1).tolist()) <= set(out.touched.tolist())


@pytest.mark.parametrize("n, k", [(553, 64), (1000, 16), (24000, 96), (50, 50), (7, 9)])
def test_row_topk_keeps_what_torch_topk_keeps(n, k):
    x = torch.randn(16, n, generator=torch.Generator().manual_seed(n)).relu_() + torch.rand(16, n) * 1e-3  # no ties
    kk = min(k, n)
    vals, pos = sparse_grads.row_topk(x, kk)
    ref = x.topk(kk, dim=1).indices
    assert pos.shape == (16, kk) and pos.dtype == torch.int64
    assert torch.equal(pos.sort(dim=1).values, ref.sort(dim=1).values)
    assert torch.equal(vals, x.gather(1, pos))


def test_bag_sum_equals_weighted_row_sums():
    """bag_sum (int32 indices) against an explicit loop, including a one-entry bag and int64 inputs."""
    g = torch.Generator().manual_seed(5)
    table = torch.randn(7, 4, generator=g)
    idx = torch.tensor([3, 0, 3, 6, 1, 2])
    offsets = torch.tensor([0, 2, 3])  # bags [3, 0], [3], [6, 1, 2]
    w = torch.rand(6, generator=g)
    got = sparse_grads.bag_sum(idx, table, offsets, w)
    bags = [(0, 2), (2, 3), (3, 6)]
    want = torch.stack([(w[a:b, None] * table[idx[a:b]]).sum(dim=0) for a, b in bags])
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    ref = torch.nn.functional.embedding_bag(idx, table, offsets, mode="sum", per_sample_weights=w)
    assert torch.equal(got, ref)  # int32 indices: the same sums bit for bit


@pytest.mark.parametrize("chunk_bags", [1, 2, 3, 100])
def test_add_bags_in_chunks_equals_one_pass(chunk_bags, monkeypatch):
    """Chunking the bags (to keep temporaries under the mmap threshold) changes no bit of the result."""
    g = torch.Generator().manual_seed(11)
    n, d, m, n_bags = 20, 6, 30, 9
    table = torch.randn(12, d, generator=g)
    idx = torch.randint(0, 12, (m,), generator=g)
    offsets = torch.sort(torch.randperm(m - 1, generator=g)[:n_bags - 1] + 1).values
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), offsets])
    targets = torch.randperm(n, generator=g)[:n_bags]
    w = torch.rand(m, generator=g)
    base = torch.randn(n, d, generator=g)
    want = base.clone().index_add_(0, targets, torch.nn.functional.embedding_bag(
        idx, table, offsets, mode="sum", per_sample_weights=w))
    monkeypatch.setattr(sparse_grads, "BAG_CHUNK_BYTES", chunk_bags * d * table.element_size())
    got = base.clone()
    sparse_grads.add_bags(got, targets, idx, table, offsets, w)
    assert torch.equal(got, want)


@pytest.mark.parametrize("every_row", [False, True])
def test_add_bags_fresh_overwrites_stale_rows(every_row, monkeypatch):
    """fresh=True: the stale rows the bags miss become zero and the others the bag sums (one copy when the bags
    cover every row), in chunks or not: the same bits as zeroing, then adding."""
    g = torch.Generator().manual_seed(12)
    n_bags, d, m = 9, 6, 30
    n = n_bags if every_row else 20
    table = torch.randn(12, d, generator=g)
    idx = torch.randint(0, 12, (m,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long),
                         torch.sort(torch.randperm(m - 1, generator=g)[:n_bags - 1] + 1).values])
    targets = torch.arange(n) if every_row else torch.sort(torch.randperm(n, generator=g)[:n_bags]).values
    w = torch.rand(m, generator=g)
    want = torch.zeros(n, d).index_add_(0, targets, torch.nn.functional.embedding_bag(
        idx, table, offsets, mode="sum", per_sample_weights=w))
    for chunk_bags in (2, 100):
        monkeypatch.setattr(sparse_grads, "BAG_CHUNK_BYTES", chunk_bags * d * table.element_size())
        got = torch.randn(n, d, generator=g)  # last step's values
        sparse_grads.add_bags(got, targets, idx, table, offsets, w, fresh=True)
        assert torch.equal(got, want)
