"""The encoder side of extraction: the Ray Data actor that holds the frozen encoder, and `encode_states`, the
batch -> pooled layer states step it shares with the single-process reference."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from raybench.encoders.base import ECGEncoder, EncoderSpec, build_encoder
from raybench.encoders.loading import Builder, ExtractionError


class EncoderActor:
    """Ray Data actor UDF: builds the frozen encoder once, then maps native inputs to pooled layer states."""

    def __init__(self, spec: EncoderSpec, layers: Sequence[int], builder: Builder | None = None,
                 cpu_threads: int | None = None, shared: list | None = None):
        import ray

        # `shared` = [ObjectRef of the driver's built encoder]: fetching it is much cheaper than a second
        # build (random init or a checkpoint read of ~90M parameters); otherwise build here.
        self.encoder = ray.get(shared[0]) if shared else (builder or build_encoder)(spec)
        self.gpu_ids = [str(g) for g in ray.get_gpu_ids()]
        if self.gpu_ids and torch.cuda.is_available():
            self.device = torch.device("cuda", 0)  # Ray sets CUDA_VISIBLE_DEVICES to the assigned GPU(s)
        else:
            self.device = torch.device("cpu")
            if cpu_threads:
                torch.set_num_threads(cpu_threads)
        self.encoder.to(self.device)
        self.layers = list(layers)
        self.label = f"{self.device}" + (f" (gpu {','.join(self.gpu_ids)} assigned)" if self.gpu_ids else "")

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ok = batch["ok"]
        n = len(ok)
        states = np.zeros((n, len(self.layers), self.encoder.d), dtype=np.float32)
        if ok.any():
            states[ok] = encode_states(self.encoder, batch["x"][ok], self.layers, self.device)
        out = {k: batch[k] for k in ("ecg_id", "split", "path", "ok", "reason", "detail", "notes")}
        out["states"] = states
        out["device"] = np.full(n, self.label, dtype=object)
        return out


def encode_states(encoder: ECGEncoder, x: np.ndarray, layers: Sequence[int],
                  device: torch.device | str = "cpu") -> np.ndarray:
    """[B, ...] native inputs -> [B, len(layers), d] float32 pooled states (inference mode)."""
    with torch.inference_mode():
        out = encoder.layer_states(torch.from_numpy(np.ascontiguousarray(x)).to(device))
    expected = (encoder.n_layers, len(x), encoder.d)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ExtractionError(f"{encoder.name}.layer_states returned {got}, expected a tensor {expected} "
                              "(n_layers, batch, d)")
    return out[list(layers)].transpose(0, 1).float().cpu().numpy()


def actor_cpus(num_gpus: float, max_actors: int, cluster_cpus: float) -> float:
    """CPUs each encoder actor reserves. On CPU the loading step is fused into the actor (1 CPU each). With a
    GPU share, loading runs in separate 1-CPU tasks: the actors together leave at least one CPU of the cluster
    for them (fractional reservations), or the stream would wait forever for its first batch."""
    if num_gpus <= 0:
        return 1.0
    return max(0.0, min(1.0, (cluster_cpus - 1.0) / max_actors))
