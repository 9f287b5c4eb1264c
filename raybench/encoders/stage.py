"""The encode stage of `raybench grid` (see raybench.infra.stage): every audited layer of every model in the grid,
extracted over the manifest with Ray Data into the run's activation store."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from raybench.core.config import RunConfig
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout
from raybench.core.privacy import is_credentialed
from raybench.infra.stage import Stage

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


def _recorded_fingerprint(store, model: str, key: str | None) -> tuple[str, int] | None:
    """(fingerprint, n_layers) from any of `model`'s stores written under fingerprint key `key`."""
    if key is None:
        return None
    for layer in store.layers(model):
        try:
            idx = store.index(model, layer)
        except (OSError, ValueError):
            continue
        if idx.get("fingerprint_key") == key:
            return str(idx["fingerprint"]), int(idx["n_layers"])
    return None


def encode_complete(cfg: RunConfig) -> bool:
    """Every audited store matches the *current* manifest hash and encoder fingerprint (not its own index).
    The fingerprint comes from a store recording the same `fingerprint_key`, else from building the encoder."""
    from raybench.cohorts.manifest import ManifestError, load_manifest
    from raybench.core.config import audited_layers
    from raybench.encoders.fingerprint_key import fingerprint_key  # torch-free: a rerun with nothing to do
    from raybench.encoders.store import ActivationStore

    layout = RunLayout.at(cfg.run_dir)
    if not layout.manifest.exists():
        return False
    try:
        manifest_hash = load_manifest(layout.manifest)[1].manifest_hash
    except ManifestError:
        return False  # the encode stage reports what is wrong with it
    store = ActivationStore(layout.activations_dir)
    enc = cfg.encoders
    models = cfg.protocol.grid.models
    if not all(store.layers(model) for model in models):
        return False  # a model without any store: no encoder build needed to know
    for model in models:
        # EncoderSpec's fields without importing torch (EncoderSpec lives beside the torch encoders)
        fields = SimpleNamespace(name=model, size=enc.size, checkpoint=enc.checkpoints.get(model),
                                 profile=enc.profile, init_seed=enc.init_seed)
        known = _recorded_fingerprint(store, model, fingerprint_key(fields))
        if known is None:
            from raybench.encoders.base import build_encoder

            encoder = build_encoder(encoder_spec(cfg, model))
            known = encoder.fingerprint(), int(encoder.n_layers)
            del encoder
        fingerprint, n_layers = known
        for layer in audited_layers(cfg.protocol, n_layers):
            if not store.is_complete(model, layer, manifest_hash, fingerprint):
                return False
    return True


def encode_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.core.config import audited_depths
    from raybench.encoders.extract import extract_activations

    layout = RunLayout.at(cfg.run_dir)
    enc = cfg.encoders
    grid = cfg.protocol.grid
    # extraction maps the audited depths to layers with the encoder it builds anyway, instead of a second build
    # here just to learn n_layers
    depths = audited_depths(cfg.protocol)
    if one_pipeline(cfg, grid.models):
        from raybench.encoders.extract import extract_models

        extract_models(layout.manifest, layout.root, [encoder_spec(cfg, m) for m in grid.models], enc,
                       depths=depths, progress=False, resources=cfg.resources, credentialed=is_credentialed(cfg))
        return f"{len(grid.models)} encoders"
    for model in grid.models:
        extract_activations(layout.manifest, layout.root, encoder_spec(cfg, model), enc, depths=depths,
                            progress=False, resources=cfg.resources, credentialed=is_credentialed(cfg))
    return f"{len(cfg.protocol.grid.models)} encoders"


def one_pipeline(cfg: RunConfig, models: list[str]) -> bool:
    """Whether `models` share one Ray Data pipeline (extract_models): several demo-size encoders on CPU, where
    starting a pipeline and an actor per model would cost more than encoding. Full-size encoders and GPU
    shares keep one pipeline per model (each actor holds one large encoder)."""
    from raybench.infra.resources import declared_gpus

    return len(models) > 1 and cfg.encoders.size == "demo" and declared_gpus(cfg.encoders.num_gpus,
                                                                             cfg.resources) == 0


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
    from raybench.infra.ray_session import init_ray

    check_encoders(cfg)
    manifest = check_encodable(cfg)
    init_ray(cfg.resources)
    if one_pipeline(cfg, models):
        from raybench.encoders.extract import extract_models

        try:
            summaries = extract_models(manifest, cfg.run_dir, [encoder_spec(cfg, m) for m in models], cfg.encoders,
                                       progress=progress, depths=None if all_layers else cfg.protocol.grid.depths,
                                       resources=cfg.resources, credentialed=is_credentialed(cfg))
        except (RaybenchError, KeyError, ValueError) as err:
            raise EncodeError(str(err)) from err
        yield from (_summary_line(s['model'], s) for s in summaries)
        return
    for name in models:
        spec = encoder_spec(cfg, name)
        try:
            summary = extract_activations(manifest, cfg.run_dir, spec, cfg.encoders, progress=progress,
                                          depths=None if all_layers else cfg.protocol.grid.depths,
                                          resources=cfg.resources, credentialed=is_credentialed(cfg))
        except (RaybenchError, KeyError, ValueError) as err:
            raise EncodeError(f"{name}: {err}") from err
        yield _summary_line(name, summary)


def _summary_line(name: str, summary: dict) -> str:
    return (f"{name}: layers written {summary['layers']}, already complete {summary['skipped_layers']}, "
            f"{summary['records']} records, {summary['quarantined']} quarantined")


def check_encoders(cfg: RunConfig) -> None:
    """Every model of the grid has an encoder and every checkpoint file named exists: checked when `raybench grid`
    or `raybench encode` starts, so a typo fails in a second instead of after the cohort and manifest stages."""
    from raybench.core.models import BUILTIN

    models = cfg.protocol.grid.models
    if any(m not in BUILTIN for m in models):
        from raybench.encoders.base import available_encoders  # plugins and run-time registrations too

        known = available_encoders()
        bad = [m for m in models if m not in known]
        if bad:
            raise EncodeError(f"protocol.grid.models: unknown model {bad[0]!r}: choose from {', '.join(known)} "
                              "(a new encoder registers itself: docs/architecture.md)")
    for model in models:
        path = cfg.encoders.checkpoints.get(model)
        if path and "://" not in path and not Path(path).expanduser().exists():
            raise EncodeError(f"encoders.checkpoints.{model}: {path} not found: give the path of {model}'s "
                              "checkpoint file, or remove the entry to run it with random weights")


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
                     check=check_encoders)
