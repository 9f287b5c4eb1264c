"""Per-cell evaluation against direct formulas, and the cell folder round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr

from raybench.core.config import EvalProtocol
from raybench.sae.cell_files import CELL_FILES, load_cell_metrics, load_cell_sae, save_cell
from raybench.sae.evaluate import encode_split, evaluate_cell, pearson_from_sums
from raybench.sae.model import Normalizer, StackedBatchTopKSAE

D, N, K, C = 6, 24, 2, 4


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _setup(seed: int = 0):
    rng = np.random.default_rng(seed)
    sae = StackedBatchTopKSAE.from_seeds([3, 4], D, N, K)
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.2, generator=torch.Generator().manual_seed(1))
        sae.b_enc[1, :4] = -50.0  # four latents of SAE 1 can never fire: dead on every split
        sae.b_dec.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
    acts = {s: (rng.normal(size=(n, D)) * 2 + 1).astype(np.float32) for s, n in
            (("train", 60), ("val", 23), ("test", 30))}
    norm = Normalizer.fit(acts["train"])
    concepts = {s: rng.normal(size=(a.shape[0], C)).astype(np.float32) for s, a in acts.items()}
    concepts["test"][:, 0] += acts["test"][:, 0]  # something to find
    patients = rng.integers(0, 7, size=30)
    patients[:7] = np.arange(7)
    sel_idx = np.sort(rng.choice(60, 40, replace=False))
    return sae, norm, acts, concepts, patients, sel_idx


def _dense_codes(sae1: StackedBatchTopKSAE, xn: np.ndarray, batch: int) -> np.ndarray:
    """Independent BatchTopK: numpy, per frozen-order batch, B*k largest of ReLU(pre)."""
    we, be = sae1.W_enc[0].detach().double().numpy(), sae1.b_enc[0].detach().double().numpy()
    bd = sae1.b_dec[0].detach().double().numpy()
    out = []
    for s in range(0, xn.shape[0], batch):
        xb = xn[s:s + batch].astype(np.float64)
        p = np.maximum((xb - bd) @ we.T + be, 0.0).ravel()
        keep = np.argsort(-p, kind="stable")[: xb.shape[0] * sae1.k]
        z = np.zeros_like(p)
        z[keep] = p[keep]
        out.append(z.reshape(xb.shape[0], -1))
    return np.concatenate(out)


@pytest.mark.parametrize("index", [0, 1])
def test_evaluate_cell_matches_direct_formulas(index):
    sae, norm, acts, concepts, patients, sel_idx = _setup()
    ev_cfg = EvalProtocol(eval_batch=7, repro_top=5)  # 23 and 30 records: last batches are partial
    ev = evaluate_cell(sae, norm, acts, concepts, patients, sel_idx, ev_cfg, index=index)
    one = sae.single(index)
    wd, bd = one.W_dec[0].detach().double().numpy(), one.b_dec[0].detach().double().numpy()

    z_sel = _dense_codes(one, norm.apply(acts["train"][sel_idx]), 7)
    y_sel = concepts["train"][sel_idx]
    corr = np.zeros((N, C))
    for j in range(N):
        for c in range(C):
            if z_sel[:, j].std() > 0:
                corr[j, c] = pearsonr(z_sel[:, j], y_sel[:, c])[0]
    np.testing.assert_array_equal(ev.selected, np.abs(corr).argmax(axis=0))

    for split in ("val", "test"):
        xn = norm.apply(acts[split]).astype(np.float64)
        z = _dense_codes(one, xn.astype(np.float32), 7)
        x_hat = z @ wd.T + bd
        r2 = 1 - ((x_hat - xn) ** 2).sum() / ((xn - xn.mean(0)) ** 2).sum()
        assert ev.metrics[f"{split}_r2"] == pytest.approx(r2, rel=1e-5)
        assert ev.metrics[f"{split}_dead_fraction"] == pytest.approx(((z > 0).sum(0) == 0).mean())
        assert ev.metrics[f"{split}_mean_l0"] == pytest.approx((z > 0).sum() / len(z))
        r = np.array([pearsonr(z[:, j], concepts[split][:, c])[0] if z[:, j].std() > 0 else 0.0
                      for c, j in enumerate(ev.selected)])
        np.testing.assert_allclose(ev.r_val if split == "val" else ev.r_test, r, atol=1e-6)
        assert ev.metrics[f"{split}_accessibility"] == pytest.approx(np.abs(r).mean())
        assert ev.metrics[f"{split}_coverage"] == pytest.approx((np.abs(r) >= 0.2).mean())
        if split == "val":
            np.testing.assert_allclose(ev.firing_rate_val, (z > 0).mean(0))
    if index == 1:
        assert ev.metrics["val_dead_fraction"] >= 4 / N
    gate = ev.metrics["val_r2"] >= 0.9 and ev.metrics["val_dead_fraction"] < 0.2
    assert ev.metrics["gate_pass"] is gate

    # patient statistics add up to the full-test totals
    xt = norm.apply(acts["test"]).astype(np.float64)
    zt = _dense_codes(one, xt.astype(np.float32), 7)
    assert ev.patient_n.sum() == 30 and ev.patient_n.shape == (7,)
    assert ev.patient_sse.sum() == pytest.approx(((zt @ wd.T + bd - xt) ** 2).sum(), rel=1e-5)
    assert ev.patient_sst.sum() == pytest.approx(((xt - xt.mean(0)) ** 2).sum(), rel=1e-6)
    tot = ev.patient_corr.sum(axis=0)  # [C, 5]
    r_pool = pearson_from_sums(30, tot[:, 0], tot[:, 1], tot[:, 2], tot[:, 3], tot[:, 4])
    np.testing.assert_allclose(r_pool, ev.r_test, atol=1e-9)
    p3 = patients == 3
    a3 = zt[p3][:, ev.selected]
    np.testing.assert_allclose(ev.patient_corr[3, :, 4], (a3 * concepts["test"][p3]).sum(0), rtol=1e-5)

    # decoder_top: non-dead columns, most active first
    alive = np.flatnonzero(ev.firing_rate_val > 0)
    assert ev.decoder_top_idx.size == min(5, alive.size)
    assert set(ev.decoder_top_idx) <= set(alive)
    rates = ev.firing_rate_val[ev.decoder_top_idx]
    assert (np.diff(rates) <= 0).all() and rates[-1] >= np.sort(ev.firing_rate_val[alive])[-5]
    np.testing.assert_allclose(ev.decoder_top, wd[:, ev.decoder_top_idx].astype(np.float32))


def test_pearson_from_sums_constant_is_zero_and_matches_scipy():
    rng = np.random.default_rng(1)
    a, y = rng.normal(size=50), rng.normal(size=50)
    r = pearson_from_sums(50, a.sum(), y.sum(), (a * a).sum(), (y * y).sum(), (a * y).sum())
    assert float(r) == pytest.approx(pearsonr(a, y)[0], abs=1e-12)
    c = np.full(50, 0.7)
    assert float(pearson_from_sums(50, c.sum(), y.sum(), (c * c).sum(), (y * y).sum(), (c * y).sum())) == 0.0
    z = np.zeros(50)
    assert float(pearson_from_sums(50, 0.0, y.sum(), 0.0, (y * y).sum(), 0.0)) == 0.0 == z.sum()


def test_encode_split_partial_batch_uses_its_own_budget():
    sae, norm, acts, *_ = _setup()
    one = sae.single(0)
    codes = encode_split(one, norm, acts["val"], eval_batch=10)  # batches of 10, 10, 3
    per_batch = np.bincount(codes.rows // 10, minlength=3)
    assert per_batch.tolist() == [10 * K, 10 * K, 3 * K]  # all pre-activations positive enough here
    with pytest.raises(ValueError, match="single SAE"):
        encode_split(sae, norm, acts["val"], eval_batch=10)


def test_evaluate_rejects_bad_inputs():
    sae, norm, acts, concepts, patients, sel_idx = _setup()
    bad = dict(concepts, val=np.full_like(concepts["val"], np.nan))
    with pytest.raises(ValueError, match="NaN"):
        evaluate_cell(sae, norm, acts, bad, patients, sel_idx, EvalProtocol())
    with pytest.raises(ValueError, match="test_patient_codes"):
        evaluate_cell(sae, norm, acts, concepts, patients[:5], sel_idx, EvalProtocol())


def test_cell_roundtrip_is_complete_and_atomic(tmp_path):
    sae, norm, acts, concepts, patients, sel_idx = _setup()
    ev = evaluate_cell(sae, norm, acts, concepts, patients, sel_idx, EvalProtocol(eval_batch=8, repro_top=6))
    cell = tmp_path / "cells" / "csfm_d0.5_E4_s4311"
    cfg = {"model": "csfm", "seed": 4311, "steps": 10, "std_floor": 1e-6}
    save_cell(cell, sae.single(0), cfg, ev, {"train_seconds": 1.5}, normalizer=norm)
    assert sorted(p.name for p in cell.iterdir()) == sorted(CELL_FILES)
    assert [p.name for p in cell.parent.iterdir()] == [cell.name]  # no temp folders left behind
    loaded, norm2 = load_cell_sae(cell)
    np.testing.assert_array_equal(norm2.mean, norm.mean)
    np.testing.assert_array_equal(norm2.std, norm.std)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        assert torch.equal(getattr(loaded, name)[0], getattr(sae, name)[0])
    x = torch.from_numpy(norm.apply(acts["val"][:8])).unsqueeze(0)
    torch.testing.assert_close(loaded(x), sae.single(0)(x))
    m = load_cell_metrics(cell)
    assert m["val_r2"] == pytest.approx(ev.metrics["val_r2"]) and m["train_seconds"] == 1.5
    assert m["selected"] == ev.selected.tolist()
    with np.load(cell / "patient_stats.npz") as stats:
        np.testing.assert_array_equal(stats["corr"], ev.patient_corr)
        np.testing.assert_array_equal(stats["n"], ev.patient_n)
    with np.load(cell / "decoder_top.npz") as top:
        np.testing.assert_array_equal(top["idx"], ev.decoder_top_idx)
    cfg_on_disk = json.loads((cell / "cfg.json").read_text())
    assert (cfg_on_disk["d"], cfg_on_disk["n_latents"], cfg_on_disk["k"]) == (D, N, K)
    assert cfg_on_disk["model"] == "csfm"

    def boom(*_a, **_k):
        raise RuntimeError("killed mid-write")

    import raybench.sae.cell_files as cell_files

    orig = cell_files.np.savez
    cell_files.np.savez = boom
    try:
        with pytest.raises(RuntimeError):
            save_cell(cell, sae.single(1), cfg, ev, normalizer=norm)
    finally:
        cell_files.np.savez = orig
    assert torch.equal(load_cell_sae(cell)[0].W_enc[0], sae.W_enc[0])  # old complete cell untouched
    assert [p.name for p in cell.parent.iterdir()] == [cell.name]
    with pytest.raises(ValueError, match="overwrite"):
        save_cell(cell, sae.single(0), cfg, ev, {"val_r2": 1.0}, normalizer=norm)
    with pytest.raises(FileNotFoundError, match="incomplete"):
        load_cell_sae(tmp_path)
