"""The run config: the protocol (raybench.core.protocol) plus cohort, encoders and Ray resources; presets; YAML.

Presets (`RUN_PRESETS`): `paper` is the published ECG-InterpBench protocol as it was executed, with the
protocol code's own encoder preprocessing (`encoders.profile: published`): the preset that reproduces the
published tables. `paper-native` is the same protocol with each encoder's native (upstream)
preprocessing. `demo` keeps the same structure (450 primary cells + 90 sensitivity cells) but is small
enough for a 2-core laptop (and keeps the epoch sampler without clipping).
Configs load from / dump to YAML; unknown keys and bad values are errors that name the key.

The protocol's names (Protocol and its sections, ConfigError, MODELS, k_for, layer_for_depth,
audited_layers, ModelDims) are importable from here as well: this module is the config's one entry point.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from raybench.core.analysis_config import (
    DIAGNOSTIC_SUPERCLASSES,
    PANEL_VARIANTS,
    FeaturesConfig,
    MLflowConfig,
    ProvenanceConfig,
    ReliabilityConfig,
    SecondaryConfig,
    TrackingConfig,
)
from raybench.core.cohort_config import CohortConfig
from raybench.core.dataclass_io import from_dict, to_dict
from raybench.core.protocol import (
    MODELS,
    ConfigError,
    EvalProtocol,
    GridProtocol,
    InferenceProtocol,
    ModelDims,
    Protocol,
    SAEProtocol,
    audited_depths,
    audited_layers,
    check_choices,
    check_positive,
    k_for,
    layer_for_depth,
    validate_sections,
)

__all__ = [
    "DIAGNOSTIC_SUPERCLASSES", "PANEL_VARIANTS", "FeaturesConfig", "ProvenanceConfig", "ReliabilityConfig",
    "SecondaryConfig",
    "MODELS", "RUN_PRESETS", "CohortConfig", "ConfigError", "EncoderConfig", "EvalProtocol",
    "GridProtocol", "InferenceProtocol", "MLflowConfig", "ModelDims", "Protocol", "ResourceConfig", "RunConfig",
    "SAEProtocol", "TrackingConfig", "audited_depths",
    "audited_layers", "demo_protocol", "demo_run", "dump_run_config", "from_dict", "k_for", "layer_for_depth",
    "load_run_config", "paper_native_protocol", "paper_native_run", "paper_protocol", "paper_run", "to_dict",
]

EncoderSize = Literal["demo", "full"]
"""Encoder architecture: demo (small width, seeded init) or full (the published architecture)."""
Profile = Literal["native", "published"]
"""Encoder preprocessing profile (§5.5)."""
TrialUnit = Literal["stack", "layer", "model"]
"""What one Tune trial trains (ResourceConfig.trial_unit)."""
ReuseMode = Literal["auto", True, False]
"""Whether a finished trial's process runs the next trial (ResourceConfig.reuse_trial_processes); booleans, as YAML
reads on/off and true/false."""
GpuShare = float | Literal["auto"]
"""GPUs per encoder actor or SAE trial: a number (a fraction shares one GPU), or auto (raybench.infra.resources: a share
sized from the worker's memory need when the connected Ray cluster has GPUs, else 0)."""


@dataclass(frozen=True)
class EncoderConfig:
    """Which encoder weights, preprocessing profile and extraction resources (docs/protocol.md §5)."""

    size: EncoderSize = "full"
    """Encoder architecture. Published: full."""
    profile: Profile = "native"
    """Preprocessing profile: native (upstream) or published (what the protocol's code did). The paper preset
    uses published (§5.5)."""
    checkpoints: dict[str, str] = field(default_factory=dict)
    """Model name -> checkpoint path (full size); a model without one gets a seeded init."""
    init_seed: int = 0
    """Seed of the init of an encoder without a checkpoint."""
    batch_size: int = 32
    """Records per encoder forward pass (speed only)."""
    num_gpus: GpuShare = "auto"
    """GPUs per encoder actor; a fraction shares a GPU; auto: sized from the encoder's memory need when the
    cluster has GPUs, else 0 (raybench.infra.resources; speed only)."""
    min_actors: int = 1
    """Fewest encoder actors of the extraction pool (speed only)."""
    max_actors: int = 1
    """Most encoder actors of the extraction pool (speed only)."""
    stall_timeout_s: float = 900.0
    """Seconds an extraction may go without progress (no free CPU/GPU for its actors or loading tasks, e.g. a
    node that never comes) before it fails with a message saying so, instead of waiting forever."""

    def validate(self) -> None:
        check_choices(self, "encoders")
        _check_gpu_share(self.num_gpus, "encoders.num_gpus")
        check_positive(self, "encoders", "batch_size", "min_actors", "max_actors", "stall_timeout_s")
        if self.min_actors > self.max_actors:
            raise ConfigError("encoders.min_actors must be <= encoders.max_actors")


@dataclass(frozen=True)
class ResourceConfig:
    """Ray resources: where to run and how to pack trials (none of it changes results)."""

    address: str | None = None
    """Ray cluster address; None: RAY_ADDRESS if set, else a local instance."""
    num_cpus: int | None = None
    """CPUs of a local instance (None: all)."""
    num_gpus: int | None = None
    """GPUs of a local instance (None: all; logical GPUs are fine for scheduling tests)."""
    trial_cpus: float = 1.0
    """CPUs per SAE trial (also its torch thread count)."""
    trial_gpus: GpuShare = "auto"
    """GPU fraction per SAE trial, e.g. 0.25 packs four per GPU; auto: sized from the largest stack's memory need
    when the cluster has GPUs, else 0 (raybench.infra.resources)."""
    gpu_memory_gb: float | None = None
    """Memory of one GPU (GiB) that auto shares are sized against; None: from the cluster's accelerator type
    (Ray's accelerator_type resource) when raybench knows it, else 16."""
    max_per_gpu: int = 4
    """Most encoder actors or trials an auto share packs on one GPU."""
    max_concurrent_trials: int = 0
    """Cap on concurrent trials; 0: as many as resources allow."""
    max_failures: int = 2
    """Tune retries per trial."""
    trial_unit: TrialUnit = "stack"
    """What one Tune trial trains. stack: the seeds of one model x depth x E x arm (finest packing, for GPU
    clusters); layer: every E of one model x depth x arm; model: all cells of one model x arm. Coarser units
    amortize per-trial start-up on small CPU machines."""
    reuse_trial_processes: ReuseMode = "auto"
    """Let a finished trial's process run the next trial (Tune's reuse_actors), which skips a process start and
    the torch import (~3-4 CPU seconds a trial): true, false or auto. auto: on when raybench started the Ray
    instance itself (no node can join it), off when it connects to a cluster, where a reused process keeps its
    node and a node added mid-run would get fewer trials. Results are the same either way."""

    def validate(self) -> None:
        check_choices(self, "resources")
        check_positive(self, "resources", "trial_cpus")
        _check_gpu_share(self.trial_gpus, "resources.trial_gpus")
        check_positive(self, "resources", "max_per_gpu")
        if self.gpu_memory_gb is not None and not self.gpu_memory_gb > 0:
            raise ConfigError(f"resources.gpu_memory_gb must be > 0 or null, got {self.gpu_memory_gb}")
        if self.max_concurrent_trials < 0 or self.max_failures < 0:
            raise ConfigError("resources.max_concurrent_trials and resources.max_failures must be >= 0")


def _check_gpu_share(value: GpuShare, where: str) -> None:
    if value != "auto" and not (isinstance(value, int | float) and not isinstance(value, bool) and value >= 0.0):
        raise ConfigError(f"{where} must be a number >= 0 or 'auto', got {value!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything a `raybench grid` run needs."""

    run_dir: str = "runs/demo"
    """The run folder: a local folder or an s3:// prefix."""
    protocol: Protocol = field(default_factory=Protocol)
    """The protocol (raybench.core.protocol)."""
    cohort: CohortConfig = field(default_factory=CohortConfig)
    """Where records come from."""
    encoders: EncoderConfig = field(default_factory=EncoderConfig)
    """Encoder weights, preprocessing and extraction resources."""
    resources: ResourceConfig = field(default_factory=ResourceConfig)
    """Ray resources."""
    provenance: ProvenanceConfig = field(default_factory=ProvenanceConfig)
    """The provenance audit (outside config_hash)."""
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    """Experiment tracking: TensorBoard and/or MLflow (outside config_hash)."""
    features: FeaturesConfig = field(default_factory=FeaturesConfig)
    """Feature dashboards of the report (outside config_hash)."""
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    """The metric reliability audit (outside config_hash)."""
    secondary: SecondaryConfig | None = None
    """The secondary analyses (outside config_hash); None: SecondaryConfig.demo() for the demo protocol, else the
    published settings (the dataclass defaults)."""

    def secondary_settings(self) -> SecondaryConfig:
        """The secondary analyses' settings this run uses (the `secondary` section, else the protocol's default)."""
        if self.secondary is not None:
            return self.secondary
        return SecondaryConfig.demo() if self.protocol.name == "demo" else SecondaryConfig()

    def validate(self) -> RunConfig:
        validate_sections(self)
        _check_checkpoint_keys(self)
        return self

    def hashed_config(self) -> dict[str, Any]:
        """What determines results (protocol, cohort, encoders), not where or how fast: what config_hash hashes."""
        payload = {k: to_dict(getattr(self, k)) for k in ("protocol", "cohort", "encoders")}
        payload["encoders"] = {k: v for k, v in payload["encoders"].items()
                               if k not in ("batch_size", "num_gpus", "min_actors", "max_actors", "stall_timeout_s")}
        if payload["cohort"].get("kind") != "mimic":  # hashed for mimic only (CHANGELOG.md, issue 30)
            payload["cohort"].pop("rate_concept", None)
        payload["cohort"].pop("credentialed", None)  # who may see the results, not what they are
        if payload["cohort"].get("kind") != "wfdb":  # wfdb only, added later: other runs keep their hash
            for key in ("patients_csv", "patient_key"):
                payload["cohort"].pop(key, None)
        return payload

    def config_hash(self) -> str:
        """Hash of what determines results (hashed_config), not of where or how fast."""
        return hashlib.sha256(json.dumps(self.hashed_config(), sort_keys=True).encode()).hexdigest()[:16]


def _check_checkpoint_keys(cfg: RunConfig) -> None:
    """A checkpoint under a key that is no model (`ECG_FM` for `ecg_fm`) would leave that model on random weights
    without a word: refused, naming the key and the choices."""
    models = [*cfg.protocol.grid.models, *(m for m in MODELS if m not in cfg.protocol.grid.models)]
    for key in cfg.encoders.checkpoints:
        if key not in models:
            raise ConfigError(f"encoders.checkpoints: {key!r} is not a model: use one of {', '.join(models)}")


# ---------------------------------------------------------------- presets

def paper_protocol() -> Protocol:
    """The published protocol: the dataclass defaults (per-step sampler, clip 1e5, selection seed 20260714)."""
    return Protocol(name="paper")


def paper_native_protocol() -> Protocol:
    """The published protocol under another name: the encoders' preprocessing is what differs (see paper_native_run)."""
    return Protocol(name="paper-native")


def demo_protocol() -> Protocol:
    """Same structure as the paper (6 x 5 x 5 x 3 + sensitivity arm), laptop-sized training."""
    return Protocol(
        name="demo",
        # A demo stack trains in about a second: its finished cells are its checkpoints.
        # Epoch sampler and no clipping (raybench's choice: every record once per epoch; clipping at 1e5 never
        # fires on z-scored inputs), so demo numbers do not move with the paper preset.
        sae=SAEProtocol(steps=200, batch_size=128, k_divisor=8, aux_k=64, checkpoint_every=0, sampler="epoch",
                        grad_clip=None),
        eval=EvalProtocol(selection_records=4096, repro_top=32, repro_permutations=100),
        # raybench's chunked streams and seed, so demo numbers do not move with the paper preset
        inference=InferenceProtocol(patient_draws=2000, crossed_draws=10000, chunk_draws=500, seed=20240614,
                                    stream="chunked"),
    )


def demo_run(run_dir: str = "runs/demo") -> RunConfig:
    """The embedded default: synthetic cohort, demo encoders, demo protocol, local Ray."""
    return RunConfig(
        run_dir=run_dir,
        protocol=demo_protocol(),
        cohort=CohortConfig(kind="synth", records=1500, patients=500, seed=7),
        # CPU even where the cluster has GPUs (num_gpus/trial_gpus 0, not auto): the demo's tables are then the
        # same on every machine
        encoders=EncoderConfig(size="demo", batch_size=64, num_gpus=0.0, min_actors=2, max_actors=2),  # both cores
        resources=ResourceConfig(trial_unit="model", trial_gpus=0.0),  # 12 trials: start-up dominates tiny SAEs
        secondary=SecondaryConfig.demo(),  # the preset's section in full, so a YAML that sets one key keeps the rest
    ).validate()


def paper_run(run_dir: str = "runs/paper") -> RunConfig:
    """The published protocol as executed, with the protocol code's preprocessing: reproduces the published tables."""
    return RunConfig(run_dir=run_dir, protocol=paper_protocol(), encoders=EncoderConfig(profile="published"),
                     secondary=SecondaryConfig()).validate()


def paper_native_run(run_dir: str = "runs/paper-native") -> RunConfig:
    """The published protocol with each encoder's native (upstream) preprocessing: not the published tables."""
    return RunConfig(run_dir=run_dir, protocol=paper_native_protocol(), encoders=EncoderConfig(profile="native"),
                     secondary=SecondaryConfig()).validate()


RUN_PRESETS = {"paper": paper_run, "paper-native": paper_native_run, "demo": demo_run}


# ---------------------------------------------------------------- YAML

def load_run_config(path: str | Path | None = None, **overrides: Any) -> RunConfig:
    """Load a YAML run config: the preset it names (`preset: demo|paper|paper-native`, RUN_PRESETS) with the
    file's keys on top. A file without `preset:` edits the preset its `protocol.name` names (a full config, as
    `raybench config` prints), else the demo - the embedded default, as with no file at all - so no file becomes
    a mix of presets under a preset's name. No path: the embedded demo."""
    if path is None:
        cfg = demo_run()
    else:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        base = RUN_PRESETS[_preset_of(raw, path)]()
        merged = _deep_merge(to_dict(base), raw)
        try:
            cfg = from_dict(RunConfig, merged)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    return cfg.validate()


def _preset_of(raw: dict[str, Any], path: str | Path) -> str:
    """The preset a config file starts from (removes its `preset` key); ConfigError when it names two."""
    choices = " | ".join(RUN_PRESETS)
    preset = raw.pop("preset", None)
    if preset is not None and preset not in RUN_PRESETS:
        raise ConfigError(f"{path}: preset must be one of {choices}, got {preset!r}")
    protocol = raw.get("protocol")
    named = protocol.get("name") if isinstance(protocol, dict) else None
    if preset is None:
        return named if named in RUN_PRESETS else "demo"
    if named in RUN_PRESETS and named != preset:
        raise ConfigError(f"{path}: `preset: {preset}` but protocol.name is {named!r}: a file edits one preset; "
                          "drop one of the two, or give protocol.name a name of your own")
    return preset


def dump_run_config(cfg: RunConfig) -> str:
    """The config as YAML, led by `preset:` when the protocol carries a preset's name (so the file says what it
    edits and loads back to the same config)."""
    payload = to_dict(cfg)
    if cfg.protocol.name in RUN_PRESETS:
        payload = {"preset": cfg.protocol.name, **payload}
    return yaml.safe_dump(payload, sort_keys=False)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
