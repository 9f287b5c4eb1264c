"""The run config's sections for the audits that read a finished grid and change none of its results: the
reliability audit, the provenance audit, experiment tracking and the feature dashboards. None is part of
config_hash. `raybench.core.config` re-exports every name (the config's one entry point).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from raybench.core.protocol import ConfigError, check_positive, not_a_choice

if TYPE_CHECKING:
    from raybench.core.protocol import Protocol

PANEL_VARIANTS: dict[str, dict[str, Any]] = {
    "base": {}, "steep_zipf": {"zipf_exponent": 0.65, "rate_max": 0.5},
    "correlated": {"n_correlated_pairs": 40, "rho": 0.85}}
"""The reliability panel's synthetic models (raybench.analysis.reliability.ground_truth) by name, each as its
overrides of the base spec: the correlations are re-measured on each (robustness, paper Appendix I)."""


PANEL_SIZES = ("demo", "paper")
"""reliability.panel: the synthetic model's size (raybench.analysis.reliability.panel.panel_spec)."""


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
    panel: str = "demo"
    """The panel's synthetic model: `demo` (d = 96, 384 true features, about 6.7 active per record, 3,000
    records; fits the demo's budget) or `paper` (SynthSAEBench-16k's size: d = 768, 16,384 features in 128 trees,
    8,192 records; hours on a CPU)."""
    panel_variants: tuple[str, ...] = ("base", "steep_zipf", "correlated")
    """Synthetic models the panel is trained on (PANEL_VARIANTS); the first decides, the others test
    robustness."""
    panel_expansions: tuple[int, ...] = (2,)
    """Expansions E of the panel's SAEs; one width, as the paper's panel (demo panel: d = 96, so E = 2 gives N =
    192 latents for 384 true features, the 192 most frequent in-SAE)."""
    panel_ks: tuple[int, ...] = (4, 8, 12, 16, 24)
    """k of the panel's SAEs (the demo panel's records have about 6.7 active features)."""
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
        if self.panel not in PANEL_SIZES:
            raise not_a_choice("reliability.panel", PANEL_SIZES, self.panel)
        if not self.panel_variants or any(v not in PANEL_VARIANTS for v in self.panel_variants):
            raise ConfigError(f"reliability.panel_variants must be names among {sorted(PANEL_VARIANTS)}, got "
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
    variables: tuple[str, ...] = ("device", "site", "device|site")
    """Provenance variables u audited, manifest columns (§12.1): `a+b` audits (a, b) pairs as groups, `a|b` compares
    the values of a within each value of b (a reliance of `a` then stands only when it holds within b)."""
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
    metadata_csv: str | None = None
    """A CSV of age, sex, recording_year (or recording_date) keyed by ecg_id or patient_id: the metadata comparator
    for any cohort (else PTB-XL's ptbxl_database.csv; without either the metadata gate is not evaluated, §12.1)."""

    def validate(self) -> None:
        if not self.variables or len(set(self.variables)) != len(self.variables):
            raise ConfigError(f"provenance.variables must name distinct manifest columns, got {self.variables}")
        bad = [v for v in self.variables if v.count("|") > 1 or any(not p for p in v.replace("|", "+").split("+"))]
        if bad:
            raise ConfigError(f"provenance.variables {bad}: write a column, a+b (pairs) or a|b (a within b)")
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


SECONDARY_ANALYSES = ("calibration", "harmonization", "intervention")


@dataclass(frozen=True)
class SecondaryConfig:
    """The secondary analyses (docs/protocol.md §9; raybench.analysis.secondary): the run config's `secondary`
    section (None there: `demo()` for the demo protocol, else these defaults). Outside config_hash: the analyses
    read the finished grid and change none of its results.

    None for draws / seeds means "take protocol.inference's" so the secondary bootstraps reuse the run's
    patient draws (raybench's rule, the demo preset). The defaults are the published scripts' own bootstrap
    seeds, one per analysis (docs/protocol.md §9.5); this class is their one owner.
    """

    analyses: tuple[str, ...] = SECONDARY_ANALYSES
    # calibration ladder
    ridge_alpha: float = 10.0
    top_m: tuple[int, ...] = (16, 4)
    random_dictionaries: int = 20
    random_seed: int = 920000  # dictionary i uses random_seed + i (the published 20 dictionaries: 920000-920019)
    # input harmonization
    harmonization_protocols: tuple[str, ...] = ("native", "lead", "temporal", "joint")
    canonical_samples: int = 2500  # the whole record on 2,500 points (10 s -> 250 Hz)
    harmonization_batch: int = 64
    harmonization_train_records: int | None = None  # None: the whole train selection subset (4,096 in the paper)
    harmonization_test_patients: int | None = None  # None: every test patient
    harmonization_subset_seed: int = 20240615
    # intervention
    readout_alphas: tuple[float, ...] = (0.1, 1.0, 10.0, 100.0)
    intervention_ks: tuple[int, ...] = (1, 5)  # coordinates clamped per concept (published: 1 and 5)
    intervention_methods: tuple[str, ...] = ("dense", "pca", "sae", "random_rotation")  # published order
    intervention_arms: tuple[str, ...] = ("matched", "full")  # SAE candidates: a subset of d latents / all
    # the random rotation of a model uses rotation_seed + its final layer's index among the grid's E = 8 groups
    # (published: 20260724, 20260729, ..., 20260749; raybench.analysis.secondary.intervention.rotation_seeds)
    rotation_seed: int = 20260720
    high_quantile: float = 0.75
    effect_cap: float = 0.25
    effect_floor: float = 0.05
    max_dose: float = 1.0
    candidate_subsets: int = 20
    subset_seed: int = 960000
    # on MIMIC-IV-ECG (cohort.kind mimic), the published MIMIC workers' design instead (docs/protocol.md §9.4.1):
    # dense vs SAE, k = 5, the matched arm with subsets seeded from mimic_subset_seed, every record with its missing
    # labels (NaN-masked correlations on the whole train split, a masked ridge per concept, finite-label centroids),
    # the candidate pool and the SAE quality gate below; False: the design above on every cohort
    mimic_design: bool = True
    mimic_subset_seed: int = 976000
    candidate_pool: str = "all"  # all | train_live: the latents subsets are drawn from (MIMIC design)
    quality_gate: str = "training_metrics"  # training_metrics (the cell's gate_pass) | matched_live_capacity
    min_validation_r2: float = 0.90  # matched_live_capacity: validation R^2 at least this
    min_live_latents: int | None = None  # matched_live_capacity: live latents at least this; None: d (768)
    # under eval.missing_concepts complete_case: True (published) fits and selects calibration and intervention on
    # the complete-case train records, with the selection subset drawn among them; False (raybench's) reuses the
    # atlas's train split and selection subset, missing concepts at 0 (docs/protocol.md §9.6)
    complete_case_train: bool = True
    # inference
    bootstrap_draws: int | None = None  # None: protocol.inference.patient_draws
    # patient-bootstrap seeds; None: protocol.inference.seed (docs/protocol.md §9.5)
    harmonization_seed: int | None = 20260715  # published input-harmonization evaluation
    intervention_seed: int | None = 20260722  # published matched-effect bootstrap (PTB-XL and other cohorts)
    mimic_intervention_seed: int | None = 20260724  # published MIMIC-IV-ECG matched-effect bootstrap

    def validate(self) -> SecondaryConfig:
        unknown = [a for a in self.analyses if a not in SECONDARY_ANALYSES]
        if unknown:
            raise ConfigError(f"unknown secondary analyses {unknown} (secondary.analyses); choose from "
                              f"{SECONDARY_ANALYSES}")
        bad = [p for p in self.harmonization_protocols if p not in ("native", "lead", "temporal", "joint")]
        if bad or "native" not in self.harmonization_protocols:
            raise ConfigError(f"harmonization_protocols must include native and only use native/lead/temporal/joint, "
                             f"got {list(self.harmonization_protocols)}")
        if self.ridge_alpha <= 0 or any(a <= 0 for a in self.readout_alphas):
            raise ConfigError("ridge alphas must be > 0")
        if self.random_dictionaries < 1 or self.candidate_subsets < 1 or min(self.intervention_ks, default=0) < 1:
            raise ConfigError("random_dictionaries, candidate_subsets and intervention_ks must be >= 1")
        methods = ("dense", "pca", "sae", "random_rotation")
        if not {"dense", "sae"} <= set(self.intervention_methods) or \
                tuple(m for m in methods if m in self.intervention_methods) != self.intervention_methods:
            raise ConfigError(f"intervention_methods must hold dense and sae, in the order {methods}, "
                             f"got {list(self.intervention_methods)}")
        if self.candidate_pool not in ("all", "train_live"):
            raise ConfigError(f"secondary.candidate_pool must be all or train_live, got {self.candidate_pool!r}")
        if self.quality_gate not in ("training_metrics", "matched_live_capacity"):
            raise ConfigError(f"secondary.quality_gate must be training_metrics or matched_live_capacity, "
                              f"got {self.quality_gate!r}")
        if self.min_live_latents is not None and self.min_live_latents < 1:
            raise ConfigError(f"secondary.min_live_latents must be None or >= 1, got {self.min_live_latents}")
        if not self.intervention_arms or not set(self.intervention_arms) <= {"matched", "full"}:
            raise ConfigError(f"intervention_arms must be matched and/or full, got {list(self.intervention_arms)}")
        if not 0 < self.effect_floor <= self.effect_cap or self.max_dose <= 0:
            raise ConfigError("need 0 < effect_floor <= effect_cap and max_dose > 0")
        for name in ("harmonization_train_records", "harmonization_test_patients"):
            if getattr(self, name) is not None and getattr(self, name) < 2:
                raise ConfigError(f"{name} must be None or >= 2, got {getattr(self, name)}")
        if self.bootstrap_draws is not None and self.bootstrap_draws < 1:
            raise ConfigError("bootstrap_draws must be >= 1")
        return self

    @classmethod
    def demo(cls) -> SecondaryConfig:
        """Laptop-sized: re-encoding is the only costly part, so only its record counts shrink. The secondary
        bootstraps reuse the run's patient draws (protocol.inference.seed), the ladder and interventions the
        atlas's selection subset, and the interventions compare SAE and dense coordinates only (k = 5, subsets
        of d latents) on every cohort, MIMIC-IV-ECG included (mimic_design False): raybench's rules."""
        return cls(harmonization_train_records=96, harmonization_test_patients=32, harmonization_seed=None,
                   intervention_seed=None, mimic_intervention_seed=None, complete_case_train=False,
                   intervention_ks=(5,), intervention_methods=("dense", "sae"), intervention_arms=("matched",),
                   mimic_design=False)

    def uses_mimic_design(self, cohort: str) -> bool:
        """The published MIMIC workers' design runs (cohort: cfg.cohort.kind)."""
        return self.mimic_design and cohort == "mimic"

    def intervention_design(self, cohort: str) -> SecondaryConfig:
        """These settings with the intervention design of `cohort`: on MIMIC-IV-ECG (mimic_design) dense vs SAE
        at k = 5 in the matched arm, subsets from mimic_subset_seed (docs/protocol.md §9.4.1)."""
        if not self.uses_mimic_design(cohort):
            return self
        return replace(self, intervention_methods=("dense", "sae"), intervention_ks=(5,),
                       intervention_arms=("matched",), subset_seed=self.mimic_subset_seed)

    def draws(self, protocol: Protocol) -> int:
        return self.bootstrap_draws or protocol.inference.patient_draws

    def harmonization_bootstrap_seed(self, protocol: Protocol) -> int:
        """Seed of the harmonization patient bootstrap."""
        return protocol.inference.seed if self.harmonization_seed is None else self.harmonization_seed

    def intervention_bootstrap_seed(self, protocol: Protocol, cohort: str) -> int:
        """Seed of the intervention patient bootstrap: the published MIMIC run had its own (cohort: cohort.kind)."""
        seed = self.mimic_intervention_seed if cohort == "mimic" else self.intervention_seed
        return protocol.inference.seed if seed is None else seed
