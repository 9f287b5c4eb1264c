"""Adam for the SAE stack: torch's fused Adam kernel, called directly (docs/architecture.md §5).

`torch.optim.Adam(fused=True)` runs one fused kernel per step, but its Python wrapper (hooks, grouping by
device, dynamo guards) costs ~0.3 ms a step, a tenth of a demo-sized step, and building the first one imports
torch._dynamo (~1.8 s per trial process). `StackAdam` calls the same kernel (`torch._fused_adam_`) with the
same state, so its numbers are torch's bit for bit, and its `state_dict` is torch.optim.Adam's (checkpoints
written by either load in the other). Devices without the fused kernel get torch.optim.Adam itself.
"""

from __future__ import annotations

from typing import Any

import torch

FUSED_DEVICES = ("cpu", "cuda")


class StackAdam:
    """Adam (no weight decay, no amsgrad) over a few tensors that always all have gradients."""

    def __init__(self, params: list[torch.Tensor], lr: float, betas: tuple[float, float], eps: float = 1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = float(lr), (float(betas[0]), float(betas[1])), float(eps)
        self.fused = all(p.device.type in FUSED_DEVICES for p in self.params)
        self._fallback = None if self.fused else torch.optim.Adam(self.params, lr=lr, betas=betas, eps=eps)
        self.steps: list[torch.Tensor] = []  # torch's lazy state: made at the first step
        self.exp_avgs: list[torch.Tensor] = []
        self.exp_avg_sqs: list[torch.Tensor] = []

    def _init_state(self) -> None:
        # as torch.optim.Adam._init_group for fused: a float32 step counter on the parameter's device
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]
        self.exp_avgs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sqs = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]

    @torch.no_grad()
    def step(self) -> None:
        if self._fallback is not None:
            self._fallback.step()
            return
        if not self.steps:
            self._init_state()
        torch._foreach_add_(self.steps, 1)
        torch._fused_adam_(self.params, [p.grad for p in self.params], self.exp_avgs, self.exp_avg_sqs, [],
                           self.steps, amsgrad=False, lr=self.lr, beta1=self.betas[0], beta2=self.betas[1],
                           weight_decay=0.0, eps=self.eps, maximize=False, grad_scale=None, found_inf=None)

    def zero_grad(self) -> None:
        """Gradients set to None (torch's default)."""
        for p in self.params:
            p.grad = None

    def state_dict(self) -> dict[str, Any]:
        """torch.optim.Adam(fused=True)'s state_dict: the same keys, tensors and hyperparameters."""
        if self._fallback is not None:
            return self._fallback.state_dict()
        state = {i: {"step": s, "exp_avg": m, "exp_avg_sq": v}
                 for i, (s, m, v) in enumerate(zip(self.steps, self.exp_avgs, self.exp_avg_sqs, strict=True))}
        group = {"lr": self.lr, "betas": self.betas, "eps": self.eps, "weight_decay": 0, "amsgrad": False,
                 "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": True,
                 "decoupled_weight_decay": False, "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        """Resume from a state_dict of this class or of torch.optim.Adam over the same tensors."""
        if self._fallback is not None:
            self._fallback.load_state_dict(sd)
            return
        (group,) = sd["param_groups"]
        if len(group["params"]) != len(self.params):
            raise ValueError(f"Adam state for {len(group['params'])} tensors, this stack has {len(self.params)}")
        self.lr, self.betas, self.eps = float(group["lr"]), tuple(float(b) for b in group["betas"]), \
            float(group["eps"])
        state = sd["state"]
        if not state:
            self.steps, self.exp_avgs, self.exp_avg_sqs = [], [], []
            return
        self._init_state()
        for i, p in enumerate(self.params):
            st = state[group["params"][i]]
            self.steps[i].copy_(st["step"])
            self.exp_avgs[i].copy_(st["exp_avg"].to(p.device, p.dtype))
            self.exp_avg_sqs[i].copy_(st["exp_avg_sq"].to(p.device, p.dtype))
