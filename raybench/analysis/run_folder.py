"""Is a run folder whole enough for the command about to read it? Checked first, before anything is written.

`report`, `analyze`, `features` and `export` read what earlier stages left: the cells table, the cell folders it
lists as ok, the analysis tables and report.html. A folder with one of them deleted or half-copied used to get
through (a report listing every cell as missing although they sat on disk, dashboards deleted on the way, an export
shipping an empty report) or end in a FileNotFoundError traceback deep inside a stage. `check_run_folder` compares
what the command needs with what is on disk and refuses with one line naming what is missing and the command that
rebuilds it; it reads and writes nothing else, so a refused command leaves the folder exactly as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout

ANALYZED_FILES = ("metrics.json", "patient_stats.npz")
"""What the analyze stage reads of every ok cell (tables, bootstraps)."""
WEIGHT_FILES = ("sae.safetensors", "cfg.json")
"""What dashboards and exports read of a cell: the SAE itself."""
CELL_FILES = (*ANALYZED_FILES, *WEIGHT_FILES)
CORE_TABLES = ("profiles",)
"""The analysis table the report's summary ranks models from (written by `raybench analyze`, with the others)."""
LISTED = 3  # missing items named in a refusal


class RunFolderError(RaybenchError, ValueError):
    """The run folder lacks what a command reads; the message names it and the command that rebuilds it."""


@dataclass(frozen=True)
class Needs:
    """What a command reads: the cells table's ok cells with `cell_files` on disk (only `models`' when given),
    the analysis `tables`, report.html."""

    cell_files: tuple[str, ...] = CELL_FILES
    tables: tuple[str, ...] = ()
    report: bool = False
    models: tuple[str, ...] | None = None


ANALYZE = Needs(cell_files=ANALYZED_FILES)
REPORT = Needs(tables=CORE_TABLES)
FEATURES = Needs(cell_files=(*WEIGHT_FILES, "metrics.json"))
EXPORT = Needs(cell_files=WEIGHT_FILES, tables=CORE_TABLES)
EXPORT_CELLS = Needs(cell_files=CELL_FILES)  # the card's intervals come from patient_stats.npz


def check_run_folder(run_dir: str | Path, command: str, needs: Needs) -> Path:
    """The run folder's root when it holds what `command` (e.g. "report") needs, else a RunFolderError."""
    root = Path(run_dir)
    if not root.is_dir():
        raise RunFolderError(f"--run-dir {run_dir} is not a folder: give the run folder written by `raybench grid`")
    layout = RunLayout.at(root)
    rerun = f"then `raybench {command} --run-dir {run_dir}` again"
    if not layout.cells_table.exists():
        raise RunFolderError(f"{layout.cells_table} is missing: `raybench train --run-dir {run_dir}` rewrites it "
                             f"from the cell folders (training only cells that are missing), {rerun}")
    gone = missing_cells(layout, needs)
    if gone:
        shown = ", ".join(gone[:LISTED]) + (f" and {len(gone) - LISTED} more" if len(gone) > LISTED else "")
        raise RunFolderError(f"{len(gone)} ok cell(s) of {layout.cells_table} are missing on disk or incomplete "
                             f"({shown}): `raybench train --run-dir {run_dir}` retrains them, "
                             f"then `raybench analyze --run-dir {run_dir}` rebuilds the tables and report")
    lacking = [t for t in needs.tables if not any((layout.tables_dir / f"{t}.{ext}").exists()
                                                   for ext in ("parquet", "csv"))]
    if lacking:
        raise RunFolderError(f"{layout.tables_dir} lacks the analysis table(s) {', '.join(lacking)}: "
                             f"`raybench analyze --run-dir {run_dir}` rebuilds them, {rerun}")
    if needs.report and not layout.report.exists():
        raise RunFolderError(f"{layout.report} is missing: `raybench report --run-dir {run_dir}` renders it, {rerun}")
    return root


def missing_cells(layout: RunLayout, needs: Needs) -> list[str]:
    """`cells/<id>/<file>` paths of ok cells in the cells table (of `needs.models`, if set) that are not on disk."""
    try:
        table = pd.read_parquet(layout.cells_table, columns=["cell_id", "model", "status", "cell_dir"])
    except (OSError, ValueError, KeyError) as err:
        raise RunFolderError(f"{layout.cells_table} is unreadable ({type(err).__name__}): `raybench train "
                             f"--run-dir {layout.root}` rewrites it from the cell folders") from err
    ok = table[table.status.astype(str) == "ok"]
    if needs.models is not None:
        ok = ok[ok.model.isin(needs.models)]
    out: list[str] = []
    for cell_id, cell_dir in zip(ok.cell_id.astype(str), ok.cell_dir, strict=True):
        rel = str(cell_dir) if isinstance(cell_dir, str) and cell_dir else f"cells/{cell_id}"
        absent = [f for f in needs.cell_files if not (layout.root / rel / f).is_file()]
        if absent:
            out.append(rel + ("/" if len(absent) == len(needs.cell_files) else f"/{absent[0]}"))
    return out
