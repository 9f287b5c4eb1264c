"""Gradient kernels of the sparse training step (raybench.sae.step): work on the code's non-zeros only.

A BatchTopK code has B*k non-zeros (plus the AuxK entries), so the decoder forward, every decoder/encoder
gradient and the parallel-gradient projection are computed from those entries (SDDMM + embedding_bag
kernels) instead of dense [B, N] matrices. Each function adds into the per-SAE row gradients it is given.
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F

# AuxK entries are B * min(aux_k, n_dead) scattered (sample, dead latent) pairs. While the dead
# latents they touch are few, four small dense GEMMs over just those latents beat per-entry
# gathers (each decoder row is read once, not once per sample); beyond ~16 * aux_k touched latents
# the per-entry kernels win (measured on the 2-core box at E = 32: bench/sae_train.py).
AUX_BLOCK_MAX_RATIO = 16


# glibc serves allocations over 32 MiB by a fresh mmap, so a larger temporary page-faults in on every step
# (~11 ms for a [14k, 768] float32 block at E = 32, ten times the kernel): bag sums are added in chunks below it
BAG_CHUNK_BYTES = 16 << 20


def bag_sum(idx: torch.Tensor, table: torch.Tensor, offsets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Per bag (entries offsets[i]:offsets[i+1]): sum of weights * table[idx], i.e. embedding_bag(mode="sum").

    Indices go in as int32: the same sums bit for bit, and torch's CPU kernel for int32 indices is faster.
    """
    return F.embedding_bag(idx.int(), table, offsets.int(), mode="sum", per_sample_weights=weights)


def add_bags(out: torch.Tensor, targets: torch.Tensor, idx: torch.Tensor, table: torch.Tensor,
             offsets: torch.Tensor, weights: torch.Tensor, fresh: bool = False) -> None:
    """out[targets[i]] += bag i's weighted sum of table rows (`targets` distinct, ascending), a chunk of bags at a
    time so that no temporary reaches the mmap threshold (BAG_CHUNK_BYTES). `fresh`: `out` holds stale values, so
    the other rows are zeroed and these set; when the bags cover every row that is one copy, no memset and no
    read-modify-write (the usual case at E = 1, where every latent fires in a step)."""
    n_bags, m = offsets.numel(), idx.numel()
    every_row = fresh and n_bags == out.shape[0]
    if fresh and not every_row:
        out.zero_()
    step = max(1, BAG_CHUNK_BYTES // (table.shape[1] * table.element_size()))
    for lo in range(0, n_bags, step):
        hi = min(lo + step, n_bags)
        a = int(offsets[lo])
        b = int(offsets[hi]) if hi < n_bags else m
        bags = bag_sum(idx[a:b], table, offsets[lo:hi] - a, weights[a:b])
        if every_row:
            out[lo:hi].copy_(bags)
        else:
            out.index_add_(0, targets[lo:hi], bags)


# a per-row top-k keeping at least 1/ROW_SELECT_MAX_RATIO of each row runs as numpy's introselect (argpartition) on
# CPU: torch's CPU topk costs ~10 ns per entry there (demo E = 32's AuxK rows, 128 x ~550 keep 64: 0.6 vs 0.25 ms);
# for sparser picks torch's heap-based topk is the faster one (256 x 24,000 keep 96: 16 vs 45 ms)
ROW_SELECT_MAX_RATIO = 64


def row_topk(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, positions) of the k largest entries of each row of `x` [B, n], in no particular order: what
    `x.topk(k, dim=1, sorted=False)` keeps. Where the k-th largest value ties, either picks one of the tied
    entries, not always the same one (both are top-k sets; see docs/architecture.md §5)."""
    n = x.shape[1]
    if x.device.type != "cpu" or k * ROW_SELECT_MAX_RATIO < n or k >= n:
        return x.topk(k, dim=1, sorted=False)
    pos = torch.from_numpy(np.argpartition(x.detach().numpy(), n - k, axis=1)[:, n - k:])
    return x.gather(1, pos), pos


class AuxGrads(NamedTuple):
    """The AuxK term's gradients (scaled by its coefficient) and value."""

    touched: torch.Tensor
    """[u] the dead latents whose rows were added to."""
    loss: torch.Tensor
    """() the AuxK value before aux_coef: MSE of the dead latents' reconstruction of the residual."""


def project_rows(gwd: torch.Tensor, w_dec: torch.Tensor, cdot: torch.Tensor, touched: torch.Tensor) -> None:
    """gwd_j -= <gwd_j, w_j> w_j (w_j unit), with the dot products `cdot` already summed from the code entries
    (<sum_b z_bj g_b, w_j> = sum_b z_bj <g_b, w_j>, and <g_b, w_j> is the SDDMM value): no [N, d] dot pass.
    Only `touched` rows are non-zero; when most rows are touched one fused pass beats gather + scatter.
    """
    if touched.numel() * 4 < gwd.shape[0]:
        gwd.index_add_(0, touched, w_dec.index_select(0, touched) * cdot.index_select(0, touched).unsqueeze(1),
                       alpha=-1.0)
    else:
        gwd.addcmul_(cdot.unsqueeze(1), w_dec, value=-1.0)


def entry_grads(crow: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, gup: torch.Tensor,
                w_dec: torch.Tensor, xc: torch.Tensor, gwd: torch.Tensor, gwe: torch.Tensor, gbe: torch.Tensor,
                cdot: torch.Tensor, corder: torch.Tensor | None = None, fresh: bool = False) -> torch.Tensor:
    """Gradients from code entries (row-major, CSR `crow`) whose reconstruction gets upstream grad `gup` [B, d].

    Adds into the decoder/encoder row grads and b_enc grad, and <dL/dw_j, w_j> into `cdot`; returns the latents
    whose rows were added to, ascending. `corder`: argsort(cols) when the caller has it. `fresh`: gwd and gwe hold
    stale values; they are overwritten (rows without entries zeroed) instead of added to. The gradient reaching
    the input (for b_dec) is left to the caller: its batch sum is gbe @ w_enc.
    """
    b, n = gup.shape[0], w_dec.shape[0]
    with warnings.catch_warnings():  # "CSR support is in beta": used here only as the SDDMM pattern
        warnings.simplefilter("ignore")
        mask = torch.sparse_csr_tensor(crow, cols, vals, (b, n), check_invariants=False)  # built sorted
    dz = torch.sparse.sampled_addmm(mask, gup, w_dec.T, beta=0.0).values()  # <gup[b], w_dec[j]> per entry
    dpre = dz * (vals > 0)  # ReLU gate
    cdot.index_add_(0, cols, dz * vals)
    corder = torch.argsort(cols) if corder is None else corder
    cs = cols.index_select(0, corder)
    uniq, counts = torch.unique_consecutive(cs, return_counts=True)
    coffs = torch.cumsum(counts, 0) - counts
    r = rows.index_select(0, corder).int()
    coffs = coffs.int()
    add_bags(gwd, uniq, r, gup, coffs, vals.index_select(0, corder), fresh)
    add_bags(gwe, uniq, r, xc, coffs, dpre.index_select(0, corder), fresh)
    gbe.index_add_(0, cols, dpre)
    return uniq


def _aux_block(z: torch.Tensor, lat: torch.Tensor, coef: float, e: torch.Tensor, w_dec: torch.Tensor,
               xc: torch.Tensor, gwd: torch.Tensor, gwe: torch.Tensor, gbe: torch.Tensor,
               cdot: torch.Tensor) -> AuxGrads:
    """The AuxK term from its code as a dense block z [B, u] over latents `lat` [u] (ascending): small GEMMs."""
    b, d = e.shape
    wu = F.embedding(lat, w_dec)
    ea = z @ wu + e  # aux recon - (x - x_hat)
    ga = ea * (2.0 * coef / (b * d))
    dz = ga @ wu.T
    dpre = dz * (z > 0)
    cdot.index_add_(0, lat, (dz * z).sum(dim=0))
    gwd.index_add_(0, lat, z.T @ ga)
    gwe.index_add_(0, lat, dpre.T @ xc)
    gbe.index_add_(0, lat, dpre.sum(dim=0))
    return AuxGrads(lat, ea.square().mean())


def aux_grads(p: torch.Tensor, dead: torch.Tensor, aux_k: int, coef: float, e: torch.Tensor, w_dec: torch.Tensor,
              xc: torch.Tensor, gwd: torch.Tensor, gwe: torch.Tensor, gbe: torch.Tensor,
              cdot: torch.Tensor) -> AuxGrads:
    """AuxK: per sample the top-aux_k dead pre-activations reconstruct the residual x - x_hat (detached).

    Adds its gradients (scaled by `coef`) into the row grads and `cdot`. Three equivalent layouts of the same
    entries, by size: a dense block over all dead latents (few dead: no index bookkeeping at all), a dense block
    over the dead latents the entries touch, or per-entry kernels (entry_grads). Block columns without entries
    add exact zeros.
    """
    b = p.shape[0]
    dead_idx = dead.nonzero().squeeze(1)
    kx = min(aux_k, dead_idx.numel())
    pd = p.index_select(1, dead_idx)  # [B, n_dead]
    if kx == dead_idx.numel():
        vals, pos = pd, None
    else:
        vals, pos = row_topk(pd, kx)
    if dead_idx.numel() <= AUX_BLOCK_MAX_RATIO * kx:
        z = pd if pos is None else torch.zeros_like(pd).scatter_(1, pos, vals)
        return _aux_block(z, dead_idx, coef, e, w_dec, xc, gwd, gwe, gbe, cdot)
    cols = dead_idx.expand(b, kx) if pos is None else dead_idx[pos]  # [B, kx]
    uniq = torch.unique(cols)
    if uniq.numel() <= AUX_BLOCK_MAX_RATIO * kx:
        where = dead_idx.new_empty(p.shape[1])  # latent -> its column in the block
        where[uniq] = torch.arange(uniq.numel(), device=p.device)
        z = p.new_zeros(b, uniq.numel()).scatter_(1, where[cols], vals)
        return _aux_block(z, uniq, coef, e, w_dec, xc, gwd, gwe, gbe, cdot)
    cols, o = cols.sort(dim=1)  # CSR wants sorted columns within a row
    vals = vals.gather(1, o).reshape(-1)
    cols = cols.reshape(-1)
    rows = torch.arange(b, device=p.device).repeat_interleave(kx)
    crow = torch.arange(b + 1, device=p.device) * kx
    ea = bag_sum(cols, w_dec, crow[:-1], vals) + e
    ga = ea * (2.0 * coef / (b * e.shape[1]))
    touched = entry_grads(crow, rows, cols, vals, ga, w_dec, xc, gwd, gwe, gbe, cdot)
    return AuxGrads(touched, ea.square().mean())
