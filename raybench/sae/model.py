"""Stacked BatchTopK SAEs (docs/protocol.md §6).

S SAEs of the same shape (d, N, k) live in one module so one batched GEMM encodes all of them;
each SAE is initialised from its own seed, so a stack equals S separately built SAEs.
Decoder columns are stored row-wise (`W_dec_t` [S, N, d], contiguous) because every sparse kernel
gathers or scatters whole columns; `W_dec` [S, d, N] is the protocol's view of the same memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from raybench.core.protocol import SAEProtocol, Sampler, check_choices


@dataclass(frozen=True)
class SAECellConfig:
    """Everything one SAE's training depends on (one grid cell, one seed).

    d, n_latents, k and seed are the cell's; every other field has the meaning of the SAEProtocol field of the
    same name, and `from_protocol` copies all of those that SAEProtocol has.
    """

    d: int  # SAE input width (the encoder's state width)
    n_latents: int  # dictionary width N = E * d
    k: int  # active latents per record, as a batch average (BatchTopK keeps B*k per batch)
    seed: int  # init and batch-order seed
    steps: int
    batch_size: int
    lr: float
    beta1: float
    beta2: float
    aux_k: int
    aux_coef: float
    dead_after_batches: int
    std_floor: float = 1e-6
    sampler: Sampler = "epoch"  # per_step (published) | epoch; see SAEProtocol.sampler
    grad_clip: float | None = None  # max total gradient norm per SAE (published: 1e5); None: no clipping

    @classmethod
    def from_protocol(cls, sae: SAEProtocol, d: int, n_latents: int, k: int, seed: int) -> SAECellConfig:
        """The cell's shape and seed, plus every field it shares with the protocol's SAE section."""
        shared = {f.name for f in fields(sae)}
        return cls(d=d, n_latents=n_latents, k=k, seed=seed,
                   **{f.name: getattr(sae, f.name) for f in fields(cls) if f.name in shared})

    def validate(self) -> SAECellConfig:
        for name in ("d", "n_latents", "k", "steps", "batch_size", "aux_k", "dead_after_batches"):
            if getattr(self, name) <= 0:
                raise ValueError(f"SAECellConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.k > self.n_latents:
            raise ValueError(f"SAECellConfig.k={self.k} exceeds n_latents={self.n_latents}")
        check_choices(self, "SAECellConfig")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"SAECellConfig.grad_clip must be > 0 or None, got {self.grad_clip}")
        return self


@dataclass(frozen=True)
class Normalizer:
    """Per-dimension z-scoring with train-split statistics (std floored so constant dims stay finite)."""

    mean: np.ndarray  # [d] float32
    std: np.ndarray  # [d] float32

    @classmethod
    def fit(cls, x: np.ndarray, std_floor: float = 1e-6) -> Normalizer:
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"Normalizer.fit needs activations [n >= 2, d], got shape {x.shape}")
        x64 = np.asarray(x, dtype=np.float64)
        if not np.isfinite(x64).all():
            raise ValueError("Normalizer.fit: activations contain NaN/inf; re-extract the layer")
        mean = x64.mean(axis=0)
        std = np.maximum(x64.std(axis=0), std_floor)
        return cls(mean.astype(np.float32), std.astype(np.float32))

    def apply(self, x: np.ndarray | torch.Tensor) -> np.ndarray | torch.Tensor:
        if isinstance(x, torch.Tensor):
            mean = torch.as_tensor(self.mean, device=x.device)
            std = torch.as_tensor(self.std, device=x.device)
            return (x.float() - mean) / std
        return ((np.asarray(x, dtype=np.float32) - self.mean) / self.std).astype(np.float32)


class TopK(NamedTuple):
    """The entries BatchTopK keeps of each SAE's [B, N] slice of a stacked batch."""

    values: torch.Tensor
    """[S, M] kept pre-activations (M = min(B*k, B*N))."""
    flat: torch.Tensor
    """[S, M] their flat positions b * N + j in the [B, N] slice."""


@dataclass
class SparseCodes:
    """BatchTopK codes of a stacked batch: `values` [S, M] at flat positions `flat` [S, M] of [B, N]."""

    values: torch.Tensor
    flat: torch.Tensor
    batch: int
    n_latents: int

    def to_dense(self) -> torch.Tensor:
        s = self.values.shape[0]
        z = self.values.new_zeros(s, self.batch * self.n_latents)
        z.scatter_(1, self.flat, self.values)
        return z.view(s, self.batch, self.n_latents)


# rows shorter than this take the plain top-k; from here on the subsampled threshold is ~2x faster (demo E >= 4,
# paper E = 1: 128 x 512 to 256 x 768 entries per SAE, measured on the 2-core box)
TOPK_SUBSAMPLE_MIN = 32768


def batch_topk(p: torch.Tensor, k: int, exact: bool = False) -> TopK:
    """Keep the B*k largest entries of each SAE's [B, N] slice of `p` [S, B, N].

    Returns TopK(values [S, M], flat indices [S, M]) with M = min(B*k, B*N). torch.topk over a long row
    runs on one thread and costs a partial sort of the whole row, so unless `exact`, a threshold from a
    strided subsample (1/16 of the row, at most 65,536 entries) first narrows the candidates; when the
    threshold would keep fewer than M entries it falls back to the plain top-k. Either way the kept set is
    the exact top M (ties aside).
    """
    s, b, n = p.shape
    flat = p.reshape(s, b * n)
    m = min(b * k, b * n)
    if exact or flat.shape[1] < TOPK_SUBSAMPLE_MIN or m * 4 > flat.shape[1]:
        return TopK(*flat.topk(m, dim=1, sorted=False))
    sub = _subsample(flat, n)
    r = min(sub.shape[1], int(m / flat.shape[1] * sub.shape[1] * 1.3) + 64)
    thr = sub.topk(r, dim=1, sorted=False).values.amin(dim=1)
    vals, idxs = [], []
    for i in range(s):
        if thr[i] <= 0:
            v, j = flat[i].topk(m, sorted=False)
        else:
            cand = positions_at_least(flat[i], thr[i])
            if cand.numel() < m:
                v, j = flat[i].topk(m, sorted=False)
            else:
                v, pos = flat[i].index_select(0, cand).topk(m, sorted=False)
                j = cand.index_select(0, pos)
        vals.append(v)
        idxs.append(j)
    return TopK(torch.stack(vals), torch.stack(idxs))


def flat_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """The positions of a boolean tensor's True entries in its flat order, ascending. On CPU through numpy's
    flatnonzero: 0.36 ms against 0.57 for torch's nonzero on E = 1's [3, 196,608] code mask."""
    if mask.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(mask.numpy()))
    return mask.reshape(-1).nonzero().squeeze(1)


def positions_at_least(row: torch.Tensor, thr: torch.Tensor) -> torch.Tensor:
    """The positions of `row`'s entries >= `thr` (0-d), ascending: `(row >= thr).nonzero()` flattened. On CPU
    through numpy, whose compare and flatnonzero took 8.5 ms against torch's 25.5 ms for 3 rows of 6.3 M
    entries keeping 0.6% (E = 32, B 256: 4% of a step)."""
    if row.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(row.detach().numpy() >= thr.item()))
    return (row >= thr).nonzero().squeeze(1)


def _subsample(flat: torch.Tensor, n: int) -> torch.Tensor:
    """A strided subsample of each row of `flat` [S, B*N]: 1/16 of it, at most 65,536 entries."""
    stride = flat.shape[1] // min(65536, flat.shape[1] // 16)
    while math.gcd(stride, n) != 1:  # a stride sharing a factor with N would sample the same latents per row
        stride += 1
    return flat[:, ::stride]


def topk_mask(p: torch.Tensor, k: int) -> torch.Tensor | None:
    """batch_topk's kept set as a mask [S, B*N], for dense codes (E = 1) whose CSR layout is built from a mask
    anyway (raybench.sae.step.sparse_layout). batch_topk pays a top-k over ~1.3 x M candidates per SAE and the
    layout a scatter of its entries into a mask; this takes 1.6 ms against 2.1 for batch_topk alone (S = 3,
    B 256, N 768, k 96, 2 threads).

    Two thresholds from a strided subsample, 4 standard deviations of the subsample's kept count either side of
    its expected rank: entries at or above the upper one are kept, and the top-k runs only over the band between
    the two (~3% of the row). The kept set is the exact top M (ties aside), as batch_topk's. None when the band
    misses the M-th entry (1 of 20,000 random [256 x 768] slices), when the lower threshold is 0 (zeros tie), or for
    rows too short to subsample: batch_topk picks then.
    """
    s, b, n = p.shape
    flat = p.reshape(s, b * n)
    m = min(b * k, b * n)
    if flat.shape[1] < TOPK_SUBSAMPLE_MIN or m == flat.shape[1]:
        return None
    sub = _subsample(flat, n)
    q = m / flat.shape[1] * sub.shape[1]  # the subsample's expected share of the kept entries
    r_hi, r_lo = int(q - 4 * math.sqrt(q)), int(q + 4 * math.sqrt(q)) + 1
    if r_hi < 1 or r_lo > sub.shape[1]:
        return None
    ranked = sub.topk(r_lo, dim=1).values  # descending
    t_hi, t_lo = ranked[:, r_hi - 1], ranked[:, r_lo - 1]
    if bool((t_lo <= 0).any()):
        return None
    mask = flat >= t_hi.unsqueeze(1)
    need = (m - mask.sum(dim=1)).tolist()
    for i in range(s):
        if need[i] < 0:
            return None
        if need[i] == 0:
            continue
        band = ((flat[i] >= t_lo[i]) & ~mask[i]).nonzero().squeeze(1)
        if band.numel() < need[i]:
            return None
        mask[i, band[flat[i].index_select(0, band).topk(need[i], sorted=False).indices]] = True
    return mask


class Encoded(NamedTuple):
    """What `StackedBatchTopKSAE.encode` returns."""

    codes: SparseCodes | torch.Tensor
    """BatchTopK codes: SparseCodes, or dense [S, B, N] when asked for."""
    pre: torch.Tensor
    """[S, B, N] pre-activations P = ReLU((x - b_dec) W_enc^T + b_enc)."""


class StackedBatchTopKSAE(nn.Module):
    """S BatchTopK SAEs of one shape: W_enc [S,N,d], b_enc [S,N], W_dec [S,d,N] (unit columns), b_dec [S,d]."""

    def __init__(self, n_saes: int, d: int, n_latents: int, k: int):
        super().__init__()
        if not 0 < k <= n_latents:
            raise ValueError(f"k must satisfy 0 < k <= n_latents, got k={k}, N={n_latents}")
        self.n_saes, self.d, self.n_latents, self.k = n_saes, d, n_latents, k
        self.W_enc = nn.Parameter(torch.zeros(n_saes, n_latents, d))
        self.b_enc = nn.Parameter(torch.zeros(n_saes, n_latents))
        self.W_dec_t = nn.Parameter(torch.zeros(n_saes, n_latents, d))  # row j = decoder column j
        self.b_dec = nn.Parameter(torch.zeros(n_saes, d))

    @classmethod
    def from_seeds(cls, seeds: list[int], d: int, n_latents: int, k: int) -> StackedBatchTopKSAE:
        """Kaiming-uniform W_enc (torch Linear's a = sqrt 5), W_dec = W_enc^T with unit columns, zero biases.

        Bit for bit the published init (torch.manual_seed(seed), then the model's constructor): the column
        norms are taken on a [d, N] copy, the published memory layout, because the float32 norm of a strided
        column and of a contiguous row can differ in the last bit.
        """
        sae = cls(len(seeds), d, n_latents, k)
        with torch.no_grad():
            for i, seed in enumerate(seeds):
                g = torch.Generator().manual_seed(int(seed))
                w = torch.empty(n_latents, d)
                nn.init.kaiming_uniform_(w, a=math.sqrt(5), generator=g)
                sae.W_enc[i].copy_(w)
                wd = torch.empty(d, n_latents)
                wd.copy_(w.t())
                wd.div_(wd.norm(dim=0, keepdim=True).clamp_min(1e-8))
                sae.W_dec_t[i].copy_(wd.t())
        return sae

    @property
    def W_dec(self) -> torch.Tensor:  # the protocol's name (upper-case W)
        return self.W_dec_t.transpose(1, 2)

    def single(self, index: int) -> StackedBatchTopKSAE:
        """A detached S=1 copy of SAE `index` (for evaluation and saving)."""
        out = StackedBatchTopKSAE(1, self.d, self.n_latents, self.k)
        with torch.no_grad():
            for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
                getattr(out, name).copy_(getattr(self, name)[index:index + 1])
        return out.to(self.W_enc.device)

    @staticmethod
    def stack(saes: list[StackedBatchTopKSAE]) -> StackedBatchTopKSAE:
        first = saes[0]
        out = StackedBatchTopKSAE(sum(s.n_saes for s in saes), first.d, first.n_latents, first.k)
        with torch.no_grad():
            for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
                getattr(out, name).copy_(torch.cat([getattr(s, name).detach().cpu() for s in saes]))
        return out

    def pre_activations(self, x: torch.Tensor) -> torch.Tensor:
        """P = ReLU((x - b_dec) W_enc^T + b_enc), x [S, B, d] normalized -> [S, B, N]."""
        xc = x - self.b_dec.unsqueeze(1)
        return torch.relu(torch.baddbmm(self.b_enc.unsqueeze(1), xc, self.W_enc.transpose(1, 2)))

    def encode(self, x: torch.Tensor, sparse: bool = True) -> Encoded:
        """BatchTopK codes of x [S, B, d]: sparse (values [S, B*k], flat indices) or dense [S, B, N]; plus P."""
        p = self.pre_activations(x)
        vals, flat = batch_topk(p, self.k)
        codes = SparseCodes(vals, flat, x.shape[1], self.n_latents)
        return Encoded(codes if sparse else codes.to_dense(), p)

    def decode(self, codes: SparseCodes | torch.Tensor) -> torch.Tensor:
        """x_hat = Z W_dec^T + b_dec -> [S, B, d]."""
        if isinstance(codes, torch.Tensor):
            return torch.bmm(codes, self.W_dec_t) + self.b_dec.unsqueeze(1)
        out = []
        for i in range(self.n_saes):
            out.append(sparse_decode(codes.values[i], codes.flat[i], codes.batch, self.n_latents, self.W_dec_t[i]))
        return torch.stack(out) + self.b_dec.unsqueeze(1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes, _ = self.encode(x)
        return self.decode(codes)

    @torch.no_grad()
    def normalize_decoder_(self) -> None:
        self.W_dec_t.div_(self.W_dec_t.norm(dim=2, keepdim=True).clamp_min(1e-8))


def sparse_decode(values: torch.Tensor, flat: torch.Tensor, batch: int, n_latents: int,
                  w_rows: torch.Tensor) -> torch.Tensor:
    """sum_j z[b, j] w_rows[j] for codes given as (values, flat b*N+j): one embedding_bag, no dense [B, N]."""
    order = torch.argsort(flat)
    flat_s = flat.index_select(0, order)
    rows = torch.div(flat_s, n_latents, rounding_mode="floor")
    offsets = torch.searchsorted(rows, torch.arange(batch, device=flat.device))
    return nn.functional.embedding_bag(flat_s - rows * n_latents, w_rows, offsets, mode="sum",
                                       per_sample_weights=values.index_select(0, order))
