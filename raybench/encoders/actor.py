"""The encoder side of extraction: the Ray Data actor that holds the frozen encoder, and `encode_states`, the
batch -> pooled layer states step it shares with the single-process reference."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

import numpy as np
import torch

from raybench.cohorts.waveforms import RecordError, Waveform
from raybench.encoders.base import ECGEncoder, EncoderSpec, build_encoder
from raybench.encoders.loading import Builder, ExtractionError, _preprocessor, apply_preprocess, load_batch, read_input
from raybench.encoders.roster import sign_or_exit


class EncoderActor:
    """Ray Data actor UDF: builds the frozen encoder once, then maps native inputs to pooled layer states."""

    def __init__(self, spec: EncoderSpec, layers: Sequence[int], builder: Builder | None = None,
                 cpu_threads: int | None = None, shared: list | None = None, load: dict | None = None,
                 roster=None):
        import ray

        sign_or_exit(roster)  # the driver ends this actor with its pipeline (raybench.encoders.roster)
        # `load`: load_batch's keyword arguments when this actor also loads its records (the CPU path: one
        # actor per core loads and encodes, instead of Ray Data fusing a separate loading step into it)
        self.load = load
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
        if self.load is not None:  # CPU path: this actor's own encoder preprocesses (no second, meta build)
            batch = load_batch(batch, **self.load, preprocessor=self.encoder)
        ok = batch["ok"]
        n = len(ok)
        states = np.zeros((n, len(self.layers), self.encoder.d), dtype=np.float32)
        if ok.any():
            states[ok] = encode_states(self.encoder, batch["x"][ok], self.layers, self.device)
        out = {k: batch[k] for k in ("ecg_id", "split", "path", "ok", "reason", "detail", "notes")}
        out["states"] = states
        out["device"] = np.full(n, self.label, dtype=object)
        return out


class MultiEncoderActor:
    """Ray Data actor UDF for several small encoders in one pass (CPU only): each record is read once, then
    every model's native preprocessing and encoder run on it. One pipeline and one actor start for the whole
    grid instead of one per model, which dominates the encode time of small encoders. Output columns are the
    per-model columns of `EncoderActor` prefixed "<i>:" (i: the model's position in `specs`)."""

    def __init__(self, specs: Sequence[EncoderSpec], layers: Sequence[Sequence[int]],
                 builders: Sequence[Builder | None], x_shapes: Sequence[tuple[int, ...]], root: str,
                 cpu_threads: int | None = None, shared: list | None = None, roster=None):
        import ray

        sign_or_exit(roster)  # see EncoderActor
        if cpu_threads:
            torch.set_num_threads(cpu_threads)
        self.specs, self.builders, self.x_shapes, self.root = list(specs), list(builders), list(x_shapes), root
        self.layers = [list(la) for la in layers]
        # `shared`: per spec, the ObjectRef of the driver's built encoder, or None where it could not be pickled
        # (built here instead; see EncoderActor)
        shared = shared or [None] * len(self.specs)
        self.encoders = [(ray.get(ref) if ref is not None else (b or build_encoder)(s)).to("cpu")
                         for s, b, ref in zip(self.specs, self.builders, shared, strict=True)]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(batch["ecg_id"])
        waves: list[Waveform | RecordError] = []
        for i in range(n):
            try:
                waves.append(read_input(self.root, {k: batch[k][i] for k in ("path", "fs", "n_samples")}))
            except RecordError as err:
                waves.append(err)
        out = {"ecg_id": batch["ecg_id"].astype(np.int64), "split": batch["split"].astype(object),
               "path": batch["path"].astype(object)}  # as load_batch has them
        for m, (spec, builder, x_shape, encoder) in enumerate(zip(self.specs, self.builders, self.x_shapes,
                                                                   self.encoders, strict=True)):
            x = np.zeros((n, *x_shape), dtype=np.float32)
            ok = np.ones(n, dtype=bool)
            reason, detail = np.full(n, "", dtype=object), np.full(n, "", dtype=object)
            notes = np.full(n, "[]", dtype=object)
            for i, wave in enumerate(waves):
                try:
                    if isinstance(wave, RecordError):
                        raise wave
                    x[i], got = _native(wave, spec, builder, x_shape, encoder)
                except RecordError as err:
                    ok[i], reason[i], detail[i] = False, err.reason, err.detail
                    continue
                notes[i] = json.dumps(got)
            states = np.zeros((n, len(self.layers[m]), encoder.d), dtype=np.float32)
            if ok.any():
                states[ok] = encode_states(encoder, x[ok], self.layers[m])
            out.update({f"{m}:ok": ok, f"{m}:reason": reason, f"{m}:detail": detail, f"{m}:notes": notes,
                        f"{m}:states": states, f"{m}:device": np.full(n, "cpu", dtype=object)})
        return out


def _native(wave: Waveform, spec: EncoderSpec, builder: Builder | None, x_shape: tuple[int, ...],
            encoder: ECGEncoder | None = None) -> tuple[np.ndarray, list[str]]:
    """One record -> one model's native input, as a loading worker makes it (meta-device preprocessor, rebuilt
    for real when its preprocess needs tensors), or with `encoder`'s preprocess where the caller holds the built
    encoder already (an actor: the same input, without a second build); each model gets its own copy of the
    signal."""
    if encoder is not None:
        return apply_preprocess(dataclasses.replace(wave, signal=wave.signal.copy()), encoder.preprocess,
                                spec.name, x_shape)
    try:
        return apply_preprocess(dataclasses.replace(wave, signal=wave.signal.copy()),
                                _preprocessor(spec, builder).preprocess, spec.name, x_shape, wrap_errors=False)
    except RecordError:
        raise
    except Exception:
        return apply_preprocess(dataclasses.replace(wave, signal=wave.signal.copy()),
                                _preprocessor(spec, builder, real=True).preprocess, spec.name, x_shape)


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
