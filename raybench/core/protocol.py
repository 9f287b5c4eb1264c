"""The protocol as frozen dataclasses: SAE training, the grid, per-cell evaluation and inference.

Every number the protocol fixes lives here once, with the section of docs/protocol.md that owns it; the
dataclass defaults are the published protocol (the `paper` preset). The run's other settings (cohort,
encoders, Ray resources), the presets and YAML loading are in raybench.core.config, which re-exports these names.

Fields with a fixed set of values are typed `Literal[...]`; `check_choices` and the YAML loader take the
allowed values from those types (typing.get_args), so a choice is declared in one place.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal

from raybench.core.errors import RaybenchError
from raybench.core.models import MODELS, PUBLISHED_MODEL_ORDER, PUBLISHED_MODELS  # noqa: F401 (MODELS: re-exported)

Sampler = Literal["per_step", "epoch"]
"""How training batches are drawn (docs/protocol.md §6.5): per_step (published) or epoch."""
MissingConcepts = Literal["auto", "complete_case", "fill_zero"]
"""How records with a missing concept are evaluated (EvalProtocol.missing_concepts)."""
GemmDtype = Literal["float64", "float32"]
"""Arithmetic of the bootstrap matrix products (InferenceProtocol.gemm_dtype)."""
Stream = Literal["published", "chunked"]
"""Random streams of the bootstraps and the permutation floor (docs/protocol.md §8.6)."""
Arm = Literal["primary", "sensitivity"]
"""The k rule of a cell (docs/protocol.md §6.6): primary k = d / 8, sensitivity k = N / 64."""

ARMS: tuple[str, ...] = typing.get_args(Arm)


class ConfigError(RaybenchError, ValueError):
    """A config value or key is wrong; the message names it and says what is allowed."""


# ---------------------------------------------------------------- checks shared by every config section

def literal_choices(tp: Any) -> tuple | None:
    """The allowed values of a `Literal[...]` type (None added for `Literal[...] | None`); None for other types."""
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        out: list = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                out.append(None)
            elif typing.get_origin(arg) is Literal:
                out.extend(typing.get_args(arg))
            else:
                return None
        return tuple(out)
    return None


def not_a_choice(where: str, allowed: tuple, value: Any) -> ConfigError:
    """The error for a value outside its Literal's choices (one wording for validation and YAML loading)."""
    return ConfigError(f"{where} must be one of {list(allowed)}, got {value!r}")


def check_choices(obj: Any, section: str) -> None:
    """Every Literal-typed field of dataclass `obj` holds one of its declared values (`section`: its YAML key)."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        allowed = literal_choices(hints[f.name])
        value = getattr(obj, f.name)
        # `value in allowed` alone would accept True for Literal[1] and 100.0 for Literal[100]
        if allowed is not None and not any(value == a and type(value) is type(a) for a in allowed):
            raise not_a_choice(f"{section}.{f.name}", allowed, value)


def validate_sections(obj: Any) -> None:
    """Validate each dataclass-valued field of `obj` (the sections of a Protocol or a RunConfig)."""
    for f in dataclasses.fields(obj):
        section = getattr(obj, f.name)
        if dataclasses.is_dataclass(section):
            section.validate()


def check_positive(obj: Any, section: str, *names: str) -> None:
    """Each named field of `obj` is > 0."""
    for name in names:
        if getattr(obj, name) <= 0:
            raise ConfigError(f"{section}.{name} must be > 0, got {getattr(obj, name)}")


# ---------------------------------------------------------------- the protocol

@dataclass(frozen=True)
class SAEProtocol:
    """BatchTopK SAE training (docs/protocol.md §6)."""

    steps: int = 8000
    """Optimizer steps per SAE. Published: 8,000 (§6.5)."""
    batch_size: int = 256
    """Training records per step (B). Published: 256 (§6.5)."""
    lr: float = 3e-4
    """Adam learning rate, constant (no schedule). Published: 3e-4 (§6.5)."""
    beta1: float = 0.9
    """Adam beta1. Published: 0.9 (§6.5)."""
    beta2: float = 0.99
    """Adam beta2. Published: 0.99 (§6.5)."""
    k_divisor: int = 8
    """Primary arm: k = d / k_divisor active latents per record (batch average). Published: 8, k = 96 at d = 768
    (§6.6)."""
    aux_k: int = 512
    """AuxK: the dead pre-activations per record that reconstruct the residual. Published: 512 (§6.4)."""
    aux_coef: float = 1.0 / 32.0
    """Weight of the AuxK term in the loss. Published: 1/32 (§6.4)."""
    dead_after_batches: int = 5
    """Consecutive training batches without firing after which a latent counts as dead. Published: 5 (§6.4)."""
    std_floor: float = 1e-6
    """Floor of the per-dimension train standard deviation in the input z-score. Published: 1e-6 (§6.1)."""
    checkpoint_every: int = 2000
    """In-trial checkpoint period in steps; 0: only finished cells persist. raybench's (not a protocol value)."""
    sampler: Sampler = "per_step"
    """Batch sampler. per_step (published): each step draws rng.choice(n_train, batch_size, replace=False) afresh
    from np.random.default_rng(cell seed); epoch: a fresh permutation per epoch, remainder dropped (each record
    once per epoch; same generator and seed) (§6.5)."""
    grad_clip: float | None = 1e5
    """Max joint gradient norm per SAE over (W_enc, b_enc, W_dec, b_dec), applied before the decoder-gradient
    projection with torch.nn.utils.clip_grad_norm_'s arithmetic; None: no clipping. Published: 1e5 (§6.5)."""

    def validate(self) -> None:
        check_choices(self, "sae")
        check_positive(self, "sae", "steps", "batch_size", "k_divisor", "aux_k", "dead_after_batches")
        if self.checkpoint_every < 0:
            raise ConfigError(f"sae.checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ConfigError(f"sae.grad_clip must be > 0 or null (no clipping), got {self.grad_clip}")
        if not (0 < self.lr < 1):
            raise ConfigError(f"sae.lr must be in (0, 1), got {self.lr}")
        for b in ("beta1", "beta2"):
            if not (0 <= getattr(self, b) < 1):
                raise ConfigError(f"sae.{b} must be in [0, 1), got {getattr(self, b)}")


@dataclass(frozen=True)
class GridProtocol:
    """The atlas: models x relative depths x expansions x seeds, plus the fixed-k/N sensitivity arm (§6.6)."""

    models: tuple[str, ...] = PUBLISHED_MODELS
    """Encoders audited, by registry name (a built-in, a plugin or a run-time registration). Published: the six of
    §5.2 (raybench.core.models.PUBLISHED_MODELS, pinned: a new built-in encoder joins a run only when listed here)."""
    depths: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    """Relative depths q in [0, 1], mapped to layers by `layer_for_depth`. Published: 0, .25, .5, .75, 1 (§5.3)."""
    expansions: tuple[int, ...] = (1, 4, 8, 16, 32)
    """Expansion factors E = N / d (dictionary width over state width). Published: 1, 4, 8, 16, 32 (§6.6)."""
    seeds: tuple[int, ...] = (4311, 4312, 4313)
    """SAE seeds per (model, depth, E): init and batch order. Published: 4311, 4312, 4313 (§6.6)."""
    sensitivity_depth: float | None = 0.5
    """Relative depth of the sensitivity arm (one of `depths`); None disables the arm. Published: 0.5 (§6.6)."""
    sensitivity_latents_per_k: int = 64
    """Sensitivity arm: k = N / sensitivity_latents_per_k. Published: 64 (§6.6)."""

    def validate(self) -> None:
        if not self.models:
            raise ConfigError("grid.models is empty: list at least one encoder")
        for key, what in (("depths", "relative depth in [0, 1]"), ("expansions", "expansion factor E >= 1"),
                          ("seeds", "SAE seed")):
            if not getattr(self, key):
                raise ConfigError(f"grid.{key} is empty: list at least one {what} (the preset's: "
                                  f"{list(getattr(GridProtocol, key))})")
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
    """Records per frozen-order evaluation batch (BatchTopK keeps B*k entries per batch). Published: 256 (§6.7)."""
    selection_records: int = 4096
    """Size of the fixed train subset on which single coordinates are selected. Published: 4,096 (§7.3)."""
    selection_seed: int = 20260714
    """Seed of default_rng(selection_seed).choice over the train split in ascending ecg_id order.
    Published: 20260714 (§7.3)."""
    coverage_threshold: float = 0.20
    """|r_test| a concept's selected coordinate must reach to count as covered. Published: 0.20 (§7.4)."""
    gate_r2: float = 0.90
    """Fidelity gate: minimum validation R^2. Published: 0.90 (§7.2)."""
    gate_dead: float = 0.20
    """Fidelity gate: validation dead fraction must stay below this. Published: 0.20 (§7.2)."""
    repro_top: int = 256
    """Reproducibility: at most this many most active non-dead decoder columns per seed. Published: 256 (§7.5)."""
    repro_permutations: int = 100
    """Reproducibility: random one-to-one pairings of the permutation floor. Published: 100 (§7.5)."""
    calibration_expansion: int = 8
    """Expansion E of the calibration ladder and the intervention analysis. Published: 8 (§9.1, §9.4)."""
    missing_concepts: MissingConcepts = "auto"
    """Records with a missing concept (raybench.sae.data). complete_case: the published MIMIC run - each
    concept's coordinate selection uses the selection records where it is present; val/test (fidelity, r, the
    patient bootstrap) use records with every concept. fill_zero: standardized missing values read as 0 (the
    mean). auto: complete_case for waveform-derived concepts (MIMIC-IV-ECG), fill_zero for feature tables
    (PTB-XL+) (§3.3)."""

    def validate(self) -> None:
        check_choices(self, "eval")
        check_positive(self, "eval", "eval_batch", "selection_records", "repro_top", "repro_permutations")
        for name in ("coverage_threshold", "gate_r2", "gate_dead"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"eval.{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass(frozen=True)
class InferenceProtocol:
    """Bootstraps and multiple-testing control (docs/protocol.md §8)."""

    patient_draws: int = 2000
    """Draws of the paired patient bootstrap. Published: 2,000 (§8.1)."""
    crossed_draws: int = 10000
    """Draws of the crossed depth x seed bootstrap. Published: 10,000 (§8.4)."""
    seed: int = 20260714
    """Seed of both bootstraps' generators. Published: 20260714 (§8.6)."""
    ci_low: float = 2.5
    """Lower percentile (in percent) of the bootstrap intervals. Published: 2.5 (§8.2)."""
    ci_high: float = 97.5
    """Upper percentile (in percent) of the bootstrap intervals. Published: 97.5 (§8.2)."""
    chunk_draws: int = 250
    """Bootstrap draws per Ray task. raybench's (not a protocol value; results do not depend on it)."""
    gemm_dtype: GemmDtype = "float64"
    """Arithmetic of the bootstrap matrix products. float64 is exact; float32 is ~2x faster with |error in r|
    ~1e-6 (a coverage flag can flip only for an |r| within ~1e-6 of the threshold). Published: float64."""
    stream: Stream = "published"
    """Random streams of the bootstraps and the permutation floor (raybench.analysis.inference.streams). published: the
    protocol code's generator calls, seeds and draw order (patient draws made in order on the driver), with its
    arithmetic and rank ties where rounding decides ties (§8.2, §8.8); chunked: one SeedSequence child per chunk,
    drawn inside the Ray task, tied models sharing rank 1. Both are worker-count independent (§8.6)."""

    def validate(self) -> None:
        check_choices(self, "inference")
        check_positive(self, "inference", "patient_draws", "crossed_draws", "chunk_draws")
        if not 0 <= self.ci_low < self.ci_high <= 100:
            raise ConfigError(f"inference CI percentiles must satisfy 0 <= low < high <= 100, got "
                              f"{self.ci_low}, {self.ci_high}")


@dataclass(frozen=True)
class Protocol:
    """The whole protocol: what determines results, apart from the cohort and the encoders' inputs."""

    name: str = "paper"
    """Name of the preset it came from (paper, paper-native, demo) or of a custom protocol. Published: paper."""
    sae: SAEProtocol = field(default_factory=SAEProtocol)
    """SAE training (§6)."""
    grid: GridProtocol = field(default_factory=GridProtocol)
    """The grid of cells (§6.6)."""
    eval: EvalProtocol = field(default_factory=EvalProtocol)
    """Per-cell metrics (§7)."""
    inference: InferenceProtocol = field(default_factory=InferenceProtocol)
    """Bootstraps and multiple testing (§8)."""

    def validate(self) -> None:
        validate_sections(self)


# ---------------------------------------------------------------- the grid's rules

@dataclass(frozen=True)
class ModelDims:
    """What the grid needs to know about an encoder (raybench.encoders.store.ActivationStore.model_dims)."""

    n_layers: int
    """Audited hidden states L of the encoder (§5.2)."""
    d: int
    """State width: the SAE input dimension."""


def analysis_order(models: typing.Iterable[str]) -> list[str]:
    """`models` in PUBLISHED_MODEL_ORDER, any other model after them in the order given (§8.8).

    The one order in which every analysis breaks ties between models and orients pairwise contrasts, whatever
    the grid's order; a seventh encoder, unknown to the published scripts, comes last.
    """
    models = list(models)
    rank = {m: i for i, m in enumerate(PUBLISHED_MODEL_ORDER)}
    return sorted(models, key=lambda m: (rank.get(m, len(rank)), models.index(m)))


def k_for(d: int, n_latents: int, arm: str, sae: SAEProtocol, grid: GridProtocol) -> int:
    """The k rule (§6.6): primary arm k = round(d / 8) at every E; sensitivity arm k = round(N / 64).

    As the published manifest builder computes it: Python's round() of the float quotient (a half goes to the
    even integer: d = 20 gives k = 2, d = 28 gives 4), at least 1, and a k that is not below N is refused.
    """
    if arm == "primary":
        k = max(1, int(round(d / sae.k_divisor)))
    elif arm == "sensitivity":
        k = max(1, int(round(n_latents / grid.sensitivity_latents_per_k)))
    else:
        raise ConfigError(f"unknown arm {arm!r}: expected one of {list(ARMS)}")
    if k >= n_latents:
        raise ConfigError(f"the {arm} arm's k rule gives k = {k} active latents of N = {n_latents} (d = {d}): "
                          "k must be below N; use a wider state or a larger expansion")
    return k


def layer_for_depth(q: float, n_layers: int) -> int:
    """Relative depth q in [0, 1] -> audited layer floor(q (L - 1) + 0.5) (§5.3)."""
    return int(math.floor(q * (n_layers - 1) + 0.5))


def audited_depths(protocol: Protocol) -> list[float]:
    """Relative depths the activation store must hold (primary depths + sensitivity depth), ascending."""
    grid = protocol.grid
    return sorted({*grid.depths, *(() if grid.sensitivity_depth is None else (grid.sensitivity_depth,))})


def audited_layers(protocol: Protocol, n_layers: int) -> list[int]:
    """Layers the activation store must hold for one encoder (the audited depths' layers)."""
    return sorted({layer_for_depth(q, n_layers) for q in audited_depths(protocol)})
