"""Secondary analyses of the paper's appendices (docs/protocol.md §9), run on a finished grid:

- calibration ladder at E = protocol.eval.calibration_expansion (`calibration.py`),
- input-harmonization audit at the final layer (`harmonization.py`),
- matched-effect intervention selectivity at the final layer (`intervention.py`),

driven by `run.run_secondary(root, protocol, cfg)`, which the analyze stage calls (raybench.analysis.stage).
Tables go to tables/{calibration,harmonization,intervention}*.parquet (+ .csv) and figures to figures/ with the
same prefixes, so the report picks them up. This module holds what the three share: their settings and the
run-folder look-ups.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raybench.core.config import Protocol

log = logging.getLogger(__name__)

ANALYSES = ("calibration", "harmonization", "intervention")


@dataclass(frozen=True)
class SecondaryConfig:
    """Settings of the secondary analyses that raybench.core.config does not hold (protocol defaults).

    None for draws / seeds means "take protocol.inference's" so the secondary bootstraps reuse the run's
    patient draws (raybench's rule, the demo preset). The defaults are the published scripts' own bootstrap
    seeds, one per analysis (docs/protocol.md §9.5); this class is their one owner.
    """

    analyses: tuple[str, ...] = ANALYSES
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
    rotation_seed: int = 20260720  # the random rotation of model i (sorted models) uses rotation_seed + i
    high_quantile: float = 0.75
    effect_cap: float = 0.25
    effect_floor: float = 0.05
    max_dose: float = 1.0
    candidate_subsets: int = 20
    subset_seed: int = 960000
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
        unknown = [a for a in self.analyses if a not in ANALYSES]
        if unknown:
            raise ValueError(f"unknown secondary analyses {unknown}; choose from {ANALYSES}")
        bad = [p for p in self.harmonization_protocols if p not in ("native", "lead", "temporal", "joint")]
        if bad or "native" not in self.harmonization_protocols:
            raise ValueError(f"harmonization_protocols must include native and only use native/lead/temporal/joint, "
                             f"got {list(self.harmonization_protocols)}")
        if self.ridge_alpha <= 0 or any(a <= 0 for a in self.readout_alphas):
            raise ValueError("ridge alphas must be > 0")
        if self.random_dictionaries < 1 or self.candidate_subsets < 1 or min(self.intervention_ks, default=0) < 1:
            raise ValueError("random_dictionaries, candidate_subsets and intervention_ks must be >= 1")
        methods = ("dense", "pca", "sae", "random_rotation")
        if not {"dense", "sae"} <= set(self.intervention_methods) or \
                tuple(m for m in methods if m in self.intervention_methods) != self.intervention_methods:
            raise ValueError(f"intervention_methods must hold dense and sae, in the order {methods}, "
                             f"got {list(self.intervention_methods)}")
        if not self.intervention_arms or not set(self.intervention_arms) <= {"matched", "full"}:
            raise ValueError(f"intervention_arms must be matched and/or full, got {list(self.intervention_arms)}")
        if not 0 < self.effect_floor <= self.effect_cap or self.max_dose <= 0:
            raise ValueError("need 0 < effect_floor <= effect_cap and max_dose > 0")
        for name in ("harmonization_train_records", "harmonization_test_patients"):
            if getattr(self, name) is not None and getattr(self, name) < 2:
                raise ValueError(f"{name} must be None or >= 2, got {getattr(self, name)}")
        if self.bootstrap_draws is not None and self.bootstrap_draws < 1:
            raise ValueError("bootstrap_draws must be >= 1")
        return self

    @classmethod
    def demo(cls) -> SecondaryConfig:
        """Laptop-sized: re-encoding is the only costly part, so only its record counts shrink. The secondary
        bootstraps reuse the run's patient draws (protocol.inference.seed), the ladder and interventions the
        atlas's selection subset, and the interventions compare SAE and dense coordinates only (k = 5, subsets
        of d latents): raybench's rules."""
        return cls(harmonization_train_records=96, harmonization_test_patients=32, harmonization_seed=None,
                   intervention_seed=None, mimic_intervention_seed=None, complete_case_train=False,
                   intervention_ks=(5,), intervention_methods=("dense", "sae"), intervention_arms=("matched",))

    def draws(self, protocol: Protocol) -> int:
        return self.bootstrap_draws or protocol.inference.patient_draws

    def harmonization_bootstrap_seed(self, protocol: Protocol) -> int:
        """Seed of the harmonization patient bootstrap."""
        return protocol.inference.seed if self.harmonization_seed is None else self.harmonization_seed

    def intervention_bootstrap_seed(self, protocol: Protocol, cohort: str) -> int:
        """Seed of the intervention patient bootstrap: the published MIMIC run had its own (cohort: cohort.kind)."""
        seed = self.mimic_intervention_seed if cohort == "mimic" else self.intervention_seed
        return protocol.inference.seed if seed is None else seed


def calibration_cells(root: str | Path, protocol: Protocol, expansion: int | None = None) -> pd.DataFrame:
    """Primary-arm cells at the calibration expansion with status ok (model, q, layer, n_layers, seed, cell_dir)."""
    from raybench.core.paths import RunLayout

    layout = RunLayout.at(root)
    if not layout.cells_table.exists():
        raise FileNotFoundError(f"{layout.cells_table} not found: run the grid (raybench grid / train) first")
    e = protocol.eval.calibration_expansion if expansion is None else expansion
    cells = pd.read_parquet(layout.cells_table)
    keep = (cells["arm"] == "primary") & (cells["expansion"] == e) & (cells["status"] == "ok")
    keep &= cells["model"].isin(protocol.grid.models)
    out = cells.loc[keep, ["model", "q", "layer", "n_layers", "seed", "n_latents", "k", "cell_dir"]].copy()
    out["cell_dir"] = [str(layout.root / p) for p in out["cell_dir"]]
    return out.sort_values(["model", "q", "seed"], kind="stable").reset_index(drop=True)
