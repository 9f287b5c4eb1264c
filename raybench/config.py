"""The run config: the protocol (raybench.protocol) plus cohort, encoders and Ray resources; presets; YAML.

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
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from raybench.protocol import (
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
    not_a_choice,
    validate_sections,
)

__all__ = [
    "MODELS", "RUN_PRESETS", "CohortConfig", "ConfigError", "EncoderConfig", "EvalProtocol",
    "GridProtocol", "InferenceProtocol", "MLflowConfig", "ModelDims", "Protocol", "ResourceConfig", "RunConfig",
    "SAEProtocol", "TrackingConfig", "audited_depths",
    "audited_layers", "demo_protocol", "demo_run", "dump_run_config", "from_dict", "k_for", "layer_for_depth",
    "load_run_config", "paper_native_protocol", "paper_native_run", "paper_protocol", "paper_run", "to_dict",
]

CohortKind = Literal["synth", "ptbxl", "mimic"]
"""Where records come from: synth (generated), ptbxl (PTB-XL, §2.1), mimic (MIMIC-IV-ECG, §2.3)."""
ConceptSource = Literal["auto", "tables", "waveform", "none"]
"""Which concepts a cohort carries: auto (feature tables if present, else waveform-derived), tables, waveform,
none."""
ConceptExtractor = Literal["published", "refined"]
"""MIMIC waveform concept extractor: published (the protocol's code) or refined (raybench's) (§4.3)."""
RecordPool = Literal["published", "all"]
"""MIMIC record pool: published (ICD-linked, extraction ok, then ranked) or all (ranked) (§2.3)."""
RateConcept = Literal["heart_rate_bpm", "rr_mean_ms"]
"""MIMIC rate concept: heart_rate_bpm (60000 / RR, the published run's) or rr_mean_ms (raybench's) (§4.2)."""
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
"""GPUs per encoder actor or SAE trial: a number (a fraction shares one GPU), or auto (raybench.resources: a share
sized from the worker's memory need when the connected Ray cluster has GPUs, else 0)."""


@dataclass(frozen=True)
class CohortConfig:
    """Where records come from (docs/protocol.md §2)."""

    kind: CohortKind = "synth"
    """Cohort kind. Published: ptbxl (primary), mimic (external replication)."""
    root: str | None = None
    """Dataset folder (ptbxl, mimic); synth: generated under <run>/cohort."""
    records: int = 1500
    """synth only: number of records."""
    patients: int = 500
    """synth only: number of patients."""
    seed: int = 7
    """synth only: generator seed."""
    bad_fraction: float = 0.0
    """synth only: fraction of deliberately bad records, in [0, 0.5)."""
    sampling_rate: Literal[100, 500] = 500
    """ptbxl only: which waveform folder is read, in Hz (records500 or records100). Published: 500."""
    concepts: ConceptSource = "auto"
    """Concept source. Published: tables for PTB-XL (PTB-XL+ features), waveform for MIMIC-IV-ECG (§3, §4)."""
    max_records: int | None = 100_000
    """mimic only: record pool size; None: every eligible study. Published: 100,000 (§2.3)."""
    concept_extractor: ConceptExtractor = "published"
    """mimic only: waveform concept extractor (raybench.cohorts.mimic). Published: published (§4.3)."""
    record_pool: RecordPool = "published"
    """mimic only: which studies enter the pool. Published: published (§2.3)."""
    rate_concept: RateConcept = "heart_rate_bpm"
    """mimic only: the rate concept (raybench.cohorts.panel). Published: heart_rate_bpm (§4.2)."""
    admissions: str | None = None
    """mimic only: path of MIMIC-IV hosp/admissions.csv.gz, which the ICD link needs; None: the link is not
    applied (the summary says so)."""

    def validate(self) -> None:
        check_choices(self, "cohort")
        if self.max_records is not None and self.max_records < 1:
            raise ConfigError(f"cohort.max_records must be >= 1 or null, got {self.max_records}")
        if self.kind != "synth" and not self.root:
            raise ConfigError(f"cohort.root is required for cohort.kind={self.kind!r}: the dataset folder")
        if not 0.0 <= self.bad_fraction < 0.5:
            raise ConfigError(f"cohort.bad_fraction must be in [0, 0.5), got {self.bad_fraction}")


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
    cluster has GPUs, else 0 (raybench.resources; speed only)."""
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
    when the cluster has GPUs, else 0 (raybench.resources)."""
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


DIAGNOSTIC_SUPERCLASSES = ("NORM", "MI", "STTC", "CD", "HYP")
"""PTB-XL's diagnostic superclasses (scp_statements.csv diagnostic_class): the provenance audit's targets."""


@dataclass(frozen=True)
class ReliabilityConfig:
    """The metric reliability audit (docs/protocol.md §11; raybench.analysis.reliability). Not part of config_hash:
    it reads a finished run and changes none of its results."""

    enabled: bool = False
    """Run the heavy parts (evaluation reseeds, ground-truth panel, snapshots through training, bias-corrected
    intervals) as a step of `raybench analyze` / `grid`; `raybench reliability` runs them either way."""
    cheap: bool = True
    """Run the cheap parts (training-seed variance decomposition, interval-bias detection, |D|*_3 and the contrast
    flags) in every analyze (about a second at demo scale)."""
    reseeds: int = 5
    """R: evaluation reseeds per sampled cell (selection subset, permutation floor)."""
    sample_points: int = 2
    """(depth, E) points sampled for the reseeds and the training curves; every model and seed at each."""
    fractions: tuple[float, ...] = (0.0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0)
    """Fractions of training at which snapshots are evaluated (all of them: the trend; post-warmup ones: the
    variance shares and SNR, which need >= 6)."""
    warmup_fraction: float = 0.25
    """Snapshots at fractions >= this are post-warmup (docs/protocol.md §11.3)."""
    panel_steps: tuple[int, ...] = (15, 40, 100, 250)
    """Training steps of the ground-truth panel's SAEs (each combined with every panel E and k): 4 x 5 = 20
    trained members at one width, the fewest over which a Spearman rho has power (docs/protocol.md §11.4)."""
    panel_variants: tuple[str, ...] = ("base", "steep_zipf", "correlated")
    """Synthetic models the panel is trained on (ground_truth.VARIANTS); the first decides, the others test
    robustness."""
    panel_expansions: tuple[int, ...] = (2,)
    """Expansions E of the panel's SAEs (synthetic d = 128, 192 true features); one width, as the paper's panel."""
    panel_ks: tuple[int, ...] = (4, 8, 12, 16, 24)
    """k of the panel's SAEs (the synthetic records have about 12 active features)."""
    panel_seed: int = 0
    """Seed of the synthetic activation model."""

    def validate(self) -> None:
        if self.reseeds < 2:
            raise ConfigError(f"reliability.reseeds must be >= 2 (a standard deviation), got {self.reseeds}")
        check_positive(self, "reliability", "sample_points")
        if not self.fractions or any(not 0.0 <= f <= 1.0 for f in self.fractions) or 1.0 not in self.fractions:
            raise ConfigError(f"reliability.fractions must lie in [0, 1] and include 1, got {list(self.fractions)}")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ConfigError(f"reliability.warmup_fraction must lie in [0, 1), got {self.warmup_fraction}")
        from raybench.analysis.reliability.ground_truth import VARIANTS

        if not self.panel_variants or any(v not in VARIANTS for v in self.panel_variants):
            raise ConfigError(f"reliability.panel_variants must be names among {sorted(VARIANTS)}, got "
                              f"{list(self.panel_variants)}")
        for name in ("panel_steps", "panel_expansions", "panel_ks"):
            if not getattr(self, name) or any(v < 1 for v in getattr(self, name)):
                raise ConfigError(f"reliability.{name} must be a non-empty list of integers >= 1")


@dataclass(frozen=True)
class ProvenanceConfig:
    """The provenance audit: Recover / Stress / Intervene / Verify per model x depth (docs/protocol.md §12).
    Not part of config_hash: it reads the finished grid and changes none of its results."""

    enabled: bool = False
    """Run the audit as a step of `raybench analyze` / `grid` (`raybench provenance` runs it either way)."""
    variables: tuple[str, ...] = ("device", "site")
    """Provenance variables u audited, manifest columns (§12.1)."""
    target: str = "NORM"
    """Diagnostic superclass of the target y: y = 1 when a record carries it, else 0 (§12.1)."""
    association_levels: tuple[float, ...] = (1.0, 0.5, 0.0, -0.5, -1.0)
    """Stress regimes as exponents e of the natural odds ratio kappa (odds ratio kappa^e, both marginals fixed): 1
    aligned, 0 independent, -1 reversed (§12.3)."""
    ranks: tuple[int, ...] = (1, 2)
    """Ranks p of the removed provenance component, all reported as a sweep (§12.4)."""
    verdict_rank: int = 1
    """The rank the verdict uses, fixed per modality (ECG: 1; §12.5); must be among `ranks`."""
    folds: int = 5
    """Patient-disjoint outer folds the estimates are averaged over (1: the run's own train / val / test split;
    §12.1)."""
    min_cell_records: int = 75
    """Held-out records every (y, u) cell needs for the row to be audited (§12.1)."""
    cell_support_sensitivity: bool = False
    """Audit rows below `min_cell_records` anyway, labelled as a sensitivity analysis (§12.1)."""
    device_grouping: Literal["raw", "family"] = "raw"
    """`raw`: device strings as recorded; `family`: firmware variants grouped into device families (§12.1)."""
    random_controls: int = 100
    """Random projections matched in rank and removed energy that a removal must beat (§12.5)."""
    epsilon: float = 0.01
    """No reliance: the G interval lies within +-epsilon (§12.5)."""
    delta: float = 0.01
    """Largest utility loss a certified removal may cost: 95% lower bound of the AUROC change above -delta."""
    draws: int = 200
    """Patient-bootstrap draws of every interval."""
    min_group_records: int = 20
    """A provenance group needs this many records in train and in test (and every target class in each) to
    be audited; smaller groups are left out and named (§12.1)."""
    c_grid: tuple[float, ...] = (0.01, 0.1, 1.0, 10.0)
    """Inverse L2 strengths tried for every probe and head, chosen on the validation split."""
    top_latents: int = 10
    """SAE latents listed per model x depth x variable by univariate provenance LPI (§12.6)."""
    flag_bits: float = 0.05
    """A concept-selected latent is flagged only when its provenance LPI also reaches this many bits (§12.6)."""
    seed: int = 20261201
    """Seed of the bootstrap draws and the random controls."""

    def validate(self) -> None:
        if not self.variables or len(set(self.variables)) != len(self.variables):
            raise ConfigError(f"provenance.variables must name distinct manifest columns, got {self.variables}")
        if self.target not in DIAGNOSTIC_SUPERCLASSES:
            raise not_a_choice("provenance.target", DIAGNOSTIC_SUPERCLASSES, self.target)
        levels = self.association_levels
        if 1.0 not in levels or -1.0 not in levels or any(not -1.0 <= a <= 1.0 for a in levels):
            raise ConfigError(f"provenance.association_levels must lie in [-1, 1] and hold 1 (observed) and -1 "
                              f"(reversed), got {levels}")
        if not self.ranks or any(p < 1 for p in self.ranks):
            raise ConfigError(f"provenance.ranks must be integers >= 1, got {self.ranks}")
        if self.verdict_rank not in self.ranks:
            raise ConfigError(f"provenance.verdict_rank ({self.verdict_rank}) must be one of provenance.ranks "
                              f"{self.ranks}")
        if self.device_grouping not in ("raw", "family"):
            raise not_a_choice("provenance.device_grouping", ("raw", "family"), self.device_grouping)
        if not self.c_grid or any(c <= 0 for c in self.c_grid):
            raise ConfigError(f"provenance.c_grid must be positive numbers, got {self.c_grid}")
        if self.epsilon < 0 or self.delta < 0 or self.flag_bits < 0:
            raise ConfigError("provenance.epsilon, provenance.delta and provenance.flag_bits must be >= 0")
        check_positive(self, "provenance", "random_controls", "draws", "min_group_records", "min_cell_records",
                       "folds", "top_latents")


@dataclass(frozen=True)
class MLflowConfig:
    """Where Tune's MLflow logger callback writes (raybench.tracking)."""

    uri: str | None = None
    """MLflow tracking URI; None: a local file store in <run>/mlruns."""
    experiment: str | None = None
    """MLflow experiment name; None: raybench-<config hash>."""


@dataclass(frozen=True)
class TrackingConfig:
    """Experiment tracking of the SAE grid through Ray Tune's logger callbacks (raybench.tracking). Not part of
    config_hash: it records training, it changes none of its results."""

    tensorboard: bool = False
    """TensorBoard event files in each Tune trial folder under <run>/tune/."""
    mlflow: MLflowConfig | None = None
    """MLflow runs (one per Tune trial); None: off. `mlflow: {}` logs to the run's local file store."""
    log_every: int = 10
    """SAE steps between two logged points of a cell's loss curves."""

    @property
    def enabled(self) -> bool:
        return self.tensorboard or self.mlflow is not None

    def validate(self) -> None:
        check_positive(self, "tracking", "log_every")


@dataclass(frozen=True)
class FeaturesConfig:
    """Feature dashboards of the report (raybench.analysis.features). Not part of config_hash: they read the
    finished grid and change none of its results."""

    enabled: bool | None = None
    """Render them in the analyze stage; None: yes for open cohorts, never for credentialed ones (MIMIC), whose
    record-level waveforms must stay in the environment (`raybench features --out DIR` renders them locally)."""
    expansion: int | None = None
    """E of the dashboard cell; None: protocol.eval.calibration_expansion (8)."""
    depth: float = 1.0
    """Relative depth q of the dashboard cell (1.0: the final layer)."""
    seed: int | None = None
    """Seed of the dashboard cell; None: the lowest seed of the grid."""
    top_records: int = 3
    """Top-activating test records drawn per concept."""
    contrast_records: int = 2
    """Records drawn near the median and near zero activation, each."""
    unexplained: int = 8
    """Most frequently firing latents listed per model that no concept explains."""

    def validate(self) -> None:
        if not 0.0 <= self.depth <= 1.0:
            raise ConfigError(f"features.depth must lie in [0, 1], got {self.depth}")
        check_positive(self, "features", "top_records", "contrast_records", "unexplained")


@dataclass(frozen=True)
class RunConfig:
    """Everything a `raybench grid` run needs."""

    run_dir: str = "runs/demo"
    """The run folder: a local folder or an s3:// prefix."""
    protocol: Protocol = field(default_factory=Protocol)
    """The protocol (raybench.protocol)."""
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

    def validate(self) -> RunConfig:
        validate_sections(self)
        return self

    def hashed_config(self) -> dict[str, Any]:
        """What determines results (protocol, cohort, encoders), not where or how fast: what config_hash hashes."""
        payload = {k: to_dict(getattr(self, k)) for k in ("protocol", "cohort", "encoders")}
        payload["encoders"] = {k: v for k, v in payload["encoders"].items()
                               if k not in ("batch_size", "num_gpus", "min_actors", "max_actors", "stall_timeout_s")}
        return payload

    def config_hash(self) -> str:
        """Hash of what determines results (hashed_config), not of where or how fast."""
        return hashlib.sha256(json.dumps(self.hashed_config(), sort_keys=True).encode()).hexdigest()[:16]


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
    ).validate()


def paper_run(run_dir: str = "runs/paper") -> RunConfig:
    """The published protocol as executed, with the protocol code's preprocessing: reproduces the published tables."""
    return RunConfig(run_dir=run_dir, protocol=paper_protocol(), encoders=EncoderConfig(profile="published")).validate()


def paper_native_run(run_dir: str = "runs/paper-native") -> RunConfig:
    """The published protocol with each encoder's native (upstream) preprocessing: not the published tables."""
    return RunConfig(run_dir=run_dir, protocol=paper_native_protocol(), encoders=EncoderConfig(profile="native")
                     ).validate()


RUN_PRESETS = {"paper": paper_run, "paper-native": paper_native_run, "demo": demo_run}


# ---------------------------------------------------------------- YAML <-> dataclasses

def to_dict(obj: Any) -> Any:
    if is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type, data: dict[str, Any], where: str = "") -> Any:
    """Build dataclass `cls` from a plain dict, rejecting unknown keys and wrongly typed values."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {unknown} in {where or 'config'}; allowed: {sorted(known)}")
    kwargs = {name: _coerce(hints[name], value, f"{where}.{name}".lstrip(".")) for name, value in data.items()}
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if is_dataclass(tp):
        return from_dict(tp, value, where)
    if origin is Literal:
        if not any(value == a and type(value) is type(a) for a in args):
            raise not_a_choice(where, args, value)
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _coerce(inner[0], value, where)
        for arg in inner:  # e.g. GpuShare: a number or "auto"
            try:
                return _coerce(arg, value, where)
            except ConfigError:
                pass
        names = [" or ".join(repr(c) for c in typing.get_args(a)) if typing.get_origin(a) is Literal
                 else {float: "a number", int: "an integer"}.get(a, getattr(a, "__name__", str(a))) for a in inner]
        raise ConfigError(f"{where} must be {' or '.join(names)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        return tuple(_coerce(args[0], v, where) for v in value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where} must be a mapping, got {value!r}")
        return {str(k): _coerce(args[1], v, where) for k, v in value.items()}
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp is bool and isinstance(value, bool):
        return value
    if tp is str and isinstance(value, str):
        return value
    raise ConfigError(f"{where} must be {getattr(tp, '__name__', tp)}, got {value!r}")


def load_run_config(path: str | Path | None = None, **overrides: Any) -> RunConfig:
    """Load a YAML run config. A `preset: demo|paper|paper-native` key starts from that preset (RUN_PRESETS);
    without one the base is the dataclass defaults (the paper protocol, `encoders.profile: native`)."""
    if path is None:
        cfg = demo_run()
    else:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: malformed YAML: {' '.join(str(err).split())}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: top level must be a mapping")
        preset = raw.pop("preset", None)
        if preset is not None and preset not in RUN_PRESETS:
            raise ConfigError(f"{path}: preset must be one of {sorted(RUN_PRESETS)}, got {preset!r}")
        base = RUN_PRESETS[preset]() if preset is not None else RunConfig(protocol=paper_protocol())
        merged = _deep_merge(to_dict(base), raw)
        try:
            cfg = from_dict(RunConfig, merged)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from None
    if overrides:
        cfg = dataclasses.replace(cfg, **overrides)
    return cfg.validate()


def dump_run_config(cfg: RunConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
