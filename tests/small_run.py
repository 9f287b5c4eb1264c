"""Build a small but real encoded run folder (synthetic cohort -> manifest -> demo-encoder activations)."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from raybench.core.config import (
    CohortConfig,
    EncoderConfig,
    GridProtocol,
    ReliabilityConfig,
    RunConfig,
    demo_protocol,
)
from raybench.core.paths import RunLayout


def small_config(run_dir: Path, models: tuple[str, ...] = ("ecg_fm", "csfm"), steps: int = 40) -> RunConfig:
    """2 models x 2 depths x 2 E x 2 seeds (+ a 2 x 2 x 2 sensitivity arm at depth 1): 24 cells."""
    p = demo_protocol()
    p = replace(p, sae=replace(p.sae, steps=steps, batch_size=64, checkpoint_every=20),
                grid=GridProtocol(models=models, depths=(0.0, 1.0), expansions=(1, 8), seeds=(4311, 4312),
                                  sensitivity_depth=1.0),
                inference=replace(p.inference, patient_draws=200, crossed_draws=400, chunk_draws=100))
    return RunConfig(run_dir=str(run_dir), protocol=p,
                     cohort=CohortConfig(kind="synth", records=120, patients=48, seed=5),
                     encoders=EncoderConfig(size="demo", batch_size=32, num_gpus=0.0)).validate()  # CPU path


def build_encoded_run(cfg: RunConfig) -> RunConfig:
    """Cohort, manifest and activation stores for every model of cfg (reuses what exists)."""
    from raybench.cohorts.ptbxl import build_synth_manifest
    from raybench.cohorts.synth import generate_synth_cohort
    from raybench.core.config import audited_depths
    from raybench.encoders.base import EncoderSpec
    from raybench.encoders.extract import extract_models

    layout = RunLayout.at(cfg.run_dir)
    if not (layout.cohort_dir / "ptbxl_database.csv").exists():
        generate_synth_cohort(layout.cohort_dir, cfg.cohort.records, cfg.cohort.patients, cfg.cohort.seed)
    if not layout.manifest.exists():
        build_synth_manifest(layout.cohort_dir, layout.manifest_dir)
    # every model through one pipeline, as the encode stage does
    extract_models(layout.manifest, layout.root, [EncoderSpec(name=m, size="demo") for m in cfg.protocol.grid.models],
                   cfg.encoders, progress=False, depths=audited_depths(cfg.protocol))
    return cfg


# the reliability audit at the smallest size that still exercises every part
SMALL_RELIABILITY = ReliabilityConfig(reseeds=2, sample_points=1, fractions=(0.0, 0.5, 1.0), panel_steps=(10, 60),
                                      panel_expansions=(1,), panel_ks=(8,))


def finished_config(run_dir: Path) -> RunConfig:
    """The config of the session's one finished run (conftest `finished_small_run`): small_config, one trial per
    model, a drawn selection subset (40 records, so evaluation reseeds differ) and the small reliability audit."""
    cfg = small_config(run_dir)
    proto = replace(cfg.protocol, eval=replace(cfg.protocol.eval, selection_records=40))
    # trials reuse finished trials' processes, as `auto` does in a local instance raybench starts (the session's
    # Ray is started by conftest, where `auto` does not): 4 trials in 2 processes; speed only, outside config_hash
    resources = replace(cfg.resources, trial_unit="model", reuse_trial_processes=True)
    return replace(cfg, protocol=proto, resources=resources, reliability=SMALL_RELIABILITY)


def copy_run(cfg: RunConfig, dest: Path) -> RunConfig:
    """A copy of a run folder (files and mtimes) at `dest`, and its config pointing there: for tests that change
    a run, so the shared one stays as built."""
    shutil.copytree(cfg.run_dir, dest)
    return replace(cfg, run_dir=str(dest))
