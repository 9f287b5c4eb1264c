"""Steps/s of one BatchTopK SAE training step: dense autograd reference vs the sparse path.

d = 768, k = 96, batch 256 (the paper protocol), E = N/d in {1, 8, 32}; single SAE and a stack of 3
(one trial trains the three seeds of a cell together). Also the loss-trajectory agreement of the two
paths over 50 steps (same seed, same batches), in float32 next to the dense reference's own float32
rounding floor (a thread-count change), and in float64, where rounding no longer hides a difference.
Usage: python bench/sae_train.py [--threads 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from raybench.config import SAEProtocol
from raybench.sae.model import SAECellConfig, StackedBatchTopKSAE
from raybench.sae.step import Stepper
from raybench.sae.train import train_stack

D, K, B = 768, 96, 256


def _acts(n: int, seed: int = 0) -> np.ndarray:
    """Activation-like data: low-rank structure + noise, non-zero mean, uneven scales."""
    rng = np.random.default_rng(seed)
    basis = rng.normal(size=(64, D)).astype(np.float32)
    x = rng.normal(size=(n, 64)).astype(np.float32) @ basis + 0.5 * rng.normal(size=(n, D)).astype(np.float32)
    return x * rng.uniform(0.2, 3.0, size=D).astype(np.float32) + rng.normal(size=D).astype(np.float32)


def _cfgs(e: int, s: int, steps: int) -> list[SAECellConfig]:
    return [SAECellConfig.from_protocol(SAEProtocol(steps=steps), D, e * D, K, 4311 + i) for i in range(s)]


def steps_per_s(x: torch.Tensor, e: int, s: int, impl: str, n_steps: int, warm: int) -> tuple[float, int]:
    cfgs = _cfgs(e, s, n_steps)
    sae = StackedBatchTopKSAE.from_seeds([c.seed for c in cfgs], D, e * D, K)
    stepper = Stepper(sae, cfgs, impl)
    rng = np.random.default_rng(1)
    batches = [torch.from_numpy(rng.integers(0, x.shape[0], size=(s, B))) for _ in range(warm + n_steps)]
    for i in range(warm):  # past step dead_after_batches, so AuxK entries are in the timed steps
        stepper.step(x[batches[i]])
    t0 = time.perf_counter()
    for i in range(warm, warm + n_steps):
        stepper.step(x[batches[i]])
    dt = time.perf_counter() - t0
    n_dead = int((stepper.dead_counter >= cfgs[0].dead_after_batches).sum())
    return n_steps / dt, n_dead // s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--expansions", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--timed-steps", type=int, default=5)
    ap.add_argument("--warm-steps", type=int, default=6)
    ap.add_argument("--traj-steps", type=int, default=50)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    x_np = _acts(8192)
    from raybench.sae.model import Normalizer

    x = torch.from_numpy(Normalizer.fit(x_np).apply(x_np))
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, d={D} k={K} B={B}; "
          f"{args.warm_steps} warm-up + {args.timed_steps} timed steps per row")
    print(f"{'E':>3} {'N':>6} {'S':>2} {'dense st/s':>11} {'sparse st/s':>12} {'speedup':>8} "
          f"{'SAE-st/s sparse':>16} {'dead/SAE':>9}")
    for e in args.expansions:
        for s in (1, 3):
            dn, _ = steps_per_s(x, e, s, "dense", args.timed_steps, args.warm_steps)
            sp, dead = steps_per_s(x, e, s, "sparse", args.timed_steps, args.warm_steps)
            print(f"{e:>3} {e * D:>6} {s:>2} {dn:>11.3f} {sp:>12.3f} {sp / dn:>7.2f}x {sp * s:>16.3f} {dead:>9}",
                  flush=True)
    print(f"\nloss trajectory over {args.traj_steps} steps, 1 SAE, same seed and batches: max relative difference "
          "of the per-step MSE / relative L2 distance of the MSE curves (AuxK max in brackets).\n"
          "  float32 sparse vs dense: our path against the reference;\n"
          f"  float32 dense vs dense: the reference at {args.threads} threads vs 1 thread (its own rounding floor);\n"
          "  float64 sparse vs dense: the same comparison with rounding taken out.")
    print(f"{'E':>3} {'f32 sparse/dense':>32} {'f32 dense/dense':>32} {'f64 sparse/dense':>32} {'final MSE':>10}")
    for e in args.expansions:
        cfg = _cfgs(e, 1, args.traj_steps)
        sp = train_stack(x_np, cfg, implementation="sparse")
        dn = train_stack(x_np, cfg, implementation="dense")
        torch.set_num_threads(1)
        dn1 = train_stack(x_np, cfg, implementation="dense")
        torch.set_num_threads(args.threads)
        sp64 = train_stack(x_np, cfg, implementation="sparse", dtype=torch.float64)
        dn64 = train_stack(x_np, cfg, implementation="dense", dtype=torch.float64)
        cols = [_traj_diff(a, b) for a, b in ((sp, dn), (dn1, dn), (sp64, dn64))]
        print(f"{e:>3} {cols[0]:>32} {cols[1]:>32} {cols[2]:>32} {dn.loss_mse[0, -1]:>10.4f}", flush=True)


def _traj_diff(a, b) -> str:  # noqa: ANN001
    mse = np.abs(a.loss_mse - b.loss_mse) / np.abs(b.loss_mse)
    aux = np.abs(a.loss_aux - b.loss_aux) / np.maximum(np.abs(b.loss_aux), 1e-12)
    aux[b.loss_aux == 0] = np.abs(a.loss_aux[b.loss_aux == 0])
    l2 = np.linalg.norm(a.loss_mse - b.loss_mse) / np.linalg.norm(b.loss_mse)
    return f"{mse.max():.1e} / {l2:.1e} [{aux.max():.1e}]"

if __name__ == "__main__":
    main()
