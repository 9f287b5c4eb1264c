"""The protocol and the run, as one frozen dataclass tree (the single owner of every constant).

Presets (`RUN_PRESETS`): `paper` is the published ECG-InterpBench protocol as it was executed, with the
protocol code's own encoder preprocessing (`encoders.profile: published`): the preset that reproduces the
published tables. `paper-native` is the same protocol with each encoder's native (upstream)
preprocessing. `demo` keeps the same structure (450 primary cells + 90 sensitivity cells) but is small
enough for a 2-core laptop (and keeps the epoch sampler without clipping).
Configs load from / dump to YAML; unknown keys and bad values are errors that name the key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

import yaml

from raybench.errors import RaybenchError

MODELS: tuple[str, ...] = ("csfm", "cardiac_fm", "ecg_fm", "ecg_jepa", "hubert_ecg", "st_mem")
SAMPLERS: tuple[str, ...] = ("per_step", "epoch")


class ConfigError(RaybenchError, ValueError):
    """A config value or key is wrong; the message names it and says what is allowed."""


@dataclass(frozen=True)
class SAEProtocol:
    """BatchTopK SAE training (docs/protocol.md §6)."""

    steps: int = 8000
    batch_size: int = 256
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.99
    k_divisor: int = 8  # primary arm: k = d / k_divisor (96 at d = 768)
    aux_k: int = 512
    aux_coef: float = 1.0 / 32.0
    dead_after_batches: int = 5
    std_floor: float = 1e-6
    checkpoint_every: int = 2000  # in-trial checkpoint period (steps); 0: only finished cells persist
    # Batch sampler. per_step (published): each step draws rng.choice(n_train, batch_size, replace=False) afresh
    # from np.random.default_rng(cell seed); epoch: a fresh permutation per epoch, remainder dropped (each
    # record once per epoch; same generator and seed).
    sampler: str = "per_step"
    # Gradient-norm clipping per SAE over (W_enc, b_enc, W_dec, b_dec) jointly, before the decoder-gradient
    # projection, as torch.nn.utils.clip_grad_norm_ (published: 1e5). None: no clipping.
    grad_clip: float | None = 1e5

    def validate(self) -> None:
        _positive(self, "steps", "batch_size", "k_divisor", "aux_k", "dead_after_batches")
        if self.checkpoint_every < 0:
            raise ConfigError(f"sae.checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"sae.sampler must be one of {list(SAMPLERS)}, got {self.sampler!r}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"sae.grad_clip must be > 0 or null (no clipping), got {self.grad_clip}")
        if not (0 < self.lr < 1):
            raise ConfigError(f"sae.lr must be in (0, 1), got {self.lr}")
        for b in ("beta1", "beta2"):
            if not (0 <= getattr(self, b) < 1):
                raise ConfigError(f"sae.{b} must be in [0, 1), got {getattr(self, b)}")


@dataclass(frozen=True)
class GridProtocol:
    """The atlas: models x relative depths x expansions x seeds, plus the fixed-k/N sensitivity arm."""

    models: tuple[str, ...] = MODELS
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    expansions: tuple[int, ...] = (1, 4, 8, 16, 32)
    seeds: tuple[int, ...] = (4311, 4312, 4313)
    sensitivity_depth: float | None = 0.5  # None disables the sensitivity arm
    sensitivity_latents_per_k: int = 64  # sensitivity arm: k = N / 64

    def validate(self) -> None:
        if not self.models:
            raise ConfigError("grid.models is empty: list at least one encoder")
        if len(set(self.models)) != len(self.models):
            raise ConfigError(f"grid.models has duplicates: {list(self.models)}")
        for q in self.depths:
            if not 0.0 <= q <= 1.0:
                raise ConfigError(f"grid.depths must lie in [0, 1], got {q}")
        if any(e < 1 for e in self.expansions):
            raise ConfigError(f"grid.expansions must be >= 1, got {list(self.expansions)}")
        if len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"grid.seeds has duplicates: {list(self.seeds)}")
        if self.sensitivity_depth is not None and self.sensitivity_depth not in self.depths:
            raise ConfigError(
                f"grid.sensitivity_depth {self.sensitivity_depth} is not one of grid.depths {list(self.depths)}"
            )

    @property
    def n_primary_cells(self) -> int:
        return len(self.models) * len(self.depths) * len(self.expansions) * len(self.seeds)

    @property
    def n_blocks(self) -> int:
        """A matched block = all models at one (depth, expansion, seed)."""
        return len(self.depths) * len(self.expansions) * len(self.seeds)


@dataclass(frozen=True)
class EvalProtocol:
    """Per-cell evaluation and metric definitions (docs/protocol.md §7)."""

    eval_batch: int = 256
    selection_records: int = 4096  # fixed train subset for single-coordinate selection
    # default_rng(selection_seed).choice over the train split in ascending ecg_id order (published: 20260714)
    selection_seed: int = 20260714
    coverage_threshold: float = 0.20
    gate_r2: float = 0.90
    gate_dead: float = 0.20
    repro_top: int = 256
    repro_permutations: int = 100
    calibration_expansion: int = 8
    # Records with a missing concept (raybench.sae.data). complete_case: the published MIMIC run - each concept's
    # coordinate selection uses the selection records where it is present; val/test (fidelity, r, the patient
    # bootstrap) use records with every concept. fill_zero: standardized missing values read as 0 (the mean).
    # auto: complete_case for waveform-derived concepts (MIMIC-IV-ECG), fill_zero for feature tables (PTB-XL+).
    missing_concepts: str = "auto"

    def validate(self) -> None:
        _positive(self, "eval_batch", "selection_records", "repro_top", "repro_permutations")
        for name in ("coverage_threshold", "gate_r2", "gate_dead"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"eval.{name} must be in [0, 1], got {getattr(self, name)}")
        if self.missing_concepts not in ("auto", "complete_case", "fill_zero"):
            raise ConfigError(f"eval.missing_concepts must be auto, complete_case or fill_zero, "
                              f"got {self.missing_concepts!r}")


@dataclass(frozen=True)
class InferenceProtocol:
    """Bootstraps and multiple-testing control (docs/protocol.md §8)."""

    patient_draws: int = 2000
    crossed_draws: int = 10000
    seed: int = 20260714  # published: both bootstraps use default_rng(20260714)
    ci_low: float = 2.5
    ci_high: float = 97.5
    chunk_draws: int = 250  # draws per Ray task
    # Arithmetic of the bootstrap GEMM. float64 is exact; float32 is ~2x faster with |error in r| ~1e-6
    # (a coverage flag can flip only for an |r| within ~1e-6 of the threshold).
    gemm_dtype: str = "float64"
    # Random streams of the bootstraps and the permutation floor (raybench.analysis.streams). published: the
    # protocol code's generator calls, seeds and draw order (patient draws made in order on the driver);
    # chunked: one SeedSequence child per chunk, drawn inside the Ray task. Both are worker-count independent.
    stream: str = "published"

    def validate(self) -> None:
        _positive(self, "patient_draws", "crossed_draws", "chunk_draws")
        if self.stream not in ("published", "chunked"):
            raise ConfigError(f"inference.stream must be published or chunked, got {self.stream!r}")
        if self.gemm_dtype not in ("float64", "float32"):
            raise ConfigError(f"inference.gemm_dtype must be float64 or float32, got {self.gemm_dtype!r}")
        if not 0 <= self.ci_low < self.ci_high <= 100:
            raise ConfigError(f"inference CI percentiles must satisfy 0 <= low < high <= 100, got "
                              f"{self.ci_low}, {self.ci_high}")


@dataclass(frozen=True)
class Protocol:
    name: str = "paper"
    sae: SAEProtocol = field(default_factory=SAEProtocol)
    grid: GridProtocol = field(default_factory=GridProtocol)
    eval: EvalProtocol = field(default_factory=EvalProtocol)
    inference: InferenceProtocol = field(default_factory=InferenceProtocol)

    def validate(self) -> None:
        self.sae.validate()
        self.grid.validate()
        self.eval.validate()
        self.inference.validate()


@dataclass(frozen=True)
class CohortConfig:
    """Where records come from. kind: synth (generated into the run folder), ptbxl, mimic."""

    kind: str = "synth"
    root: str | None = None  # dataset folder (ptbxl/mimic); synth: generated under <run>/cohort
    records: int = 1500  # synth only
    patients: int = 500  # synth only
    seed: int = 7  # synth only
    bad_fraction: float = 0.0  # synth only: fraction of deliberately bad records
    sampling_rate: int = 500  # ptbxl: 500 (records500) or 100 (records100)
    concepts: str = "auto"  # auto: feature tables if present, else waveform-derived; tables; waveform; none
    # mimic only (raybench.cohorts.mimic): pool size (the published 100,000; null: every eligible study), the
    # concept extractor (published: the protocol's code; refined: raybench's) and the record pool (published:
    # ICD-linked, extraction ok, then ranked; all: ranked). The ICD link needs MIMIC-IV hosp/admissions.csv.gz.
    max_records: int | None = 100_000
    concept_extractor: str = "published"
    record_pool: str = "published"
    admissions: str | None = None

    def validate(self) -> None:
        if self.concept_extractor not in ("published", "refined"):
            raise ConfigError(f"cohort.concept_extractor must be published or refined, got {self.concept_extractor!r}")
        if self.record_pool not in ("published", "all"):
            raise ConfigError(f"cohort.record_pool must be published or all, got {self.record_pool!r}")
        if self.max_records is not None and self.max_records < 1:
            raise ConfigError(f"cohort.max_records must be >= 1 or null, got {self.max_records}")
        if self.kind not in ("synth", "ptbxl", "mimic"):
            raise ConfigError(f"cohort.kind must be synth, ptbxl or mimic, got {self.kind!r}")
        if self.kind != "synth" and not self.root:
            raise ConfigError(f"cohort.root is required for cohort.kind={self.kind!r}: the dataset folder")
        if self.sampling_rate not in (100, 500):
            raise ConfigError(f"cohort.sampling_rate must be 100 or 500, got {self.sampling_rate}")
        if self.concepts not in ("auto", "tables", "waveform", "none"):
            raise ConfigError(f"cohort.concepts must be auto, tables, waveform or none, got {self.concepts!r}")
        if not 0.0 <= self.bad_fraction < 0.5:
            raise ConfigError(f"cohort.bad_fraction must be in [0, 0.5), got {self.bad_fraction}")


@dataclass(frozen=True)
class EncoderConfig:
    """Which encoder weights, preprocessing profile and extraction resources."""

    size: str = "full"  # demo (small width, seeded init) | full (published architecture)
    profile: str = "native"  # native (upstream preprocessing) | published (what the protocol's code did)
    checkpoints: dict[str, str] = field(default_factory=dict)  # model -> checkpoint path (full size)
    init_seed: int = 0  # seeded init when no checkpoint is given
    batch_size: int = 32
    num_gpus: float = 0.0  # per encoder actor; fractional shares a GPU
    min_actors: int = 1
    max_actors: int = 1

    def validate(self) -> None:
        if self.size not in ("demo", "full"):
            raise ConfigError(f"encoders.size must be demo or full, got {self.size!r}")
        if self.profile not in ("native", "published"):
            raise ConfigError(f"encoders.profile must be native or published, got {self.profile!r}")
        if not self.num_gpus >= 0.0:
            raise ConfigError(f"encoders.num_gpus must be >= 0, got {self.num_gpus}")
        _positive(self, "batch_size", "min_actors", "max_actors")
        if self.min_actors > self.max_actors:
            raise ConfigError("encoders.min_actors must be <= encoders.max_actors")


@dataclass(frozen=True)
class ResourceConfig:
    """Ray resources: where to run and how to pack trials."""

    address: str | None = None  # None: RAY_ADDRESS if set, else a local instance
    num_cpus: int | None = None  # local instance only
    num_gpus: int | None = None  # local instance only (logical GPUs are fine for scheduling tests)
    trial_cpus: float = 1.0
    trial_gpus: float = 0.0  # fractional GPU per SAE trial, e.g. 0.25 packs four per GPU
    max_concurrent_trials: int = 0  # 0: as many as resources allow
    max_failures: int = 2  # Tune retries per trial
    # What one Tune trial trains. "stack": the seeds of one model x depth x E x arm (finest packing, for GPU
    # clusters); "layer": every E of one model x depth x arm; "model": all cells of one model x arm.
    # Coarser units amortize per-trial start-up on small CPU machines.
    trial_unit: str = "stack"

    def validate(self) -> None:
        if self.trial_cpus <= 0:
            raise ConfigError(f"resources.trial_cpus must be > 0, got {self.trial_cpus}")
        if self.trial_gpus < 0:
            raise ConfigError(f"resources.trial_gpus must be >= 0, got {self.trial_gpus}")
        if self.trial_unit not in ("stack", "layer", "model"):
            raise ConfigError(f"resources.trial_unit must be stack, layer or model, got {self.trial_unit!r}")
        if self.max_concurrent_trials < 0 or self.max_failures < 0:
            raise ConfigError("resources.max_concurrent_trials and resources.max_failures must be >= 0")


@dataclass(frozen=True)
class RunConfig:
    """Everything a `raybench grid` run needs. `run_dir` is a local folder or an s3:// prefix."""

    run_dir: str = "runs/demo"
    protocol: Protocol = field(default_factory=Protocol)
    cohort: CohortConfig = field(default_factory=CohortConfig)
    encoders: EncoderConfig = field(default_factory=EncoderConfig)
    resources: ResourceConfig = field(default_factory=ResourceConfig)

    def validate(self) -> RunConfig:
        self.protocol.validate()
        self.cohort.validate()
        self.encoders.validate()
        self.resources.validate()
        return self

    def config_hash(self) -> str:
        """Hash of what determines results (protocol, cohort, encoders), not of where or how fast."""
        payload = {k: to_dict(getattr(self, k)) for k in ("protocol", "cohort", "encoders")}
        payload["encoders"] = {k: v for k, v in payload["encoders"].items()
                               if k not in ("batch_size", "num_gpus", "min_actors", "max_actors")}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def k_for(d: int, n_latents: int, arm: str, sae: SAEProtocol, grid: GridProtocol) -> int:
    """The k rule: primary arm k = d / 8 at every E; sensitivity arm k = N / 64."""
    if arm == "primary":
        return max(1, d // sae.k_divisor)
    if arm == "sensitivity":
        return max(1, n_latents // grid.sensitivity_latents_per_k)
    raise ConfigError(f"unknown arm {arm!r}: expected primary or sensitivity")


def layer_for_depth(q: float, n_layers: int) -> int:
    """Relative depth q in [0, 1] -> audited layer floor(q (L - 1) + 0.5)."""
    return int(math.floor(q * (n_layers - 1) + 0.5))


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


PRESETS = {"paper": paper_protocol, "paper-native": paper_native_protocol, "demo": demo_protocol}


def demo_run(run_dir: str = "runs/demo") -> RunConfig:
    """The embedded default: synthetic cohort, demo encoders, demo protocol, local Ray."""
    return RunConfig(
        run_dir=run_dir,
        protocol=demo_protocol(),
        cohort=CohortConfig(kind="synth", records=1500, patients=500, seed=7),
        encoders=EncoderConfig(size="demo", batch_size=64, min_actors=2, max_actors=2),  # both cores
        resources=ResourceConfig(trial_unit="model"),  # 12 trials: per-trial start-up dominates tiny SAEs
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
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, where)
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


def _positive(obj: Any, *names: str) -> None:
    section = type(obj).__name__
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {getattr(obj, name)}")
