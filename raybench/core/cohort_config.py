"""The run config's cohort section: where records come from (docs/protocol.md §2).

Its own module so that core/config.py stays short; raybench.core.config re-exports CohortConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raybench.core.protocol import ConfigError, check_choices, check_positive

CohortKind = Literal["synth", "ptbxl", "mimic", "wfdb"]
"""Where records come from: synth (generated), ptbxl (PTB-XL, §2.1), mimic (MIMIC-IV-ECG, §2.3), wfdb (any folder
of 12-lead WFDB records, §2.7)."""
ConceptSource = Literal["auto", "tables", "waveform", "waveform49", "none"]
"""Which concepts a cohort carries: auto (feature tables if present, else waveform-derived; wfdb: waveform49), tables,
waveform (the seven waveform concepts), waveform49 (the 49-concept panel measured from the waveform, §4.4), none."""
ConceptExtractor = Literal["published", "refined"]
"""MIMIC waveform concept extractor: published (the protocol's code) or refined (raybench's) (§4.3)."""
RecordPool = Literal["published", "all"]
"""MIMIC record pool: published (ICD-linked, extraction ok, then ranked) or all (ranked) (§2.3)."""
RateConcept = Literal["heart_rate_bpm", "rr_mean_ms"]
"""MIMIC rate concept: heart_rate_bpm (60000 / RR, the published run's) or rr_mean_ms (raybench's) (§4.2)."""


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
    """Concept source. Published: tables for PTB-XL (PTB-XL+ features), waveform for MIMIC-IV-ECG (§3, §4).
    waveform49 (ptbxl, mimic, synth): the 49-concept panel measured from the waveform (§4.4); what auto means for
    wfdb (§2.7)."""
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
    patients_csv: str | None = None
    """wfdb only: a CSV mapping each record to its patient (columns record, patient_id; optional site, device,
    recording_date); a relative path is read under cohort.root (§2.7). None: patient ids from `patient_key`."""
    patient_key: str | None = None
    """wfdb only: the header comment key holding the patient id (`#Patient: 12`) when there is no CSV; None and
    no CSV: each record is its own patient, with a warning (§2.7)."""
    credentialed: bool = True
    """wfdb only: the records' identifiers must stay in the user's environment (aggregate-only export, failure
    text withheld); false for open data (§2.7). Other kinds: mimic is credentialed, ptbxl and synth are open."""

    def validate(self) -> None:
        check_choices(self, "cohort")
        if self.max_records is not None and self.max_records < 1:
            raise ConfigError(f"cohort.max_records must be >= 1 or null, got {self.max_records}")
        if self.kind != "synth" and not self.root:
            raise ConfigError(f"cohort.root is required for cohort.kind={self.kind!r}: the dataset folder")
        check_positive(self, "cohort", "records", "patients")
        if self.kind == "synth" and self.patients > self.records:
            raise ConfigError(f"cohort.patients ({self.patients}) must be <= cohort.records ({self.records}): "
                              "every synthetic patient has at least one record")
        if not 0.0 <= self.bad_fraction < 0.5:
            raise ConfigError(f"cohort.bad_fraction must be in [0, 0.5), got {self.bad_fraction}")
        if self.kind == "wfdb" and self.concepts == "tables":
            raise ConfigError("cohort.concepts: tables needs PTB-XL+ feature tables, which a wfdb cohort has none of; "
                              "use auto, waveform or none")
        wfdb_only = [k for k in ("patients_csv", "patient_key") if getattr(self, k) is not None]
        if self.kind != "wfdb" and (wfdb_only or not self.credentialed):
            raise ConfigError(f"cohort.{(wfdb_only or ['credentialed'])[0]} is a wfdb cohort setting; remove it or "
                              "set cohort.kind: wfdb")
