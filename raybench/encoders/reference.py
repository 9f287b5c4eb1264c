"""The single-process reference of an extraction: the same records (bad ones skipped), layers and order as the Ray
Data path of raybench.encoders.extract, in one loop without Ray; tests and bench/encode.py compare the two."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from raybench.cohorts.waveforms import RecordError
from raybench.encoders.actor import encode_states
from raybench.encoders.base import EncoderSpec, build_encoder
from raybench.encoders.extract import _probe_shape, _resolve_layers
from raybench.encoders.loading import Builder, native_input, read_manifest_records, split_sizes


def plain_loop_activations(manifest_path: str | os.PathLike, spec: EncoderSpec, layers: Sequence[int] | None = None,
                           batch_size: int = 32, builder: Builder | None = None
                           ) -> dict[int, dict[str, np.ndarray]]:
    """Single-process reference: the same records (bad ones skipped), layers and order, no Ray."""
    manifest = read_manifest_records(manifest_path)
    encoder = (builder or build_encoder)(spec)
    wanted = _resolve_layers(encoder.n_layers, layers, None, spec.name)
    parts: dict[str, list[np.ndarray]] = {s: [] for s in split_sizes(manifest.df)}
    xs: list[np.ndarray] = []
    splits: list[str] = []

    def flush() -> None:
        if xs:
            states = encode_states(encoder, np.stack(xs), wanted)
            for s in set(splits):
                parts[s].append(states[np.asarray(splits) == s])
            xs.clear()
            splits.clear()

    x_shape = _probe_shape(encoder, manifest.df) if len(manifest.df) else None
    for row in manifest.df.to_dict("records"):
        try:
            xs.append(native_input(manifest.root, row, encoder.preprocess, spec.name, x_shape=x_shape))
        except RecordError:
            continue
        splits.append(row["split"])
        if len(xs) == batch_size:
            flush()
    flush()
    out: dict[int, dict[str, np.ndarray]] = {}
    for j, layer in enumerate(wanted):
        out[layer] = {s: (np.concatenate([p[:, j] for p in ps]) if ps else np.zeros((0, encoder.d), np.float32))
                      for s, ps in parts.items()}
    return out
