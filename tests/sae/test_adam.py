"""raybench.sae.adam.StackAdam: torch.optim.Adam(fused=True)'s numbers and state_dict, without its wrapper."""

from __future__ import annotations

import pytest
import torch

from raybench.sae.adam import StackAdam


def _params(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 5, 4, generator=g, dtype=dtype), torch.randn(3, 5, generator=g, dtype=dtype)]


def _grads(step: int, params: list[torch.Tensor]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(p.shape, generator=g, dtype=p.dtype) for p in params]


def _step_both(opt, torch_opt, ours, ref, steps) -> None:
    """The same gradients into both optimizers, one step each, per step in `steps`."""
    for step in steps:
        for p, q, g in zip(ours, ref, _grads(step, ours), strict=True):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        torch_opt.step()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_steps_and_state_dict_equal_torch_fused_adam(dtype):
    ours, ref = _params(dtype), _params(dtype)
    opt = StackAdam(ours, lr=4e-4, betas=(0.9, 0.999))
    torch_opt = torch.optim.Adam(ref, lr=4e-4, betas=(0.9, 0.999), fused=True)
    assert opt.state_dict() == torch_opt.state_dict()  # before the first step: no state, same group
    for step in range(5):
        _step_both(opt, torch_opt, ours, ref, [step])
        for p, q in zip(ours, ref, strict=True):
            assert torch.equal(p, q)
    a, b = opt.state_dict(), torch_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for i in a["state"]:
        assert a["state"][i].keys() == b["state"][i].keys()
        for key in a["state"][i]:
            x, y = a["state"][i][key], b["state"][i][key]
            assert torch.equal(x, y) and x.dtype == y.dtype


def test_resumes_from_a_torch_state_dict_and_torch_from_ours():
    ours, ref = _params(torch.float32), _params(torch.float32)
    torch_opt = torch.optim.Adam(ref, lr=1e-3, betas=(0.8, 0.99), fused=True)
    for step in range(3):
        for q, g in zip(ref, _grads(step, ref), strict=True):
            q.grad = g
        torch_opt.step()
    for p, q in zip(ours, ref, strict=True):
        p.copy_(q.detach())
    opt = StackAdam(ours, lr=0.5, betas=(0.1, 0.2))  # hyperparameters come from the state_dict
    opt.load_state_dict(torch_opt.state_dict())
    back = torch.optim.Adam(_params(torch.float32), lr=1.0, fused=True)
    back.load_state_dict(opt.state_dict())
    assert back.state_dict()["param_groups"] == torch_opt.state_dict()["param_groups"]
    _step_both(opt, torch_opt, ours, ref, range(3, 6))
    for p, q in zip(ours, ref, strict=True):
        assert torch.equal(p, q)


def test_zero_grad_sets_none_and_a_wrong_state_is_refused():
    params = _params(torch.float32)
    opt = StackAdam(params, lr=1e-3, betas=(0.9, 0.999))
    for p in params:
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in params)
    other = torch.optim.Adam([torch.zeros(2, requires_grad=True)], lr=1e-3, fused=True)
    with pytest.raises(ValueError, match="1 tensors, this stack has 2"):
        opt.load_state_dict(other.state_dict())
