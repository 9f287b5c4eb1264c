"""The cohort and manifest stages of `raybench grid` (see raybench.infra.stage for the contract).

cohort: writes the synthetic cohort into the run folder, or checks that an external PTB-XL / MIMIC-IV-ECG
folder (or, for `wfdb`, any folder of records) is there. manifest: validates every record, attaches concepts
and splits by patient.
"""

from __future__ import annotations

from pathlib import Path

from raybench.core.config import RunConfig
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout
from raybench.infra.stage import Stage

# the table an external cohort folder must hold, per cohort.kind
COHORT_INDEX = {"ptbxl": "ptbxl_database.csv", "mimic": "record_list.csv"}


class CohortError(RaybenchError, ValueError):
    """The configured cohort folder is missing or is not the dataset it claims to be."""


def cohort_root(cfg: RunConfig) -> Path:
    """The folder the manifest is built from: the run's synthetic cohort, else cohort.root."""
    if cfg.cohort.kind == "synth":
        return RunLayout.at(cfg.run_dir).cohort_dir
    return Path(cfg.cohort.root).expanduser()


def check_cohort(cfg: RunConfig) -> None:
    """An external cohort's folder and index table exist (the synthetic one is written by the stage)."""
    if cfg.cohort.kind == "wfdb":  # any folder of records: the manifest finds them (and refuses an empty one)
        if not cohort_root(cfg).is_dir():
            raise CohortError(f"cohort.root {cohort_root(cfg)} is not a folder: set cohort.root to the folder that "
                              "holds the WFDB records (.hea with .dat or .mat, at any depth)")
        return
    index = COHORT_INDEX.get(cfg.cohort.kind)
    if index is None:
        return
    root = cohort_root(cfg)
    if not root.is_dir():
        raise CohortError(f"cohort.root {root} is not a folder: set cohort.root to the {cfg.cohort.kind} dataset "
                          f"folder (the one holding {index})")
    if not (root / index).exists():
        raise CohortError(f"{root / index} not found: set cohort.root to the {cfg.cohort.kind} dataset folder "
                          f"that holds {index}")


def write_synth_cohort(out: Path, records: int, patients: int, seed: int, bad_fraction: float,
                       layout: str = "ptbxl") -> Path:
    """`raybench cohort synth`: the synthetic cohort in `out` (layout ptbxl, or challenge: a `wfdb` folder); a folder
    that is not ours to replace is a CohortError."""
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.cohorts.synth_challenge import generate_challenge_cohort

    write = generate_challenge_cohort if layout == "challenge" else generate_synth_cohort
    try:
        return write(out, records, patients, seed, bad_fraction)
    except FileExistsError as err:
        raise CohortError(str(err)) from None


def cohort_complete(cfg: RunConfig) -> bool:
    if cfg.cohort.kind == "wfdb":
        return cohort_root(cfg).is_dir()
    if cfg.cohort.kind != "synth":
        return (cohort_root(cfg) / COHORT_INDEX[cfg.cohort.kind]).exists()
    return (RunLayout.at(cfg.run_dir).cohort_dir / "ptbxl_database.csv").exists()


def cohort_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.cohorts.synth import generate_synth_cohort

    check_cohort(cfg)
    c = cfg.cohort
    if c.kind != "synth":
        return f"{c.kind} folder {cohort_root(cfg)}"
    out = RunLayout.at(cfg.run_dir).cohort_dir
    generate_synth_cohort(out, n_records=c.records, n_patients=c.patients, seed=c.seed, bad_fraction=c.bad_fraction)
    return f"{c.records} synthetic records, {c.patients} patients"


def manifest_complete(cfg: RunConfig) -> bool:
    layout = RunLayout.at(cfg.run_dir)
    return layout.manifest.exists() and layout.manifest_summary.exists()


def manifest_run(cfg: RunConfig, remote: str | None = None) -> str:
    from raybench.cohorts.manifest import load_manifest
    from raybench.cohorts.ptbxl import build_ptbxl_manifest

    layout = RunLayout.at(cfg.run_dir)
    if cfg.cohort.kind == "mimic":
        from raybench.cohorts.mimic import build_mimic_manifest

        c = cfg.cohort
        build_mimic_manifest(Path(c.root), layout.manifest_dir, max_records=c.max_records,
                             concept_extractor=c.concept_extractor, record_pool=c.record_pool, admissions=c.admissions,
                             rate_concept=c.rate_concept, concepts=c.concepts)
    elif cfg.cohort.kind == "wfdb":
        from raybench.cohorts.wfdb_cohort import build_wfdb_manifest

        c = cfg.cohort
        build_wfdb_manifest(cohort_root(cfg), layout.manifest_dir, patients_csv=c.patients_csv,
                            patient_key=c.patient_key, concepts=c.concepts, credentialed=c.credentialed)
    else:
        build_ptbxl_manifest(cohort_root(cfg), layout.manifest_dir, sampling_rate=cfg.cohort.sampling_rate,
                             concepts=cfg.cohort.concepts)
    df, info = load_manifest(layout.manifest)
    counts = df["split"].value_counts().to_dict()
    return (f"{len(df)} records ({counts.get('train', 0)}/{counts.get('val', 0)}/{counts.get('test', 0)}), "
            f"{len(info.concepts)} concepts")


COHORT_STAGE = Stage("cohort", inputs=(), is_complete=cohort_complete, run=cohort_run, check=check_cohort)
MANIFEST_STAGE = Stage("manifest", inputs=("cohort_dir",), is_complete=manifest_complete, run=manifest_run,
                       check=check_cohort)
