"""Deterministic stand-in weights shared by the parity fixture generators and the parity tests.

`det_state_dict(shapes, seed)` maps every parameter name to a tensor that depends only on (seed, name,
shape): the generator (running the upstream model code) and the test (running raybench's adapter) build
identical weights from the same names, so no checkpoint is stored. Scales are "sane" for a forward pass
at full size: matrices and kernels ~ N(0, 1 / fan_in) (fan_in = the product of all but the first axis),
1-D `...weight` tensors (norm gains) 1 + 0.1 N(0, 1), every other 1-D or 0-D tensor (biases, embeddings
vectors) 0.02 N(0, 1). Values are drawn in float64 with numpy's PCG64 seeded from SHA-256("seed:name")
and rounded once to float32. Non-float entries (integer buffers) are zeros of their dtype.

This file imports numpy and torch only, so a generator can run it in a scratch environment.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch


def det_array(name: str, shape: Sequence[int], seed: int = 0) -> np.ndarray:
    """The float32 array for one parameter name and shape."""
    shape = tuple(int(s) for s in shape)
    digest = hashlib.sha256(f"{int(seed)}:{name}".encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "little")))
    z = rng.standard_normal(shape)
    if len(shape) >= 2:
        fan_in = math.prod(shape[1:])
        out = z / math.sqrt(max(fan_in, 1))
    elif len(shape) == 1 and name.rsplit(".", 1)[-1] == "weight":
        out = 1.0 + 0.1 * z
    else:
        out = 0.02 * z
    return np.ascontiguousarray(out, dtype=np.float32)


def det_state_dict(shapes: Mapping[str, object], seed: int = 0) -> dict[str, torch.Tensor]:
    """{name: shape} (or a state dict, whose tensors give shape and dtype) -> {name: deterministic tensor}."""
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        value = shapes[name]
        if isinstance(value, torch.Tensor):
            shape, dtype = tuple(value.shape), value.dtype
        else:
            shape, dtype = tuple(value), torch.float32  # type: ignore[arg-type]
        if not dtype.is_floating_point:
            out[name] = torch.zeros(shape, dtype=dtype)
            continue
        out[name] = torch.from_numpy(det_array(name, shape, seed)).to(dtype)
    return out
