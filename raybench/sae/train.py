"""Stacked BatchTopK SAE training (docs/protocol.md §6; performance: docs/architecture.md §5).

`train_stack` trains S SAEs of one shape together. Each SAE keeps its own batches (raybench.sae.sampler),
dead counters and loss, and Adam is elementwise, so every SAE in a stack follows exactly the trajectory it
would follow alone. The step itself (dense autograd reference or the sparse path, optional gradient
clipping) is raybench.sae.step. A checkpoint (`on_checkpoint`) is a plain dict of CPU tensors, arrays and
ints from which `train_stack(state=...)` resumes exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raybench.sae.model import Normalizer, SAECellConfig, StackedBatchTopKSAE
from raybench.sae.sampler import SAMPLER_CLASSES, BatchSampler
from raybench.sae.step import Stepper

STATE_VERSION = 1
# what the SAEs of one stack must share (one batch loop); lr and betas too (one optimizer, checked in train_stack)
STACK_SHARED = ("d", "n_latents", "k", "steps", "batch_size", "sampler", "grad_clip")


@dataclass
class TrainResult:
    normalizer: Normalizer
    sae: StackedBatchTopKSAE  # S SAEs, on CPU
    loss_mse: np.ndarray  # [S, steps] reconstruction MSE (normalized space, mean over batch x d)
    loss_aux: np.ndarray  # [S, steps] AuxK term before aux_coef (0 while no latent is dead)
    dead_counter: np.ndarray  # [S, N] consecutive batches without firing at the end
    cfgs: list[SAECellConfig]
    grad_norm: np.ndarray | None = None  # [S, steps] total gradient norm before clipping (only when clipping)


def _check_cfgs(cfgs: list[SAECellConfig]) -> None:
    if not cfgs:
        raise ValueError("train_stack needs at least one SAECellConfig")
    for c in cfgs:
        c.validate()
    first = cfgs[0]
    for c in cfgs[1:]:
        if any(getattr(c, name) != getattr(first, name) for name in STACK_SHARED):
            raise ValueError(f"stacked SAEs must share d, N, k, steps, batch_size, sampler and grad_clip: "
                             f"{first} vs {c}")
    if len({c.seed for c in cfgs}) != len(cfgs):
        raise ValueError(f"stacked SAEs have duplicate seeds: {[c.seed for c in cfgs]}")


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
    on_log: Callable[[int, dict[str, np.ndarray]], None] | None = None,
    log_every: int = 0,
) -> TrainResult:
    """Train len(cfgs) SAEs (same d, N, k; own seeds) on raw train activations [n, d].

    `state` (from on_checkpoint) resumes exactly where it was taken; checkpoints are CPU-only
    plain dicts of tensors/arrays, safe to hand to Ray. `implementation`: "sparse" (fast at
    large N), "dense" (autograd reference), "auto" (dense only for codes denser than 1/32).
    `dtype` float64 is for numerical checks: it takes rounding out of sparse-vs-dense comparisons.
    `on_log(step, point)` (experiment tracking, every `log_every` steps and at the end): see `_log_point`.
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
    stepper = Stepper(sae, cfgs, implementation)
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
        if on_log is not None and log_every > 0 and (done % log_every == 0 or done == steps):
            on_log(done, _log_point(done, log_every, loss_mse, loss_aux, stepper))
    sae_cpu = sae.cpu()
    for p in sae_cpu.parameters():
        p.grad = None
    return TrainResult(normalizer, sae_cpu, loss_mse, loss_aux, stepper.dead_counter.cpu().numpy(), list(cfgs),
                       grad_norm)


def _log_point(done: int, every: int, loss_mse: np.ndarray, loss_aux: np.ndarray, stepper: Stepper
               ) -> dict[str, np.ndarray]:
    """[S] per key: MSE and AuxK means over the steps since the last point, and the fraction of latents dead now
    (dead counter >= dead_after_batches) - the dead fraction is not kept per step, so it is read here."""
    lo = done - (done % every or every)  # the previous point: the last multiple of `every` before `done`
    dead_after = torch.tensor(stepper.dead_after, device=stepper.dead_counter.device)[:, None]
    dead = (stepper.dead_counter >= dead_after).double().mean(dim=1)
    return {"mse": loss_mse[:, lo:done].mean(axis=1), "aux": loss_aux[:, lo:done].mean(axis=1),
            "dead_fraction": dead.cpu().numpy()}


def _state(step: int, sae: StackedBatchTopKSAE, stepper: Stepper, batchers: list[BatchSampler],
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
