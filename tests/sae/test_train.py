"""Stacked BatchTopK training: unit decoder, dead latents/AuxK, stacking, sparse == dense, resume, recovery."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from scipy.optimize import linear_sum_assignment

import raybench.sae.sparse_grads as sparse_grads
import raybench.sae.step as step
from raybench.sae.model import SAECellConfig, StackedBatchTopKSAE
from raybench.sae.step import Stepper, auto_implementation
from raybench.sae.train import train_stack


def _cfg(seed: int, **kw) -> SAECellConfig:
    base = dict(d=16, n_latents=64, k=3, seed=seed, steps=30, batch_size=32, lr=3e-3, beta1=0.9, beta2=0.99,
                aux_k=8, aux_coef=1 / 32, dead_after_batches=3)
    base.update(kw)
    return SAECellConfig(**base)


def _data(n: int = 600, d: int = 16, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) * rng.uniform(0.5, 3.0, size=d) + rng.normal(size=d)).astype(np.float32)


def _aux_reference(sae: StackedBatchTopKSAE, x: np.ndarray, dead: np.ndarray, aux_k: int) -> float:
    """AuxK from numpy: top-aux_k dead ReLU pre-activations per sample reconstruct the residual."""
    we, be = sae.W_enc[0].detach().double().numpy(), sae.b_enc[0].detach().double().numpy()
    wd, bd = sae.W_dec[0].detach().double().numpy(), sae.b_dec[0].detach().double().numpy()
    x = x.astype(np.float64)
    p = np.maximum((x - bd) @ we.T + be, 0.0)
    flat = p.ravel()
    keep = np.argsort(-flat, kind="stable")[: x.shape[0] * sae.k]
    z = np.zeros_like(flat)
    z[keep] = flat[keep]
    resid = x - (z.reshape(p.shape) @ wd.T + bd)
    pd = np.where(dead[None, :], p, -np.inf)
    kx = min(aux_k, int(dead.sum()))
    za = np.zeros_like(p)
    for b in range(p.shape[0]):
        top = np.argsort(-pd[b])[:kx]
        za[b, top] = p[b, top]
    return float(((za @ wd.T - resid) ** 2).mean())


@pytest.mark.parametrize("impl", ["sparse", "dense"])
def test_unit_decoder_dead_counter_and_auxk_on_planted_dead_latent(impl):
    torch.manual_seed(0)
    cfg = _cfg(1, n_latents=32, k=4, aux_k=2, dead_after_batches=3)
    sae = StackedBatchTopKSAE.from_seeds([cfg.seed], cfg.d, cfg.n_latents, cfg.k)
    j = 5
    with torch.no_grad():  # planted: tiny positive pre-activations that never win the batch top-k
        sae.W_enc[0, j] = 0.0
        sae.b_enc[0, j] = 1e-3
    stepper = Stepper(sae, [cfg], impl)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8 * 32, cfg.d)).astype(np.float32)
    for t in range(1, 8):
        xb = torch.from_numpy(x[(t - 1) * 32:t * 32]).unsqueeze(0)
        before = StackedBatchTopKSAE.stack([sae.single(0)])
        mse, aux = stepper.step(xb)
        counter = stepper.dead_counter[0]
        assert int(counter[j]) == t  # never fired
        dead = (counter >= cfg.dead_after_batches).numpy()
        torch.testing.assert_close(sae.W_dec.norm(dim=1), torch.ones(1, cfg.n_latents))  # after every step
        grad_j = float(sae.b_enc.grad[0, j].abs())
        if t < cfg.dead_after_batches:
            assert not dead.any() and float(aux[0]) == 0.0 and grad_j == 0.0
        else:
            assert dead[j]
            assert float(aux[0]) > 0 and grad_j > 0  # AuxK pulls the dead latent towards the residual
            assert float(aux[0]) == pytest.approx(_aux_reference(before, xb[0].numpy(), dead, cfg.aux_k), rel=1e-4)
        assert float(mse[0]) > 0


def test_dead_counter_resets_when_latent_fires():
    cfg = _cfg(2, n_latents=16, k=2, dead_after_batches=2)
    sae = StackedBatchTopKSAE.from_seeds([cfg.seed], cfg.d, cfg.n_latents, cfg.k)
    stepper = Stepper(sae, [cfg], "sparse")
    stepper.dead_counter[0].fill_(10)
    x = torch.from_numpy(_data(32)).unsqueeze(0)
    codes, _ = sae.encode(x)
    fired = torch.zeros(16, dtype=torch.bool)
    fired[codes.flat[0][codes.values[0] > 0] % 16] = True
    stepper.step(x)
    assert torch.equal(stepper.dead_counter[0] == 0, fired)
    assert bool((stepper.dead_counter[0][~fired] == 11).all())


def test_stacked_equals_separate_runs():
    x = _data()
    cfgs = [_cfg(s) for s in (11, 12, 13)]
    stacked = train_stack(x, cfgs)
    for i, c in enumerate(cfgs):
        alone = train_stack(x, [c])
        np.testing.assert_allclose(stacked.loss_mse[i], alone.loss_mse[0], atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(stacked.loss_aux[i], alone.loss_aux[0], atol=1e-5, rtol=1e-5)
        for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
            torch.testing.assert_close(getattr(stacked.sae, name)[i], getattr(alone.sae, name)[0],
                                       atol=1e-5, rtol=1e-5)
    assert not np.allclose(stacked.loss_mse[0], stacked.loss_mse[1])  # seeds really differ


@pytest.mark.parametrize("aux_block_ratio", [16, 0])  # AuxK as a dense block over touched latents / as entries
def test_sparse_path_equals_dense_reference(aux_block_ratio, monkeypatch):
    monkeypatch.setattr(sparse_grads, "AUX_BLOCK_MAX_RATIO", aux_block_ratio)
    x = _data()
    cfgs = [_cfg(s, steps=30, dead_after_batches=2) for s in (21, 22)]
    sp = train_stack(x, cfgs, implementation="sparse")
    de = train_stack(x, cfgs, implementation="dense")
    assert sp.loss_aux[:, -10:].min() > 0  # dead latents appeared: AuxK entries were exercised
    np.testing.assert_allclose(sp.loss_mse, de.loss_mse, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(sp.loss_aux, de.loss_aux, rtol=1e-4, atol=1e-6)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        torch.testing.assert_close(getattr(sp.sae, name), getattr(de.sae, name), atol=1e-4, rtol=1e-4)
    np.testing.assert_array_equal(sp.dead_counter, de.dead_counter)


@pytest.mark.parametrize("layout_ratio", [0, 10**9])  # CSR/CSC order by sorting / from a [B, N] mask
@pytest.mark.parametrize("aux_block_ratio", [16, 0])
def test_sparse_path_equals_dense_reference_to_float64_rounding(aux_block_ratio, layout_ratio, monkeypatch):
    """In float64 the two paths agree to ~1e-12 over the whole run: the float32 gap is rounding, not maths."""
    monkeypatch.setattr(sparse_grads, "AUX_BLOCK_MAX_RATIO", aux_block_ratio)
    monkeypatch.setattr(step, "MASK_LAYOUT_MAX_RATIO", layout_ratio)
    x = _data()
    cfgs = [_cfg(s, steps=30, dead_after_batches=2) for s in (21, 22)]
    sp = train_stack(x, cfgs, implementation="sparse", dtype=torch.float64)
    de = train_stack(x, cfgs, implementation="dense", dtype=torch.float64)
    assert sp.sae.W_enc.dtype == torch.float64 and sp.loss_aux[:, -10:].min() > 0
    np.testing.assert_allclose(sp.loss_mse, de.loss_mse, rtol=1e-11, atol=0)
    np.testing.assert_allclose(sp.loss_aux, de.loss_aux, rtol=1e-11, atol=0)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        torch.testing.assert_close(getattr(sp.sae, name), getattr(de.sae, name), atol=1e-11, rtol=1e-11)


@pytest.mark.parametrize("b,n,k", [(32, 96, 12), (64, 768, 96)])  # the second: the mask from topk_mask
def test_sparse_layouts_agree_entry_for_entry(b, n, k, monkeypatch):
    """The mask layout (dense codes) gives the sort layout's CSR entries, row pointers and column order exactly."""
    torch.manual_seed(0)
    p = torch.relu(torch.randn(3, b, n))
    p[0, :, :5] = 0.0  # zero columns: kept entries may be zeros too
    assert (step.topk_mask(p, k) is None) == (b * n < 32768)
    monkeypatch.setattr(step, "MASK_LAYOUT_MAX_RATIO", 0)
    by_sort = step.sparse_layout(p, k)
    monkeypatch.setattr(step, "MASK_LAYOUT_MAX_RATIO", 10**9)
    by_mask = step.sparse_layout(p, k)
    for a, b_ in zip(by_sort, by_mask, strict=True):
        assert torch.equal(a, b_)
    rows, cols, _, crow, corder = by_mask
    assert torch.equal(crow[:, -1], torch.full((3,), b * k))
    c = cols.gather(1, corder)
    assert (c[:, 1:] >= c[:, :-1]).all()  # column-major ...
    r = rows.gather(1, corder)
    assert ((c[:, 1:] > c[:, :-1]) | (r[:, 1:] > r[:, :-1])).all()  # ... rows ascending within a column


def test_threaded_stack_equals_the_serial_one(monkeypatch):
    """The SAEs of a stack on concurrent threads (large SAEs with several torch threads) give the serial result
    bit for bit: each SAE runs the same kernels on its own rows."""
    x = _data()
    cfgs = [_cfg(s, steps=12, dead_after_batches=2) for s in (41, 42, 43)]
    torch.set_num_threads(2)
    try:
        monkeypatch.setattr(step, "THREADED_MIN_LATENTS", 10**9)
        serial = train_stack(x, cfgs, implementation="sparse")
        monkeypatch.setattr(step, "THREADED_MIN_LATENTS", 0)
        threaded = train_stack(x, cfgs, implementation="sparse")
    finally:
        torch.set_num_threads(1)
    np.testing.assert_array_equal(threaded.loss_mse, serial.loss_mse)
    np.testing.assert_array_equal(threaded.loss_aux, serial.loss_aux)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        assert torch.equal(getattr(threaded.sae, name), getattr(serial.sae, name)), name


@pytest.mark.parametrize("grad_clip", [None, 0.05])
@pytest.mark.parametrize("aux_block_ratio", [16, 0])  # AuxK as dense blocks / as entry kernels
def test_whole_stack_step_equals_the_sae_by_sae_one(grad_clip, aux_block_ratio, monkeypatch):
    """The stack's sparse step run as one block-diagonal SAE gives every SAE's numbers bit for bit: losses,
    weights, dead counters and pre-clip gradient norms (AuxK active, first-step renormalisation, clipping)."""
    monkeypatch.setattr(sparse_grads, "AUX_BLOCK_MAX_RATIO", aux_block_ratio)
    x = _data()
    cfgs = [_cfg(s, steps=15, dead_after_batches=2, grad_clip=grad_clip) for s in (51, 52, 53)]
    monkeypatch.setattr(step, "WHOLE_STACK", False)
    by_sae = train_stack(x, cfgs, implementation="sparse")
    monkeypatch.setattr(step, "WHOLE_STACK", True)
    whole = train_stack(x, cfgs, implementation="sparse")
    assert by_sae.loss_aux[:, 5:].min() > 0  # AuxK was active
    if grad_clip is not None:
        assert (by_sae.grad_norm > grad_clip).any()  # clipping fired
        np.testing.assert_array_equal(whole.grad_norm, by_sae.grad_norm)
    np.testing.assert_array_equal(whole.loss_mse, by_sae.loss_mse)
    np.testing.assert_array_equal(whole.loss_aux, by_sae.loss_aux)
    np.testing.assert_array_equal(whole.dead_counter, by_sae.dead_counter)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        assert torch.equal(getattr(whole.sae, name), getattr(by_sae.sae, name)), name


def test_resume_from_checkpoint_is_exact():
    x = _data()
    cfgs = [_cfg(s, steps=20) for s in (31, 32)]
    full = train_stack(x, cfgs)
    saved = {}
    train_stack(x, cfgs, on_checkpoint=lambda step, st: saved.setdefault(step, st), checkpoint_every=7)
    assert sorted(saved) == [7, 14]
    resumed = train_stack(x, cfgs, state=saved[14])
    np.testing.assert_array_equal(resumed.loss_mse, full.loss_mse)
    for name in ("W_enc", "b_enc", "W_dec_t", "b_dec"):
        assert torch.equal(getattr(resumed.sae, name), getattr(full.sae, name))
    with pytest.raises(ValueError, match="resume state"):
        train_stack(x, [_cfg(99, steps=20)], state=saved[14])


def test_auto_implementation_picks_by_code_density_and_size():
    dense_codes = StackedBatchTopKSAE.from_seeds([1], 16, 64, 4)  # k/N = 1/16
    sparse_codes = StackedBatchTopKSAE.from_seeds([1], 16, 256, 4)  # k/N = 1/64
    assert Stepper(dense_codes, [_cfg(1, k=4)], "auto").impl == "dense"
    assert Stepper(sparse_codes, [_cfg(1, n_latents=256, k=4)], "auto").impl == "sparse"
    assert auto_implementation(64, 64, 8, 128) == "dense"  # the demo's E = 1
    assert auto_implementation(768, 768, 96, 256) == "sparse"  # the paper's E = 1: dense codes, but large
    assert auto_implementation(768, 768 * 32, 96, 256) == "sparse"


def test_config_errors():
    x = _data(40)
    with pytest.raises(ValueError, match="fewer than batch_size"):
        train_stack(x[:10], [_cfg(1)])
    with pytest.raises(ValueError, match="share d, N, k"):
        train_stack(x, [_cfg(1), _cfg(2, k=4)])
    with pytest.raises(ValueError, match="must be \\[n, d=16\\]"):
        train_stack(x[:, :8], [_cfg(1)])
    with pytest.raises(ValueError, match="implementation"):
        train_stack(x, [_cfg(1, steps=1)], implementation="fast")


def test_recovers_planted_sparse_dictionary():
    """d=32, 64 unit atoms, 3 non-negative atoms per sample: the decoder must find the atoms."""
    rng = np.random.default_rng(0)
    d, n_atoms, n = 32, 64, 8192
    atoms = rng.normal(size=(n_atoms, d))
    atoms /= np.linalg.norm(atoms, axis=1, keepdims=True)
    coef = np.zeros((n, n_atoms))
    for i in range(n):
        coef[i, rng.choice(n_atoms, 3, replace=False)] = rng.uniform(0.5, 1.5, 3)
    x = (coef @ atoms).astype(np.float32)
    cfg = dataclasses.replace(_cfg(5), d=d, n_latents=128, k=3, steps=400, batch_size=256, aux_k=32,
                              dead_after_batches=5)
    res = train_stack(x, [cfg])

    def matched_cos(w_dec: np.ndarray) -> float:
        target = atoms / res.normalizer.std  # the atoms as seen in normalized space
        target /= np.linalg.norm(target, axis=1, keepdims=True)
        sim = np.abs(target @ w_dec)
        r, c = linear_sum_assignment(-sim)
        return float(sim[r, c].mean())

    init = StackedBatchTopKSAE.from_seeds([cfg.seed], d, cfg.n_latents, cfg.k)
    assert matched_cos(init.W_dec[0].detach().numpy()) < 0.6
    assert matched_cos(res.sae.W_dec[0].detach().numpy()) > 0.9
    assert res.loss_mse[0, -20:].mean() < 0.2 * res.loss_mse[0, :5].mean()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: one thread avoids OpenMP wake-up costs on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
