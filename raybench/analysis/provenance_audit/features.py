"""SAE features that carry provenance (docs/protocol.md §12.6).

Univariate LPI of u from one latent: a binned probe - the latent's train activations fall in bin 0 (inactive)
or one of `bins` quantile bins of its train non-zero values; P(u | bin) is the train frequency smoothed toward
the train prevalence (one pseudo-record); LPI is the held-out cross-entropy gain over the prevalence, in bits,
as in Recover. A concept-selected latent (the accessibility analysis' j*(c), from the cell's metrics.json) is
flagged when its provenance LPI exceeds its concept signal, the Gaussian information of its held-out r:
-1/2 log2(1 - r^2) bits, and reaches `provenance.flag_bits`, so a "QRS duration feature" that is also a
"device feature" is named.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from raybench.analysis.provenance_audit.probes import LN2, PRIOR_FLOOR

BINS = 4
SMOOTHING = 1.0  # pseudo-records of the prevalence added to every bin


def _bin(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """0 for inactive (<= 0), else 1 + the quantile bin of the value."""
    return np.where(values > 0, 1 + np.searchsorted(edges, values, side="right"), 0)


def univariate_lpi(codes_tr: sp.spmatrix, u_tr: np.ndarray, codes_te: sp.spmatrix, u_te: np.ndarray, k: int,
                   bins: int = BINS, smoothing: float = SMOOTHING) -> np.ndarray:
    """Held-out LPI in bits of every latent (columns of the codes) about u in 0..k-1 -> [N]."""
    tr, te = sp.csc_matrix(codes_tr), sp.csc_matrix(codes_te)
    u_tr, u_te = np.asarray(u_tr, dtype=np.int64), np.asarray(u_te, dtype=np.int64)
    prior = np.maximum(np.bincount(u_tr, minlength=k) / max(len(u_tr), 1), PRIOR_FLOOR)
    prior = prior / prior.sum()
    ce_prior = float(-np.log(prior[u_te]).mean())
    out = np.zeros(tr.shape[1])
    q = np.linspace(0, 1, bins + 1)[1:-1]
    for j in range(tr.shape[1]):
        a, b = tr.indptr[j], tr.indptr[j + 1]
        vals = tr.data[a:b]
        if vals.size == 0:
            continue  # never active on train: the probe is the prevalence, LPI 0
        edges = np.quantile(vals, q)
        col_tr = np.zeros(len(u_tr))
        col_tr[tr.indices[a:b]] = vals
        col_te = np.zeros(len(u_te))
        c, e = te.indptr[j], te.indptr[j + 1]
        col_te[te.indices[c:e]] = te.data[c:e]
        bt, be = _bin(col_tr, edges), _bin(col_te, edges)
        counts = np.zeros((bins + 1, k))
        np.add.at(counts, (bt, u_tr), 1.0)
        p = (counts + smoothing * prior) / (counts.sum(1, keepdims=True) + smoothing)
        out[j] = (ce_prior - float(-np.log(p[be, u_te]).mean())) / LN2
    return out


def concept_bits(r: np.ndarray) -> np.ndarray:
    """Gaussian mutual information of a correlation, in bits: -1/2 log2(1 - r^2)."""
    r2 = np.minimum(np.square(np.asarray(r, dtype=np.float64)), 1 - 1e-12)
    return -0.5 * np.log2(1.0 - r2)


def feature_rows(lpi: np.ndarray, top: int, selected: np.ndarray, r_test: np.ndarray,
                 concepts: tuple[str, ...], min_bits: float = 0.0) -> list[dict]:
    """The `top` latents by provenance LPI, then every concept-selected latent with its flag (provenance LPI above
    its concept bits and at least `min_bits`, so estimation noise around zero flags nothing)."""
    order = np.argsort(-lpi, kind="stable")
    rank = np.empty(len(lpi), dtype=np.int64)
    rank[order] = np.arange(1, len(lpi) + 1)
    rows = [{"kind": "top", "latent": int(j), "lpi_bits": float(lpi[j]), "lpi_rank": int(rank[j]), "concept": "",
             "concept_r_test": float("nan"), "concept_bits": float("nan"), "flagged": False}
            for j in order[:top]]
    bits = concept_bits(r_test)
    for name, j, r, cb in zip(concepts, selected, r_test, bits, strict=True):
        rows.append({"kind": "concept", "latent": int(j), "lpi_bits": float(lpi[j]), "lpi_rank": int(rank[j]),
                     "concept": name, "concept_r_test": float(r), "concept_bits": float(cb),
                     "flagged": bool(lpi[j] > cb and lpi[j] >= min_bits)})
    return rows
