"""One optimisation step of a stack of BatchTopK SAEs (docs/protocol.md §6.3-§6.5), two implementations.

"dense" is plain autograd on the dense [B, N] code (the reference); "sparse" uses that the code has only
B*k non-zeros (plus the AuxK entries) and computes the decoder forward, all decoder/encoder gradients and
the parallel-gradient projection on those entries only (raybench.sae.sparse_grads); the only O(N d) work
left is the encoder GEMM, Adam and the decoder renormalisation. Optional gradient-norm clipping is per SAE,
over W_enc, b_enc, W_dec and b_dec jointly, on the gradient before the decoder projection, with
torch.nn.utils.clip_grad_norm_'s arithmetic (coef = max_norm / (norm + 1e-6), capped at 1).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from raybench.sae.adam import StackAdam
from raybench.sae.model import SAECellConfig, StackedBatchTopKSAE, batch_topk, flat_nonzero, topk_mask
from raybench.sae.sparse_grads import aux_grads, bag_sum, entry_grads, project_rows

# "auto" picks the dense reference for small problems whose codes are denser than 1/32 (the demo's E = 1: d 64,
# k 8, B 128): there the dense GEMMs cost less than the sparse path's per-entry bookkeeping. From a GEMM of
# AUTO_DENSE_MAX_WORK multiply-adds (B x N x d) on, sparse wins even at 1/8 density (the paper's E = 1: 2x).
AUTO_DENSE_ABOVE = 32
AUTO_DENSE_MAX_WORK = 1 << 24
# the SAEs of a stack run on concurrent threads (each thread's kernels still use torch's intra-op pool) from this
# many latents on: larger SAEs spend most of a step in single-threaded sparse kernels, smaller ones would only
# pay thread hand-offs (bench/sae_train.py: E = 32 about 9% faster per SAE, E = 1 slower)
THREADED_MIN_LATENTS = 4096
IMPLEMENTATIONS = ("sparse", "dense", "auto")
_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (width, pool) shared by every Stepper of the process


def _stack_threads(width: int) -> ThreadPoolExecutor:
    """The process's one pool for running the SAEs of a stack concurrently (a trial process trains many stacks:
    one pool per Stepper would leave idle threads behind), as wide as torch's intra-op pool."""
    global _POOL
    if _POOL is None or _POOL[0] != width:
        if _POOL is not None:
            _POOL[1].shutdown(wait=False)
        _POOL = (width, ThreadPoolExecutor(max_workers=width, thread_name_prefix="raybench-sae"))
    return _POOL[1]


def auto_implementation(d: int, n_latents: int, k: int, batch_size: int) -> str:
    """What implementation="auto" runs for SAEs of this shape: "dense" only for small problems with dense codes."""
    small = batch_size * n_latents * d < AUTO_DENSE_MAX_WORK
    return "dense" if small and k * AUTO_DENSE_ABOVE > n_latents else "sparse"


class StepLoss(NamedTuple):
    """The loss terms of one step, per SAE of the stack."""

    mse: torch.Tensor
    """[S] reconstruction MSE (normalized space, mean over batch x d)."""
    aux: torch.Tensor
    """[S] AuxK term before aux_coef (0 while no latent is dead)."""


def total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Per row (SAE) of each [S, *] gradient: the 2-norm of the per-tensor 2-norms (clip_grad_norm_'s total norm)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads]), dim=0)


def clip_coef(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6), capped at 1."""
    return torch.clamp(max_norm / (norm + 1e-6), max=1.0)


# unthreaded stacks run their sparse step as one block-diagonal SAE (Stepper._whole_stack); False: SAE by SAE (the
# same numbers; tests compare the two)
WHOLE_STACK = True
# codes at least this dense (B*N <= ratio * B*k, e.g. E = 1 with k = d/8) take their CSR order from a [B, N] mask (a
# scatter and a nonzero pass) instead of sorting the B*k entries
MASK_LAYOUT_MAX_RATIO = 16


def sparse_layout(p: torch.Tensor, k: int) -> tuple[torch.Tensor, ...]:
    """The BatchTopK entries of each SAE's [B, N] slice of `p` [S, B, N] in CSR order -> (rows, cols, vals [S, M],
    crow [S, B+1] row pointers, corder [S, M]: the CSR positions in column-major order, rows ascending within a
    column)."""
    s_n, b, n = p.shape
    m = min(b * k, b * n)
    at = torch.arange(s_n, device=p.device)[:, None]
    if b * n > MASK_LAYOUT_MAX_RATIO * m:
        vals, flat = batch_topk(p, k)
        flat, order = torch.sort(flat, dim=1)
        vals = vals.gather(1, order)
        mask = None
    else:
        mask = topk_mask(p, k)
        if mask is None:
            mask = torch.zeros(s_n, b * n, dtype=torch.bool, device=p.device).scatter_(1, batch_topk(p, k).flat, True)
        flat = flat_nonzero(mask).view(s_n, m) - at * (b * n)  # row-major: CSR order
        vals = p.reshape(s_n, -1).gather(1, flat)
    rows = torch.div(flat, n, rounding_mode="floor")
    cols = flat - rows * n
    if mask is None:
        crow = torch.searchsorted(rows, torch.arange(b + 1, device=p.device).expand(s_n, b + 1).contiguous())
    else:
        crow = torch.zeros(s_n, b + 1, dtype=torch.long, device=p.device)
        torch.cumsum(mask.view(s_n, b, n).sum(dim=2), dim=1, out=crow[:, 1:])
    # column-major with rows ascending = a stable sort of the CSR-ordered columns (in the mask layout 2.5 vs 5.9 ms
    # at E = 1, S = 3 on 2 threads, against a rank cumsum over the whole mask and a nonzero pass over its transpose),
    # done as one 1-D int32 sort of (SAE, column) keys, which torch runs as a radix sort: 0.5 ms against 1.4 ms for
    # a sort per row (E = 1, S = 3)
    corder = torch.sort((cols + at * n).view(-1).int(), stable=True).indices.view(s_n, m) - at * m
    return rows, cols, vals, crow, corder


class Stepper:
    """One optimisation step for the whole stack; holds Adam and the dead counters."""

    def __init__(self, sae: StackedBatchTopKSAE, cfgs: list[SAECellConfig], implementation: str):
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be 'sparse', 'dense' or 'auto', got {implementation!r}")
        if implementation == "auto":
            implementation = auto_implementation(sae.d, sae.n_latents, sae.k, cfgs[0].batch_size)
        self.sae, self.cfgs, self.impl = sae, cfgs, implementation
        c = cfgs[0]
        dev = sae.W_enc.device
        self.params = [sae.W_enc, sae.b_enc, sae.W_dec_t, sae.b_dec]
        # Adam is elementwise, so one optimizer over the stacked tensors equals S separate ones
        # (all stacked SAEs share lr and betas: checked in train_stack); torch's fused kernel, called directly
        self.opt = StackAdam(self.params, lr=c.lr, betas=(c.beta1, c.beta2))
        self.dead_counter = torch.zeros(sae.n_saes, sae.n_latents, dtype=torch.long, device=dev)
        self.aux_k = [cf.aux_k for cf in cfgs]
        self.aux_coef = [cf.aux_coef for cf in cfgs]
        self.dead_after = [cf.dead_after_batches for cf in cfgs]
        self._dead_after_col = torch.tensor(self.dead_after, device=dev)[:, None]  # [S, 1], for the whole stack
        self.grad_clip = c.grad_clip  # shared by the stack (checked in train_stack)
        self.last_grad_norm: torch.Tensor | None = None  # [S] pre-clip total norm of the last step (clipping only)
        self._pre: torch.Tensor | None = None  # the sparse path's pre-activation buffer
        if implementation == "sparse":
            for p in self.params:
                p.grad = torch.zeros_like(p)

    def _update_dead(self, i: int, fired_cols: torch.Tensor) -> torch.Tensor:
        fired = torch.zeros(self.sae.n_latents, dtype=torch.bool, device=fired_cols.device)
        fired[fired_cols] = True
        cnt = self.dead_counter[i]
        cnt.add_(1).masked_fill_(fired, 0)
        return cnt >= self.dead_after[i]

    def step(self, xb: torch.Tensor, renormalize: bool = False) -> StepLoss:
        """One step. `renormalize`: as the published loop, re-normalise W_dec after the backward pass and project
        the decoder gradient on the re-normalised columns. The published loop does that every step, but after a
        step W_dec is unit to working precision, so it matters only on a run's first step (the float32 init's
        column norms are 1 +- 6e-8): train_stack asks for it there only.
        """
        loss = self._sparse(xb, renormalize) if self.impl == "sparse" else self._dense(xb, renormalize)
        self.opt.step()
        self.sae.normalize_decoder_()
        return loss

    # ------------------------------------------------------------ dense reference (autograd)
    def _dense(self, xb: torch.Tensor, renormalize: bool = False) -> StepLoss:
        sae = self.sae
        s_n, b, _ = xb.shape
        self.opt.zero_grad()
        p = sae.pre_activations(xb)
        flat = p.reshape(s_n, -1)
        vals, idx = flat.topk(min(b * sae.k, flat.shape[1]), dim=1, sorted=False)
        z = torch.zeros_like(flat).scatter(1, idx, vals).view_as(p)
        x_hat = torch.bmm(z, sae.W_dec_t) + sae.b_dec.unsqueeze(1)
        mse = (x_hat - xb).square().mean(dim=(1, 2))
        auxs = []
        for i in range(s_n):
            with torch.no_grad():
                dead = self._update_dead(i, (z[i] > 0).any(dim=0).nonzero().squeeze(1))
            if not bool(dead.any()):
                auxs.append(mse.new_zeros(()))
                continue
            pd = p[i][:, dead]
            kx = min(self.aux_k[i], pd.shape[1])
            v, pos = pd.topk(kx, dim=1)
            zd = torch.zeros_like(pd).scatter(1, pos, v)
            recon = zd @ sae.W_dec_t[i][dead]
            resid = (xb[i] - x_hat[i]).detach()
            auxs.append((recon - resid).square().mean())
        aux = torch.stack(auxs)
        loss = (mse + torch.tensor(self.aux_coef, device=xb.device) * aux).sum()
        loss.backward()
        with torch.no_grad():
            if self.grad_clip is not None:  # as published: clip first, then project the decoder gradient
                grads = [p.grad for p in self.params]
                self.last_grad_norm = total_norm([g_.reshape(s_n, -1) for g_ in grads])
                coef = clip_coef(self.last_grad_norm, self.grad_clip)
                for g_ in grads:
                    g_.mul_(coef.view(-1, *([1] * (g_.dim() - 1))))
            g, w = sae.W_dec_t.grad, sae.W_dec_t
            if renormalize:
                sae.normalize_decoder_()
            g.sub_((g * w).sum(dim=2, keepdim=True) * w)
        return StepLoss(mse.detach(), aux.detach())

    # ------------------------------------------------------------ sparse path (manual gradients)
    def _pre_buffer(self, s_n: int, b: int) -> torch.Tensor:
        """The [S, B, N] pre-activation buffer, kept across steps: a fresh one per step costs page faults."""
        w = self.sae.W_enc
        shape = (s_n, b, self.sae.n_latents)
        if self._pre is None or self._pre.shape != shape or self._pre.dtype != w.dtype:
            self._pre = torch.empty(shape, dtype=w.dtype, device=w.device)
        return self._pre

    @torch.no_grad()
    def _sparse(self, xb: torch.Tensor, renormalize: bool = False) -> StepLoss:
        sae = self.sae
        s_n, b, d = xb.shape
        xc = xb - sae.b_dec.unsqueeze(1)
        p = self._pre_buffer(s_n, b)
        for i in range(s_n):  # per SAE: one batched baddbmm over the stack ran ~5% slower (MKL, E = 8 and 32)
            torch.addmm(sae.b_enc[i], xc[i], sae.W_enc[i].t(), out=p[i])
        p.relu_()
        # the whole stack at once (rows run in parallel): CSR order of the BatchTopK entries, their rows and
        # columns, the CSR row pointers, and the column-major (CSC) order the gradient kernels use
        rows_all, cols_all, vals_all, crow_all, corder_all = sparse_layout(p, sae.k)
        mse_out, aux_out = xb.new_zeros(s_n), xb.new_zeros(s_n)
        sae.b_enc.grad.zero_()
        if self.grad_clip is not None:
            self.last_grad_norm = xb.new_zeros(s_n)
        layout = (rows_all, cols_all, vals_all, crow_all, corder_all)
        if s_n > 1 and torch.get_num_threads() > 1 and sae.n_latents >= THREADED_MIN_LATENTS:
            pool = _stack_threads(torch.get_num_threads())
            for f in [pool.submit(self._one_sae, i, xb, xc, p, layout, mse_out, aux_out, renormalize)
                      for i in range(s_n)]:
                f.result()
        elif WHOLE_STACK:
            self._whole_stack(xb, xc, p, layout, mse_out, aux_out, renormalize)
        else:
            for i in range(s_n):
                self._one_sae(i, xb, xc, p, layout, mse_out, aux_out, renormalize)
        if renormalize:
            sae.normalize_decoder_()
        return StepLoss(mse_out, aux_out)

    def _whole_stack(self, xb: torch.Tensor, xc: torch.Tensor, p: torch.Tensor, layout: tuple,
                     mse_out: torch.Tensor, aux_out: torch.Tensor, renormalize: bool) -> None:
        """`_one_sae` for every SAE of the stack at once, bit for bit. The stack is taken as one SAE of S*N latents
        over S*B rows whose code is block-diagonal (row s*B + b has entries only in latents s*N .. s*N + N-1), so
        the entry kernels run once per step instead of once per SAE: a demo-sized step is mostly per-call
        overhead. They work per entry, per bag or per row, so no SAE's numbers change; reductions and AuxK (its
        own dead latents per SAE) stay per SAE."""
        sae = self.sae
        s_n, b, d = xb.shape
        n = sae.n_latents
        rows, cols, vals, crow, corder = layout
        m = rows.shape[1]
        at = torch.arange(s_n, device=xb.device)[:, None]
        rows_g, cols_g, vals_g = (rows + at * b).reshape(-1), (cols + at * n).reshape(-1), vals.reshape(-1)
        crow_g = torch.cat([(crow[:, :-1] + at * m).reshape(-1), crow.new_full((1,), s_n * m)])
        g_we, g_be, g_wd = sae.W_enc.grad, sae.b_enc.grad, sae.W_dec_t.grad
        w_dec = sae.W_dec_t.view(s_n * n, d)
        x_hat = bag_sum(cols_g, w_dec, crow_g[:-1], vals_g).view(s_n, b, d) + sae.b_dec.unsqueeze(1)
        e = x_hat - xb
        for i in range(s_n):
            mse_out[i] = e[i].square().mean()
        g = e * (2.0 / (b * d))
        fired = torch.zeros(s_n * n, dtype=torch.bool, device=xb.device)
        fired[cols_g[vals_g > 0]] = True
        self.dead_counter.view(-1).add_(1).masked_fill_(fired, 0)
        dead = self.dead_counter >= self._dead_after_col
        cdot = xb.new_zeros(s_n * n)  # <dL/dw_j, w_j> per decoder row, accumulated from the entries
        touched = [entry_grads(crow_g, rows_g, cols_g, vals_g, g.view(-1, d), w_dec, xc.view(-1, d),
                               g_wd.view(-1, d), g_we.view(-1, d), g_be.view(-1), cdot, (corder + at * m).reshape(-1),
                               fresh=True)]
        for i in dead.any(dim=1).nonzero().flatten().tolist():
            ux, aux_out[i] = aux_grads(p[i], dead[i], self.aux_k[i], self.aux_coef[i], e[i], sae.W_dec_t[i], xc[i],
                                       g_wd[i], g_we[i], g_be[i], cdot.view(s_n, n)[i])
            touched.append(ux + i * n)
        norms = [self._b_dec_grad(i, g[i]) for i in range(s_n)]
        if renormalize:
            cdot.div_(w_dec.norm(dim=1).clamp_min(1e-8).square())
        project_rows(g_wd.view(-1, d), w_dec, cdot, _union(touched))
        for i, norm in enumerate(norms):
            self._clip(i, norm)

    def _b_dec_grad(self, i: int, g: torch.Tensor) -> torch.Tensor | None:
        """SAE i's b_dec gradient from its upstream gradient `g` [B, d] (its other gradients done, unprojected);
        with clipping, records and returns the total norm of its unprojected gradient, as published."""
        sae = self.sae
        g_we, g_be, g_wd, g_bd = (sae.W_enc.grad, sae.b_enc.grad, sae.W_dec_t.grad, sae.b_dec.grad)
        # x enters only through xc = x - b_dec, so dL/db_dec = sum_b dL/dx_hat - sum_b dL/dxc, and
        # sum_b dL/dxc = sum_j (dL/db_enc)_j w_enc_j: one GEMV instead of a [B, d] gradient per entry
        g_bd[i] = g.sum(dim=0) - torch.mv(sae.W_enc[i].t(), g_be[i])
        if self.grad_clip is None:
            return None
        norm = total_norm([t.reshape(1, -1) for t in (g_we[i], g_be[i], g_wd[i], g_bd[i])])
        self.last_grad_norm[i] = norm[0]
        return norm

    def _clip(self, i: int, norm: torch.Tensor | None) -> None:
        """Scale SAE i's gradients by the clipping factor of its pre-projection `norm` (None: no clipping); scaling
        commutes with the (linear) projection, so it may come after it."""
        if norm is None:
            return
        coef = clip_coef(norm, self.grad_clip)
        if bool(coef[0] < 1.0):
            sae = self.sae
            for t in (sae.W_enc.grad[i], sae.b_enc.grad[i], sae.W_dec_t.grad[i], sae.b_dec.grad[i]):
                t.mul_(coef[0])

    @torch.no_grad()  # grad mode is per thread: the pool's threads need it too
    def _one_sae(self, i: int, xb: torch.Tensor, xc: torch.Tensor, p: torch.Tensor, layout: tuple,
                 mse_out: torch.Tensor, aux_out: torch.Tensor, renormalize: bool) -> None:
        """The sparse step of SAE i of the stack, after the shared encoder GEMM and top-k: writes only row i of
        every gradient and output, so the SAEs of a stack can run on concurrent threads."""
        sae = self.sae
        _, b, d = xb.shape
        n = sae.n_latents
        rows_all, cols_all, vals_all, crow_all, corder_all = layout
        g_be = sae.b_enc.grad
        w_dec, gwe, gwd = sae.W_dec_t[i], sae.W_enc.grad[i], sae.W_dec_t.grad[i]
        rows, cols, vals, crow = rows_all[i], cols_all[i], vals_all[i], crow_all[i]
        x_hat = bag_sum(cols, w_dec, crow[:-1], vals) + sae.b_dec[i]
        e = x_hat - xb[i]
        mse_out[i] = e.square().mean()
        g = e * (2.0 / (b * d))
        dead = self._update_dead(i, cols[vals > 0])
        cdot = xb.new_zeros(n)  # <dL/dw_j, w_j> per decoder row, accumulated from the entries
        # last step's gradients are overwritten (a memset beats re-zeroing last step's rows by index)
        touched = [entry_grads(crow, rows, cols, vals, g, w_dec, xc[i], gwd, gwe, g_be[i], cdot, corder_all[i],
                               fresh=True)]
        if bool(dead.any()):
            ux, aux_out[i] = aux_grads(p[i], dead, self.aux_k[i], self.aux_coef[i], e, w_dec, xc[i], gwd, gwe,
                                       g_be[i], cdot)
            touched.append(ux)
        norm = self._b_dec_grad(i, g)
        if renormalize:  # project on w_j / |w_j|: <g, w_j> w_j / |w_j|^2
            cdot.div_(w_dec.norm(dim=1).clamp_min(1e-8).square())
        project_rows(gwd, w_dec, cdot, _union(touched))
        self._clip(i, norm)


def _union(touched: list[torch.Tensor]) -> torch.Tensor:
    """The rows the entry kernels and AuxK added to (ascending, once each)."""
    return torch.unique(torch.cat(touched)) if len(touched) > 1 else touched[0]
