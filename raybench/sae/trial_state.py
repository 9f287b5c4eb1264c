"""An in-trial checkpoint without pickle: tensors in state.safetensors, everything else in state.json.

What `raybench.sae.train.train_stack` hands to `on_checkpoint` (weights, Adam moments, dead counters, batch
samplers' RNG states and permutations, losses) goes through `save_trial_state` into a Tune checkpoint, and
`load_trial_state` gives it back exactly; nothing is unpickled on the way.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

STATE_TENSORS, STATE_JSON = "state.safetensors", "state.json"
STATE_FORMAT = 1


def save_trial_state(folder: str | os.PathLike, payload: dict) -> None:
    """Write an in-trial checkpoint without pickle: every tensor and numpy array of `payload` (weights, Adam
    moments, dead counters, batch permutations, losses) goes into state.safetensors; the rest (step, seeds,
    cell ids, RNG states as plain ints, Adam hyperparameters) into state.json, which names the tensors. Dict
    keys keep their type (Adam's state is keyed by int) and tuples stay tuples, so the load is exact."""
    import torch
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}

    def enc(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor | np.ndarray):
            key = f"t{len(tensors)}"
            is_np = isinstance(obj, np.ndarray)
            tensors[key] = torch.from_numpy(np.ascontiguousarray(obj)) if is_np else obj.detach().cpu().contiguous()
            return {"ndarray" if is_np else "tensor": key}
        if isinstance(obj, dict):
            if not all(isinstance(k, str | int) for k in obj):
                raise TypeError(f"trial state: dict keys must be str or int, got {list(obj)}")
            return {"dict": [[k, enc(v)] for k, v in obj.items()]}
        if isinstance(obj, tuple):
            return {"tuple": [enc(v) for v in obj]}
        if isinstance(obj, list):
            return [enc(v) for v in obj]
        if obj is None or isinstance(obj, bool | int | float | str):
            return obj
        raise TypeError(f"trial state: cannot store {type(obj).__name__} without pickle")

    meta = {"format": STATE_FORMAT, "state": enc(payload)}
    folder = Path(folder)
    save_file(tensors, str(folder / STATE_TENSORS))
    (folder / STATE_JSON).write_text(json.dumps(meta) + "\n")


def load_trial_state(folder: str | os.PathLike) -> dict | None:
    """Read what `save_trial_state` wrote (safetensors + JSON, nothing unpickled); None when the folder holds
    no such checkpoint (e.g. one from an older raybench: that stack then restarts from step 0)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / STATE_JSON).is_file() or not (folder / STATE_TENSORS).is_file():
        return None
    meta = json.loads((folder / STATE_JSON).read_text())
    if meta.get("format") != STATE_FORMAT:
        return None
    tensors = load_file(str(folder / STATE_TENSORS), device="cpu")

    def dec(obj: Any) -> Any:
        if isinstance(obj, list):
            return [dec(v) for v in obj]
        if isinstance(obj, dict):
            ((kind, val),) = obj.items()
            if kind == "tensor":
                return tensors[val]
            if kind == "ndarray":
                return tensors[val].numpy()
            if kind == "dict":
                return {k: dec(v) for k, v in val}
            if kind == "tuple":
                return tuple(dec(v) for v in val)
            raise ValueError(f"{folder / STATE_JSON}: unknown entry {kind!r}")
        return obj

    return dec(meta["state"])
