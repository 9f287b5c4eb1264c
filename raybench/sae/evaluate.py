"""Per-cell evaluation (docs/protocol.md §7 and §8.1): fidelity, accessibility, bootstrap statistics.

Codes are the same BatchTopK as in training, applied to frozen-order batches of `eval_batch`
records (a last partial batch keeps B*k entries with its own B), and kept sparse throughout:
a split never materialises an [n, N] matrix.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch

from raybench.cohorts.split import SPLITS
from raybench.core.config import EvalProtocol
from raybench.core.sufficient_stats import paired_corr, patient_stats, pearson_from_sums
from raybench.sae.model import Normalizer, StackedBatchTopKSAE


@dataclass
class SplitCodes:
    """Positive BatchTopK entries of one split: record `rows`, latent `cols`, `vals`; plus per-record SSE/SST."""

    n: int
    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    sse: np.ndarray  # [n] sum over d of squared reconstruction error (normalized space)
    sst: np.ndarray  # [n] sum over d of squared deviation from the split mean (normalized space)

    def firing_counts(self, n_latents: int) -> np.ndarray:
        return np.bincount(self.cols, minlength=n_latents)

    def dense_columns(self, latents: np.ndarray) -> np.ndarray:
        """[n, len(latents)] dense code values of the given latents (repeats allowed)."""
        uniq, inv = np.unique(latents, return_inverse=True)
        pos = np.minimum(np.searchsorted(uniq, self.cols), uniq.size - 1)
        sel = uniq[pos] == self.cols
        out = np.zeros((self.n, uniq.size), dtype=np.float64)
        out[self.rows[sel], pos[sel]] = self.vals[sel]
        return out[:, inv]


@dataclass
class CellEval:
    metrics: dict[str, float | bool]
    selected: np.ndarray  # [C] int: j*(c) chosen on the train selection subset
    r_val: np.ndarray  # [C]
    r_test: np.ndarray  # [C]
    firing_rate_val: np.ndarray  # [N]
    patient_n: np.ndarray  # [P]
    patient_sse: np.ndarray  # [P]
    patient_sst: np.ndarray  # [P] against the full-test mean
    patient_corr: np.ndarray  # [P, C, 5]: sums of a, y, a^2, y^2, a*y (a = selected code, y = concept)
    decoder_top: np.ndarray  # [d, m] most active non-dead decoder columns by validation firing rate
    decoder_top_idx: np.ndarray  # [m]
    extra: dict = field(default_factory=dict)

    def patient_stats(self) -> dict[str, np.ndarray]:
        return {"n": self.patient_n, "sse": self.patient_sse, "sst": self.patient_sst, "corr": self.patient_corr}


def normalize_float64(normalizer: Normalizer, x_raw: np.ndarray) -> np.ndarray:
    """(x - mean) / std in float64 from the float32 inputs and statistics (the exact normalized values)."""
    mean = np.asarray(normalizer.mean, dtype=np.float64)
    std = np.asarray(normalizer.std, dtype=np.float64)
    return (np.asarray(x_raw, dtype=np.float32).astype(np.float64) - mean) / std


def encode_split(sae: StackedBatchTopKSAE, normalizer: Normalizer, x_raw: np.ndarray, eval_batch: int,
                 device: str = "cpu") -> SplitCodes:
    """BatchTopK codes of a split (S=1 SAE) in frozen-order batches, with per-record SSE and SST.

    Computed in float64 from the float32 weights and inputs (docs/protocol.md §6.7): which entries a batch
    keeps is then decided by the pre-activations' exact values. In float32, entries within ~1e-7 of the
    batch threshold are ordered by rounding, and when such an entry belongs to a latent that fires on few
    records the swap moves that latent's |r| by percent and can change the selected coordinate.
    """
    if sae.n_saes != 1:
        raise ValueError(f"encode_split needs a single SAE (use sae.single(i)), got a stack of {sae.n_saes}")
    xn = normalize_float64(normalizer, x_raw)
    n = xn.shape[0]
    if n == 0:
        raise ValueError("encode_split: empty split")
    mean = xn.mean(axis=0)
    sst = ((xn - mean) ** 2).sum(axis=1)
    rows, cols, vals, sse = [], [], [], np.zeros(n, dtype=np.float64)
    model = copy.deepcopy(sae).to(device=device, dtype=torch.float64)  # the caller's SAE stays float32
    with torch.no_grad():
        for start in range(0, n, eval_batch):
            xb = torch.from_numpy(xn[start:start + eval_batch]).to(device).unsqueeze(0)
            codes, _ = model.encode(xb, sparse=True)
            x_hat = model.decode(codes)
            sse[start:start + xb.shape[1]] = (x_hat[0] - xb[0]).square().sum(dim=1).cpu().numpy()
            v = codes.values[0].cpu().numpy()
            f = codes.flat[0].cpu().numpy()
            pos = v > 0
            rows.append(f[pos] // sae.n_latents + start)
            cols.append(f[pos] % sae.n_latents)
            vals.append(v[pos].astype(np.float64))
    return SplitCodes(n, np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), sse, sst)


class Selection(NamedTuple):
    """The single coordinate chosen per concept on the selection subset (docs/protocol.md §7.3)."""

    selected: np.ndarray
    """[C] int64: j*(c), the latent chosen for each concept."""
    r: np.ndarray
    """[C] its correlation with the concept on the selection subset."""


def select_coordinates(codes: SplitCodes, y: np.ndarray, n_latents: int,
                       present: np.ndarray | None = None) -> Selection:
    """j*(c) = argmax_j |corr(code_j, y_c)| over all N latents (sparse sums).

    Ties (|r| within a relative 1e-9 of the max) go to the lowest latent index (argmax_abs_lowest).

    present: optional [n, C] bool; concept c's correlations then use only the records where it is present
    (the published per-concept masks; raybench.sae.data). Concepts present everywhere use the plain sums.
    """
    y = y.astype(np.float64)
    n = codes.n
    sa = np.bincount(codes.cols, weights=codes.vals, minlength=n_latents)
    saa = np.bincount(codes.cols, weights=codes.vals ** 2, minlength=n_latents)
    z = sp.csr_matrix((codes.vals, (codes.rows, codes.cols)), shape=(n, n_latents))
    say = np.asarray(z.T @ y)  # [N, C]
    r = pearson_from_sums(n, sa[:, None], y.sum(0)[None, :], saa[:, None], (y ** 2).sum(0)[None, :], say)
    if present is not None and not np.all(present):
        r = _masked_selection_r(z, y, np.asarray(present, dtype=bool), r)
    selected = argmax_abs_lowest(r)
    return Selection(selected.astype(np.int64), r[selected, np.arange(y.shape[1])])


# Ties in coordinate selection: |r| values within this relative distance of a column's max count as tied.
SELECTION_TIE_RTOL = 1e-9


def argmax_abs_lowest(r: np.ndarray, rtol: float = SELECTION_TIE_RTOL) -> np.ndarray:
    """Per column of r [N, C]: the lowest latent index j with |r_j| >= (1 - rtol) max_j |r_j|.

    The tie rule of coordinate selection (docs/protocol.md §7.3). Latents can tie exactly on |r| (identical
    code columns, or latents that fire on one selection record only: r then depends only on that record), and a
    plain argmax would let float rounding of the sums pick among them. The published code takes
    np.argmax(np.abs(r)) (the first index on exact ties) on float32 correlations from float32 sums, so among
    mathematically tied latents its pick also depends on rounding; this rule keeps its lowest-index
    convention and makes the tie tolerance explicit. A column of zeros selects latent 0, as np.argmax does.
    """
    a = np.abs(np.asarray(r, dtype=np.float64))
    return np.argmax(a >= a.max(axis=0, keepdims=True) * (1.0 - rtol), axis=0).astype(np.int64)


def _masked_selection_r(z: sp.csr_matrix, y: np.ndarray, present: np.ndarray, r: np.ndarray) -> np.ndarray:
    """r [N, C] with each partly missing concept's column recomputed over the records where it is present."""
    if present.shape != y.shape:
        raise ValueError(f"present must be [n, C] = {y.shape}, got {present.shape}")
    r = r.copy()
    partial = np.flatnonzero(~present.all(axis=0))
    m = present[:, partial].astype(np.float64)  # [n, c']
    ym = np.where(present[:, partial], y[:, partial], 0.0)
    zt = z.T.tocsr()
    n_c = m.sum(axis=0)  # [c']
    sa = np.asarray(zt @ m)  # [N, c']
    saa = np.asarray(zt.multiply(zt) @ m)
    say = np.asarray(zt @ ym)
    r[:, partial] = pearson_from_sums(n_c[None, :], sa, ym.sum(0)[None, :], saa, (ym ** 2).sum(0)[None, :], say)
    return r


def _check_inputs(acts: dict, concepts: dict, d: int) -> None:
    for split in SPLITS:
        if split not in acts or split not in concepts:
            raise ValueError(f"evaluate_cell needs acts and concepts for split {split!r}")
        a, c = acts[split], concepts[split]
        if a.ndim != 2 or a.shape[1] != d:
            raise ValueError(f"acts[{split!r}] must be [n, d={d}], got {a.shape}")
        if c.ndim != 2 or c.shape[0] != a.shape[0]:
            raise ValueError(f"concepts[{split!r}] must be [n={a.shape[0]}, C], got {c.shape}")
        if not np.isfinite(c).all():
            raise ValueError(f"concepts[{split!r}] has NaN/inf: impute or drop before evaluation")


def evaluate_cell(
    sae: StackedBatchTopKSAE,
    normalizer: Normalizer,
    acts: dict[str, np.ndarray],
    concepts: dict[str, np.ndarray],
    test_patient_codes: np.ndarray,
    selection_idx: np.ndarray,
    eval: EvalProtocol,  # the protocol's section name (shadows the builtin here only)
    index: int = 0,
    n_patients: int | None = None,
    device: str = "cpu",
    selection_present: np.ndarray | None = None,
) -> CellEval:
    """Evaluate SAE `index` of a stack (or a single SAE) on val/test; select coordinates on the train subset.

    selection_present: [len(selection_idx), C] bool per-concept masks for the selection (complete_case,
    raybench.sae.data); val/test are evaluated on whatever rows they are given.
    """
    single = sae.single(index) if sae.n_saes > 1 or index != 0 else sae
    n_lat = single.n_latents
    _check_inputs(acts, concepts, single.d)
    codes = np.asarray(test_patient_codes, dtype=np.int64)
    if codes.shape != (acts["test"].shape[0],) or (codes.size and codes.min() < 0):
        raise ValueError(f"test_patient_codes must be [n_test={acts['test'].shape[0]}] ints >= 0, got {codes.shape}")
    n_pat = int(codes.max(initial=-1)) + 1 if n_patients is None else int(n_patients)
    if codes.size and codes.max() >= n_pat:
        raise ValueError(f"test_patient_codes holds {codes.max()} >= n_patients={n_pat}")
    sel_idx = np.asarray(selection_idx, dtype=np.int64)

    sel = encode_split(single, normalizer, acts["train"][sel_idx], eval.eval_batch, device)
    selected, _ = select_coordinates(sel, concepts["train"][sel_idx], n_lat, selection_present)
    out: dict[str, float | bool] = {}
    per: dict[str, SplitCodes] = {}
    r: dict[str, np.ndarray] = {}
    for split in ("val", "test"):
        sc = encode_split(single, normalizer, acts[split], eval.eval_batch, device)
        per[split] = sc
        y = concepts[split].astype(np.float64)
        r[split] = paired_corr(sc.dense_columns(selected), y)
        out[f"{split}_r2"] = float(1.0 - sc.sse.sum() / sc.sst.sum()) if sc.sst.sum() > 0 else float("nan")
        out[f"{split}_dead_fraction"] = float((sc.firing_counts(n_lat) == 0).mean())
        out[f"{split}_mean_l0"] = float(sc.vals.size / sc.n)
        out[f"{split}_accessibility"] = float(np.abs(r[split]).mean())
        out[f"{split}_coverage"] = float((np.abs(r[split]) >= eval.coverage_threshold).mean())
    out["gate_pass"] = bool(out["val_r2"] >= eval.gate_r2 and out["val_dead_fraction"] < eval.gate_dead)

    test = per["test"]
    sums = patient_stats(codes, n_pat, test.dense_columns(selected), concepts["test"], test.sse, test.sst)

    counts_val = per["val"].firing_counts(n_lat)
    firing_val = counts_val / per["val"].n
    alive = np.flatnonzero(counts_val > 0)
    order = alive[np.argsort(-firing_val[alive], kind="stable")]
    top = order[: min(eval.repro_top, order.size)]
    w_dec = single.W_dec[0].detach().cpu().numpy()
    return CellEval(
        metrics=out,
        selected=selected,
        r_val=r["val"],
        r_test=r["test"],
        firing_rate_val=firing_val,
        patient_n=sums["n"],
        patient_sse=sums["sse"],
        patient_sst=sums["sst"],
        patient_corr=sums["corr"],
        decoder_top=w_dec[:, top].astype(np.float32),
        decoder_top_idx=top.astype(np.int64),
    )
