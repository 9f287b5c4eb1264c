"""The encode stage of `raybench grid` (see raybench.stage): every audited layer of every model in the grid,
extracted over the manifest with Ray Data into the run's activation store."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from raybench.config import RunConfig
from raybench.errors import RaybenchError
from raybench.paths import RunLayout
from raybench.stage import Resources, Stage

if TYPE_CHECKING:
    from raybench.encoders.base import EncoderSpec


class EncodeError(RaybenchError, ValueError):
    """The run folder cannot be encoded (remote folder, no manifest) or a model failed on it."""


def encoder_spec(cfg: RunConfig, model: str) -> EncoderSpec:
    """The EncoderSpec of `model` under the run's encoder config (what `encode` extracts with)."""
    from raybench.encoders.base import EncoderSpec

    enc = cfg.encoders
    return EncoderSpec(name=model, size=enc.size, checkpoint=enc.checkpoints.get(model), profile=enc.profile,
                       init_seed=enc.init_seed)


def encode_complete(cfg: RunConfig) -> bool:
    """Every audited store matches the *current* manifest hash and encoder fingerprint (not its own index)."""
    from raybench.cohorts.manifest import ManifestError, load_manifest
    from raybench.config import audited_layers
    from raybench.encoders.base import build_encoder
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(cfg.run_dir)
    if not layout.manifest.exists():
        return False
    try:
        manifest_hash = load_manifest(layout.manifest)[1].manifest_hash
    except ManifestError:
        return False  # the encode stage reports what is wrong with it
    store = ActivationStore(layout.activations_dir)
    for model in cfg.protocol.grid.models:
        encoder = build_encoder(encoder_spec(cfg, model))
        fingerprint, n_layers = encoder.fingerprint(), int(encoder.n_layers)
        del encoder
        for layer in audited_layers(cfg.protocol, n_layers):
            if not store.is_complete(model, layer, manifest_hash, fingerprint):
                return False
    return True


def encode_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.config import audited_layers
    from raybench.encoders.base import build_encoder
    from raybench.encoders.extract import extract_activations

    layout = RunLayout.at(cfg.run_dir)
    enc = cfg.encoders
    for model in cfg.protocol.grid.models:
        spec = encoder_spec(cfg, model)
        n_layers = build_encoder(spec).n_layers
        extract_activations(layout.manifest, layout.root, spec, enc, layers=audited_layers(cfg.protocol, n_layers),
                            progress=False)
    return f"{len(cfg.protocol.grid.models)} encoders"


def encode_resources(cfg: RunConfig) -> Resources:
    """One encoder actor: a CPU and the configured GPU share (encoders.num_gpus)."""
    return Resources(cpus=1.0, gpus=float(cfg.encoders.num_gpus))


def with_encoder_overrides(cfg: RunConfig, **overrides) -> RunConfig:
    """cfg with encoders.<key> replaced for every override that is not None (validated: a ConfigError)."""
    enc = dataclasses.replace(cfg.encoders, **{k: v for k, v in overrides.items() if v is not None})
    enc.validate()
    return dataclasses.replace(cfg, encoders=enc)


def encode_models(cfg: RunConfig, models: list[str], all_layers: bool = False,
                  progress: bool = True) -> Iterator[str]:
    """`raybench encode`: extract `models` (every layer with all_layers, else the grid's depths) into the run's
    activation store, skipping complete stores; yields one summary line per model."""
    from raybench.encoders.extract import extract_activations
    from raybench.ray_session import init_ray

    manifest = check_encodable(cfg)
    init_ray(cfg.resources)
    for name in models:
        spec = encoder_spec(cfg, name)
        try:
            summary = extract_activations(manifest, cfg.run_dir, spec, cfg.encoders, progress=progress,
                                          depths=None if all_layers else cfg.protocol.grid.depths)
        except (RaybenchError, KeyError, ValueError) as err:
            raise EncodeError(f"{name}: {err}") from err
        yield (f"{name}: layers written {summary['layers']}, already complete {summary['skipped_layers']}, "
               f"{summary['records']} records, {summary['quarantined']} quarantined")


def check_encodable(cfg: RunConfig) -> Path:
    """The run folder is local and holds a manifest; returns the manifest's path."""
    run_dir = cfg.run_dir
    if "://" in run_dir:
        raise EncodeError(f"--run-dir {run_dir}: activation stores are memory-mapped files and need a local (or "
                          "mounted) folder")
    manifest = RunLayout.at(run_dir).manifest
    if not manifest.exists():
        raise EncodeError(f"no manifest at {manifest}; build it first with `raybench manifest`")
    return manifest


ENCODE_STAGE = Stage("encode", inputs=("manifest",), is_complete=encode_complete, run=encode_run,
                     resources=encode_resources)
