"""Stacked BatchTopK SAE training (docs/protocol.md §6; performance: docs/architecture.md §5).

`train_stack` trains S SAEs of one shape together. Each SAE keeps its own batches, dead counters and
loss, and Adam is elementwise, so every SAE in a stack follows exactly the trajectory it would follow
alone. Batches come from np.random.default_rng(cell seed): sampler "per_step" (the published loop) draws
rng.choice(n, batch_size, replace=False) afresh every step; "epoch" walks a fresh permutation per epoch
and drops the remainder. Optional gradient-norm clipping (published: 1e5) is per SAE, over W_enc,
b_enc, W_dec and b_dec jointly, on the gradient before the decoder projection, with
torch.nn.utils.clip_grad_norm_'s arithmetic (coef = max_norm / (norm + 1e-6), capped at 1).

Two implementations of one step: "dense" is plain autograd on the dense [B, N] code (the
reference); "sparse" uses that the code has only B*k non-zeros (plus the AuxK entries) and computes
the decoder forward, all decoder/encoder gradients and the parallel-gradient projection on those
entries only (embedding_bag kernels); the only O(N d) work left is the encoder GEMM, Adam and the
decoder renormalisation.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from raybench.sae.model import Normalizer, SAECellConfig, StackedBatchTopKSAE, batch_topk

STATE_VERSION = 1
# "auto" picks the dense reference when codes are denser than 1/32 (e.g. E = 1 with k = d/8): there the
# dense GEMMs are cheap and the sparse path's per-entry bookkeeping does not pay (bench/sae_train.py).
AUTO_DENSE_ABOVE = 32


@dataclass
class TrainResult:
    normalizer: Normalizer
    sae: StackedBatchTopKSAE  # S SAEs, on CPU
    loss_mse: np.ndarray  # [S, steps] reconstruction MSE (normalized space, mean over batch x d)
    loss_aux: np.ndarray  # [S, steps] AuxK term before aux_coef (0 while no latent is dead)
    dead_counter: np.ndarray  # [S, N] consecutive batches without firing at the end
    cfgs: list[SAECellConfig]
    grad_norm: np.ndarray | None = None  # [S, steps] total gradient norm before clipping (only when clipping)


class _Batcher:
    """Batches without replacement: a fresh permutation per epoch; a remainder shorter than B is dropped."""

    def __init__(self, n: int, batch: int, seed: int):
        if n < batch:
            raise ValueError(f"training split has {n} records, fewer than batch_size={batch}: lower sae.batch_size")
        self.n, self.batch = n, batch
        self.rng = np.random.default_rng(seed)
        self.perm = self.rng.permutation(n)
        self.pos = 0

    def next(self) -> np.ndarray:
        if self.pos + self.batch > self.n:
            self.perm = self.rng.permutation(self.n)
            self.pos = 0
        out = self.perm[self.pos:self.pos + self.batch]
        self.pos += self.batch
        return out

    def state(self) -> dict[str, Any]:
        return {"rng": copy.deepcopy(self.rng.bit_generator.state), "perm": self.perm.copy(), "pos": self.pos}

    def load(self, st: dict[str, Any]) -> None:
        self.rng.bit_generator.state = copy.deepcopy(st["rng"])
        self.perm = np.asarray(st["perm"]).copy()
        self.pos = int(st["pos"])


class _StepSampler:
    """The published sampler: rng.choice(n, min(batch, n), replace=False) drawn independently every step."""

    def __init__(self, n: int, batch: int, seed: int):
        self.n, self.batch = n, min(batch, n)
        self.rng = np.random.default_rng(seed)

    def next(self) -> np.ndarray:
        return self.rng.choice(self.n, size=self.batch, replace=False)

    def state(self) -> dict[str, Any]:
        return {"rng": copy.deepcopy(self.rng.bit_generator.state)}

    def load(self, st: dict[str, Any]) -> None:
        self.rng.bit_generator.state = copy.deepcopy(st["rng"])


SAMPLER_CLASSES = {"epoch": _Batcher, "per_step": _StepSampler}


def _check_cfgs(cfgs: list[SAECellConfig]) -> None:
    if not cfgs:
        raise ValueError("train_stack needs at least one SAECellConfig")
    for c in cfgs:
        c.validate()
    first = cfgs[0]
    for c in cfgs[1:]:
        same = ((c.shape_key, c.steps, c.batch_size, c.sampler, c.grad_clip)
                == (first.shape_key, first.steps, first.batch_size, first.sampler, first.grad_clip))
        if not same:
            raise ValueError(f"stacked SAEs must share d, N, k, steps, batch_size, sampler and grad_clip: "
                             f"{first} vs {c}")
    if len({c.seed for c in cfgs}) != len(cfgs):
        raise ValueError(f"stacked SAEs have duplicate seeds: {[c.seed for c in cfgs]}")


def _aux_entries(p: torch.Tensor, dead: torch.Tensor, aux_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sample, the top-aux_k dead pre-activations of p [B, N]: (rows, cols, values), row-major."""
    b = p.shape[0]
    dead_idx = dead.nonzero().squeeze(1)
    kx = min(aux_k, dead_idx.numel())
    pd = p.index_select(1, dead_idx)
    if kx < dead_idx.numel():
        vals, pos = pd.topk(kx, dim=1, sorted=False)
        cols = dead_idx[pos]
    else:
        vals, cols = pd, dead_idx.expand(b, kx)
    rows = torch.arange(b, device=p.device).repeat_interleave(kx)
    return rows, cols.reshape(-1), vals.reshape(-1)


class _Stepper:
    """One optimisation step for the whole stack; holds Adam and the dead counters."""

    def __init__(self, sae: StackedBatchTopKSAE, cfgs: list[SAECellConfig], implementation: str):
        if implementation not in ("sparse", "dense", "auto"):
            raise ValueError(f"implementation must be 'sparse', 'dense' or 'auto', got {implementation!r}")
        if implementation == "auto":
            implementation = "dense" if sae.k * AUTO_DENSE_ABOVE > sae.n_latents else "sparse"
        self.sae, self.cfgs, self.impl = sae, cfgs, implementation
        c = cfgs[0]
        dev = sae.W_enc.device
        self.params = [sae.W_enc, sae.b_enc, sae.W_dec_t, sae.b_dec]
        # Adam is elementwise, so one optimizer over the stacked tensors equals S separate ones
        # (all stacked SAEs share lr and betas: checked in train_stack).
        fused = dev.type in ("cpu", "cuda")
        self.opt = torch.optim.Adam(self.params, lr=c.lr, betas=(c.beta1, c.beta2), fused=fused)
        self.dead_counter = torch.zeros(sae.n_saes, sae.n_latents, dtype=torch.long, device=dev)
        self.aux_k = [cf.aux_k for cf in cfgs]
        self.aux_coef = [cf.aux_coef for cf in cfgs]
        self.dead_after = [cf.dead_after_batches for cf in cfgs]
        self.grad_clip = c.grad_clip  # shared by the stack (checked in _check_cfgs)
        self.last_grad_norm: torch.Tensor | None = None  # [S] pre-clip total norm of the last step (clipping only)
        if implementation == "sparse":
            for p in self.params:
                p.grad = torch.zeros_like(p)

    def _update_dead(self, i: int, fired_cols: torch.Tensor) -> torch.Tensor:
        fired = torch.zeros(self.sae.n_latents, dtype=torch.bool, device=fired_cols.device)
        fired[fired_cols] = True
        cnt = self.dead_counter[i]
        cnt.add_(1).masked_fill_(fired, 0)
        return cnt >= self.dead_after[i]

    def step(self, xb: torch.Tensor, renormalize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One step. `renormalize`: as the published loop, re-normalise W_dec after the backward pass and project
        the decoder gradient on the re-normalised columns. The published loop does that every step, but after a
        step W_dec is unit to working precision, so it matters only on a run's first step (the float32 init's
        column norms are 1 +- 6e-8): train_stack asks for it there only.
        """
        mse, aux = self._sparse(xb, renormalize) if self.impl == "sparse" else self._dense(xb, renormalize)
        self.opt.step()
        self.sae.normalize_decoder_()
        return mse, aux

    # ------------------------------------------------------------ dense reference (autograd)
    def _dense(self, xb: torch.Tensor, renormalize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        sae = self.sae
        s_n, b, _ = xb.shape
        self.opt.zero_grad(set_to_none=True)
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
                self.last_grad_norm = _total_norm([g_.reshape(s_n, -1) for g_ in grads])
                coef = _clip_coef(self.last_grad_norm, self.grad_clip)
                for g_ in grads:
                    g_.mul_(coef.view(-1, *([1] * (g_.dim() - 1))))
            g, w = sae.W_dec_t.grad, sae.W_dec_t
            if renormalize:
                sae.normalize_decoder_()
            g.sub_((g * w).sum(dim=2, keepdim=True) * w)
        return mse.detach(), aux.detach()

    # ------------------------------------------------------------ sparse path (manual gradients)
    @torch.no_grad()
    def _sparse(self, xb: torch.Tensor, renormalize: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        sae = self.sae
        s_n, b, d = xb.shape
        n = sae.n_latents
        xc = xb - sae.b_dec.unsqueeze(1)
        p = torch.relu(torch.baddbmm(sae.b_enc.unsqueeze(1), xc, sae.W_enc.transpose(1, 2)))
        vals_all, flat_all = batch_topk(p, sae.k)
        mse_out, aux_out = xb.new_zeros(s_n), xb.new_zeros(s_n)
        g_we, g_be, g_wd, g_bd = (sae.W_enc.grad, sae.b_enc.grad, sae.W_dec_t.grad, sae.b_dec.grad)
        g_be.zero_()
        if self.grad_clip is not None:
            self.last_grad_norm = xb.new_zeros(s_n)
        for i in range(s_n):
            w_enc, w_dec, gwe, gwd = sae.W_enc[i], sae.W_dec_t[i], g_we[i], g_wd[i]
            gwe.zero_()  # a memset beats re-zeroing last step's rows by index
            gwd.zero_()
            flat, order = torch.sort(flat_all[i])  # row-major: CSR order
            vals = vals_all[i].index_select(0, order)
            rows = torch.div(flat, n, rounding_mode="floor")
            cols = flat - rows * n
            crow = torch.searchsorted(rows, torch.arange(b + 1, device=xb.device))
            x_hat = F.embedding_bag(cols, w_dec, crow[:-1], mode="sum", per_sample_weights=vals) + sae.b_dec[i]
            e = x_hat - xb[i]
            mse_out[i] = e.square().mean()
            g = e * (2.0 / (b * d))
            dead = self._update_dead(i, cols[vals > 0])
            cdot = xb.new_zeros(n)  # <dL/dw_j, w_j> per decoder row, accumulated from the entries
            ua, dxc = _entry_grads(crow, rows, cols, vals, g, w_dec, w_enc, xc[i], gwd, gwe, g_be[i], cdot)
            touched = [ua]
            if bool(dead.any()):
                ux, dxc_x, aux_out[i] = _aux_grads(p[i], dead, self.aux_k[i], self.aux_coef[i], e, w_dec, w_enc,
                                                   xc[i], gwd, gwe, g_be[i], cdot)
                dxc = dxc + dxc_x
                touched.append(ux)
            g_bd[i] = g.sum(dim=0) - dxc.sum(dim=0)
            if self.grad_clip is not None:  # the norm of the unprojected gradient, as published
                norm = _total_norm([t.reshape(1, -1) for t in (gwe, g_be[i], gwd, g_bd[i])])
                self.last_grad_norm[i] = norm[0]
            if renormalize:  # project on w_j / |w_j|: <g, w_j> w_j / |w_j|^2
                cdot.div_(w_dec.norm(dim=1).clamp_min(1e-8).square())
            _project_rows(gwd, w_dec, cdot, torch.unique(torch.cat(touched)) if len(touched) > 1 else ua)
            if self.grad_clip is not None:  # scaling commutes with the (linear) projection
                coef = _clip_coef(norm, self.grad_clip)
                if bool(coef[0] < 1.0):
                    for t in (gwe, g_be[i], gwd, g_bd[i]):
                        t.mul_(coef[0])
        if renormalize:
            sae.normalize_decoder_()
        return mse_out, aux_out


def _total_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """Per row (SAE) of each [S, *] gradient: the 2-norm of the per-tensor 2-norms (clip_grad_norm_'s total norm)."""
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dim=1) for g in grads]), dim=0)


def _clip_coef(total_norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """torch.nn.utils.clip_grad_norm_'s factor: max_norm / (norm + 1e-6), capped at 1."""
    return torch.clamp(max_norm / (total_norm + 1e-6), max=1.0)


def _project_rows(gwd: torch.Tensor, w_dec: torch.Tensor, cdot: torch.Tensor, touched: torch.Tensor) -> None:
    """gwd_j -= <gwd_j, w_j> w_j (w_j unit), with the dot products `cdot` already summed from the code entries
    (<sum_b z_bj g_b, w_j> = sum_b z_bj <g_b, w_j>, and <g_b, w_j> is the SDDMM value): no [N, d] dot pass.
    Only `touched` rows are non-zero; when most rows are touched one fused pass beats gather + scatter.
    """
    if touched.numel() * 4 < gwd.shape[0]:
        gwd.index_add_(0, touched, w_dec.index_select(0, touched) * cdot.index_select(0, touched).unsqueeze(1),
                       alpha=-1.0)
    else:
        gwd.addcmul_(cdot.unsqueeze(1), w_dec, value=-1.0)


# AuxK entries are B * min(aux_k, n_dead) scattered (sample, dead latent) pairs. While the dead
# latents they touch are few, five small dense GEMMs over just those latents beat per-entry
# gathers (each decoder row is read once, not once per sample); beyond ~16 * aux_k touched latents
# the per-entry kernels win (measured on the 2-core box at E = 32: bench/sae_train.py).
AUX_BLOCK_MAX_RATIO = 16


def _entry_grads(crow: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor, gup: torch.Tensor,
                 w_dec: torch.Tensor, w_enc: torch.Tensor, xc: torch.Tensor, gwd: torch.Tensor, gwe: torch.Tensor,
                 gbe: torch.Tensor, cdot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients from code entries (row-major, CSR `crow`) whose reconstruction gets upstream grad `gup` [B, d].

    Adds into the decoder/encoder row grads and b_enc grad; returns (latents touched, dL/dxc [B, d]).
    """
    b, n = gup.shape[0], w_dec.shape[0]
    with warnings.catch_warnings():  # "CSR support is in beta": used here only as the SDDMM pattern
        warnings.simplefilter("ignore")
        mask = torch.sparse_csr_tensor(crow, cols, vals, (b, n), check_invariants=False)  # built sorted
    dz = torch.sparse.sampled_addmm(mask, gup, w_dec.T, beta=0.0).values()  # <gup[b], w_dec[j]> per entry
    dpre = dz * (vals > 0)  # ReLU gate
    cdot.index_add_(0, cols, dz * vals)
    corder = torch.argsort(cols)
    cs = cols.index_select(0, corder)
    uniq, counts = torch.unique_consecutive(cs, return_counts=True)
    coffs = torch.cumsum(counts, 0) - counts
    r = rows.index_select(0, corder)
    gwd.index_add_(0, uniq, F.embedding_bag(r, gup, coffs, mode="sum",
                                            per_sample_weights=vals.index_select(0, corder)))
    gwe.index_add_(0, uniq, F.embedding_bag(r, xc, coffs, mode="sum",
                                            per_sample_weights=dpre.index_select(0, corder)))
    gbe.index_add_(0, cols, dpre)
    dxc = F.embedding_bag(cols, w_enc, crow[:-1], mode="sum", per_sample_weights=dpre)
    return uniq, dxc


def _aux_grads(p: torch.Tensor, dead: torch.Tensor, aux_k: int, coef: float, e: torch.Tensor, w_dec: torch.Tensor,
               w_enc: torch.Tensor, xc: torch.Tensor, gwd: torch.Tensor, gwe: torch.Tensor,
               gbe: torch.Tensor, cdot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AuxK: per sample the top-aux_k dead pre-activations reconstruct the residual x - x_hat (detached).

    Adds its gradients (scaled by `coef`) into the row grads; returns (latents touched, dL/dxc, AuxK value).
    """
    b, d = e.shape
    rows, cols, vals = _aux_entries(p, dead, aux_k)
    kx = cols.numel() // b
    uniq = torch.unique(cols)
    if uniq.numel() <= AUX_BLOCK_MAX_RATIO * kx:
        z = torch.zeros(b, uniq.numel(), device=p.device, dtype=p.dtype)
        z[rows, torch.searchsorted(uniq, cols.contiguous())] = vals
        wu, weu = F.embedding(uniq, w_dec), F.embedding(uniq, w_enc)
        ea = z @ wu + e  # aux recon - (x - x_hat)
        ga = ea * (2.0 * coef / (b * d))
        dz = ga @ wu.T
        dpre = dz * (z > 0)
        cdot.index_add_(0, uniq, (dz * z).sum(dim=0))
        gwd.index_add_(0, uniq, z.T @ ga)
        gwe.index_add_(0, uniq, dpre.T @ xc)
        gbe.index_add_(0, uniq, dpre.sum(dim=0))
        return uniq, dpre @ weu, ea.square().mean()
    cols2 = cols.view(b, kx)
    cols2, o = cols2.sort(dim=1)  # CSR wants sorted columns within a row
    vals = vals.view(b, kx).gather(1, o).reshape(-1)
    cols = cols2.reshape(-1)
    crow = torch.arange(b + 1, device=p.device) * kx
    ea = F.embedding_bag(cols, w_dec, crow[:-1], mode="sum", per_sample_weights=vals) + e
    ga = ea * (2.0 * coef / (b * d))
    touched, dxc = _entry_grads(crow, rows, cols, vals, ga, w_dec, w_enc, xc, gwd, gwe, gbe, cdot)
    return touched, dxc, ea.square().mean()


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_cpu(v) for v in obj)
    return copy.deepcopy(obj)


def train_stack(
    x_train: np.ndarray,
    cfgs: list[SAECellConfig],
    device: str = "cpu",
    state: dict | None = None,
    on_checkpoint: Callable[[int, dict], None] | None = None,
    checkpoint_every: int = 0,
    implementation: str = "sparse",
    dtype: torch.dtype = torch.float32,
) -> TrainResult:
    """Train len(cfgs) SAEs (same d, N, k; own seeds) on raw train activations [n, d].

    `state` (from on_checkpoint) resumes exactly where it was taken; checkpoints are CPU-only
    plain dicts of tensors/arrays, safe to hand to Ray. `implementation`: "sparse" (fast at
    large N), "dense" (autograd reference), "auto" (dense only for codes denser than 1/32).
    `dtype` float64 is for numerical checks: it takes rounding out of sparse-vs-dense comparisons.
    """
    _check_cfgs(cfgs)
    c0 = cfgs[0]
    if len({(c.lr, c.beta1, c.beta2) for c in cfgs}) != 1:
        raise ValueError("stacked SAEs must share lr and Adam betas (one optimizer over the stack)")
    x_train = np.asarray(x_train)
    if x_train.ndim != 2 or x_train.shape[1] != c0.d:
        raise ValueError(f"x_train must be [n, d={c0.d}], got shape {x_train.shape}")
    normalizer = Normalizer.fit(x_train, c0.std_floor)
    dev = torch.device(device)
    x = torch.from_numpy(normalizer.apply(x_train)).to(dev, dtype)
    sae = StackedBatchTopKSAE.from_seeds([c.seed for c in cfgs], c0.d, c0.n_latents, c0.k).to(dev, dtype)
    stepper = _Stepper(sae, cfgs, implementation)
    batchers = [SAMPLER_CLASSES[c0.sampler](x.shape[0], c0.batch_size, c.seed) for c in cfgs]
    steps, s_n = c0.steps, len(cfgs)
    loss_mse = np.zeros((s_n, steps), dtype=np.float64)
    loss_aux = np.zeros((s_n, steps), dtype=np.float64)
    grad_norm = np.zeros((s_n, steps), dtype=np.float64) if c0.grad_clip is not None else None
    start = 0
    if state is not None:
        if (state.get("version") != STATE_VERSION or state.get("seeds") != [c.seed for c in cfgs]
                or state.get("sampler", "epoch") != c0.sampler or state.get("grad_clip") != c0.grad_clip):
            raise ValueError("resume state does not belong to these SAE configs (seeds/version/sampler/grad_clip "
                             "differ); delete the trial checkpoint to restart the cell")
        with torch.no_grad():
            for name, t in state["weights"].items():
                getattr(sae, name).copy_(t.to(dev))
        stepper.opt.load_state_dict(state["adam"])
        stepper.dead_counter.copy_(state["dead_counter"].to(dev))
        for bt, st in zip(batchers, state["batchers"], strict=True):
            bt.load(st)
        start = int(state["step"])
        loss_mse[:, :start] = state["loss_mse"][:, :start]
        loss_aux[:, :start] = state["loss_aux"][:, :start]
        if grad_norm is not None:
            grad_norm[:, :start] = state["grad_norm"][:, :start]
    for step in range(start, steps):
        idx = torch.from_numpy(np.stack([bt.next() for bt in batchers])).to(dev)
        xb = x[idx]
        mse, aux = stepper.step(xb, renormalize=step == 0)
        loss_mse[:, step] = mse.cpu().numpy()
        loss_aux[:, step] = aux.cpu().numpy()
        if grad_norm is not None:
            grad_norm[:, step] = stepper.last_grad_norm.cpu().numpy()
        done = step + 1
        if on_checkpoint is not None and checkpoint_every > 0 and done % checkpoint_every == 0 and done < steps:
            on_checkpoint(done, _state(done, sae, stepper, batchers, cfgs, loss_mse, loss_aux, grad_norm))
    sae_cpu = sae.cpu()
    for p in sae_cpu.parameters():
        p.grad = None
    return TrainResult(normalizer, sae_cpu, loss_mse, loss_aux, stepper.dead_counter.cpu().numpy(), list(cfgs),
                       grad_norm)


def _state(step: int, sae: StackedBatchTopKSAE, stepper: _Stepper, batchers: list[_Batcher | _StepSampler],
           cfgs: list[SAECellConfig], loss_mse: np.ndarray, loss_aux: np.ndarray,
           grad_norm: np.ndarray | None) -> dict:
    return {
        "version": STATE_VERSION,
        "step": step,
        "seeds": [c.seed for c in cfgs],
        "sampler": cfgs[0].sampler,
        "grad_clip": cfgs[0].grad_clip,
        "grad_norm": None if grad_norm is None else grad_norm.copy(),
        "weights": {name: _to_cpu(getattr(sae, name)) for name in ("W_enc", "b_enc", "W_dec_t", "b_dec")},
        "adam": _to_cpu(stepper.opt.state_dict()),
        "dead_counter": _to_cpu(stepper.dead_counter),
        "batchers": [bt.state() for bt in batchers],
        "loss_mse": loss_mse.copy(),
        "loss_aux": loss_aux.copy(),
    }
