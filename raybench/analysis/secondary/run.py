"""Run-level driver of the secondary analyses: calibration ladder, input harmonization, intervention.

    run_secondary(root, protocol, cfg) -> {table name: DataFrame}

Needs a finished grid (manifest, activation stores, tables/cells.parquet with the E = 8 primary cells).
Each analysis fans out as Ray tasks (per model x depth, per model); an analysis whose inputs are missing
is skipped with a logged note, and one that fails is left out without losing the others.
Writes tables/{calibration,harmonization,intervention}*.parquet (+ .csv) and figures/ with the same prefixes.

Before an analysis runs, its tables and figures from an earlier run are deleted, so a failed (or skipped)
analysis leaves nothing stale behind for the report to show. Failures are recorded in
tables/secondary_failures.json ({"failures": [{"analysis", "type", "reason"}]}, sorted by analysis); the
report lists them and the release audit counts each as a problem (raybench.analysis.release_audit.run).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pandas as pd

from raybench.analysis.records import failure_record, read_failures, write_failures
from raybench.analysis.secondary import SecondaryConfig
from raybench.core.config import Protocol, RunConfig

log = logging.getLogger(__name__)

TABLE_SUFFIXES = (".parquet", ".csv")
FIGURE_SUFFIXES = (".png", ".svg")


def run_secondary(root: str | Path, protocol: Protocol, cfg: RunConfig, scfg: SecondaryConfig | None = None,
                  *, strict: bool = False) -> dict[str, pd.DataFrame]:
    """Run every analysis in scfg.analyses (default: the run config's `secondary` section, else
    SecondaryConfig.demo() for the demo protocol, else the paper settings).
    strict=True re-raises the first failure (tests, debugging); it is recorded either way."""
    from raybench.analysis.secondary.calibration import run_calibration
    from raybench.analysis.secondary.harmonization import run_harmonization
    from raybench.analysis.secondary.intervention import run_intervention
    from raybench.infra.ray_session import init_ray

    if scfg is None:
        scfg = cfg.secondary if cfg.secondary is not None else (
            SecondaryConfig.demo() if protocol.name == "demo" else SecondaryConfig())
    scfg.validate()
    from raybench.analysis.inference.randomness import write_secondary_randomness

    write_secondary_randomness(root, protocol, scfg, cfg.cohort.kind)  # randomness/secondary.json: the seeds below
    init_ray(cfg.resources)
    steps = {
        "calibration": lambda: run_calibration(root, protocol, scfg),
        "harmonization": lambda: run_harmonization(root, protocol, cfg, scfg),
        "intervention": lambda: run_intervention(root, protocol, scfg, cfg.cohort.kind),
    }
    out: dict[str, pd.DataFrame] = {}
    # failures of analyses not run this time stay on record (their old outputs were not touched either)
    try:
        previous = read_failures(root)
    except ValueError as err:
        log.warning("%s; it is rewritten now", err)
        previous = []
    failures = {str(f.get("analysis")): f for f in previous if f.get("analysis") not in scfg.analyses}
    try:
        for name in scfg.analyses:
            t0 = time.perf_counter()
            remove_outputs(root, name)
            try:
                tables = steps[name]()
            except Exception as err:  # one analysis failing must not lose the others
                failures[name] = failure_record(name, err, cfg)
                remove_outputs(root, name)  # nothing half-written from the failed attempt either
                if strict:
                    raise
                log.error("secondary analysis %s failed: %s", name, failures[name]["reason"])
                continue
            out.update(tables)
            log.info("secondary analysis %s: %d tables in %.1fs", name, len(tables), time.perf_counter() - t0)
    finally:
        write_failures(root, [failures[k] for k in sorted(failures)])
    return out


# ---------------------------------------------------------------- stale outputs

def outputs(root: str | Path, name: str) -> list[Path]:
    """The tables and figures analysis `name` writes (tables/<name>*.parquet|csv, figures/<name>*.png|svg);
    the same prefixes the report's sections show."""
    from raybench.core.paths import RunLayout

    layout = RunLayout.at(root)
    found = []
    for folder, suffixes in ((layout.tables_dir, TABLE_SUFFIXES), (layout.figures_dir, FIGURE_SUFFIXES)):
        if folder.is_dir():
            found += [p for p in sorted(folder.glob(f"{name}*")) if p.suffix in suffixes and p.is_file()]
    return found


def remove_outputs(root: str | Path, name: str) -> None:
    for path in outputs(root, name):
        path.unlink()
