"""Release audit: is every cell the protocol asks for present and ok, and is every matched block whole?

A ranking is only comparable when each block (all models at one depth, E and seed) is complete, so
the audit names exactly what is missing or failed; failed cells stay in the denominator.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from raybench.analysis.completeness import KEY, cell_label, expected_cells, grid_q
from raybench.analysis.records import AUDIT_FILE
from raybench.core.atomic import write_json
from raybench.core.config import GridProtocol, Protocol, k_for, layer_for_depth
from raybench.core.paths import RunLayout

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class ArmAudit:
    """Counts and exact gaps of one arm (primary or sensitivity)."""

    arm: str
    expected_cells: int
    ok_cells: int
    expected_blocks: int
    complete_blocks: int
    missing: list[str] = field(default_factory=list)  # labels of grid points with no row
    failed: list[dict[str, str]] = field(default_factory=list)  # {cell, cell_id, reason}
    incomplete_blocks: list[dict[str, Any]] = field(default_factory=list)  # {block, missing, failed}

    @property
    def complete(self) -> bool:
        return self.ok_cells == self.expected_cells and self.complete_blocks == self.expected_blocks

    def line(self) -> str:
        return (f"{self.ok_cells}/{self.expected_cells} cells, {self.complete_blocks}/{self.expected_blocks} blocks"
                f" ({self.arm}; {len(self.missing)} missing, {len(self.failed)} failed)")


@dataclass(frozen=True)
class AuditResult:
    """The release audit. `passed` needs every expected cell ok, every block whole and no problems."""

    primary: ArmAudit
    sensitivity: ArmAudit | None
    problems: list[str] = field(default_factory=list)  # layer or k mismatch, two ok rows, unexpected rows
    notes: list[str] = field(default_factory=list)  # information only (e.g. retried cells with several rows)
    gate_pass: int = 0  # ok primary cells passing the validation fidelity gate (information only)

    @property
    def passed(self) -> bool:
        arms_ok = self.primary.complete and (self.sensitivity is None or self.sensitivity.complete)
        return arms_ok and not self.problems

    @property
    def summary(self) -> str:
        """E.g. "450/450 cells, 75/75 blocks; sensitivity arm 90/90 cells, 15/15 blocks: PASS"."""
        p = self.primary
        text = f"{p.ok_cells}/{p.expected_cells} cells, {p.complete_blocks}/{p.expected_blocks} blocks"
        if self.sensitivity is not None:
            s = self.sensitivity
            text += (f"; sensitivity arm {s.ok_cells}/{s.expected_cells} cells, "
                     f"{s.complete_blocks}/{s.expected_blocks} blocks")
        if self.problems:
            text += f"; {len(self.problems)} problem(s)"
        return text + (": PASS" if self.passed else ": INCOMPLETE")

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "summary": self.summary, "primary": asdict(self.primary),
                "sensitivity": None if self.sensitivity is None else asdict(self.sensitivity),
                "problems": list(self.problems), "notes": list(self.notes), "gate_pass": self.gate_pass}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> AuditResult:
        """The result `to_dict` wrote (tables/audit.json)."""
        return cls(primary=ArmAudit(**d["primary"]),
                   sensitivity=None if d.get("sensitivity") is None else ArmAudit(**d["sensitivity"]),
                   problems=list(d.get("problems", [])), notes=list(d.get("notes", [])),
                   gate_pass=int(d.get("gate_pass", 0)))


def audit_cells(cells: pd.DataFrame | None, protocol: Protocol) -> AuditResult:
    """Pure audit of a cells table against the protocol grid (no IO)."""
    grid = protocol.grid
    cells = _empty_cells() if cells is None else cells
    missing_cols = [c for c in (*KEY, "status", "layer", "n_layers") if c not in cells.columns]
    if missing_cols:
        raise ValueError(f"cells table lacks column(s) {missing_cols}; expected the tables/cells.parquet schema")
    problems: list[str] = []
    notes: list[str] = []
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in cells.to_dict("records"):
        key = (str(rec["model"]), grid_q(rec["q"]), int(rec["expansion"]), int(rec["seed"]), str(rec["arm"]))
        cid = str(rec.get("cell_id", cell_label(*key)))
        if key in rows:  # a retried cell may have several rows: an ok one wins, two ok rows are a conflict
            if _is_ok(rows[key]) and _is_ok(rec):
                problems.append(f"two ok rows for {cell_label(*key)} (cell_ids {rows[key]['cell_id']}, {cid})")
            else:
                notes.append(f"{cell_label(*key)} has several rows (statuses: {rows[key]['status']}; "
                             f"{rec['status']}); an ok one counts")
            if _is_ok(rows[key]) or not _is_ok(rec):
                continue
        rows[key] = {**rec, "cell_id": cid}
        problems += _realization_problems(key, rec, cid, protocol)
    expected = expected_cells(grid)
    unexpected = sorted(set(rows) - set(expected))
    problems += [f"unexpected cell {rows[k]['cell_id']} ({cell_label(*k)}) is not in the protocol grid"
                 for k in unexpected]
    primary = _arm_audit("primary", [k for k in expected if k[4] == "primary"], rows, grid)
    sens = None
    if grid.sensitivity_depth is not None:
        sens = _arm_audit("sensitivity", [k for k in expected if k[4] == "sensitivity"], rows, grid)
    gate = 0
    if "gate_pass" in cells.columns:
        gate = sum(1 for k in expected if k[4] == "primary" and k in rows and _is_ok(rows[k])
                   and _finite(rows[k].get("gate_pass")) and bool(rows[k]["gate_pass"]))
    return AuditResult(primary=primary, sensitivity=sens, problems=problems, notes=notes, gate_pass=gate)


def release_audit(root: str | Path, protocol: Protocol) -> AuditResult:
    """Audit `root`/tables/cells.parquet against `protocol` and write tables/audit.json.

    Secondary analyses recorded as failed (tables/secondary_failures.json) are problems: the audit fails."""
    layout = RunLayout.at(root)
    if layout.cells_table.exists():
        cells = pd.read_parquet(layout.cells_table)
    else:
        log.warning("no cells table at %s: every expected cell counts as missing", layout.cells_table)
        cells = None
    result = audit_cells(cells, protocol)
    secondary = secondary_problems(root)
    if secondary:  # a failed secondary analysis is a hole in the release too
        result = replace(result, problems=[*result.problems, *secondary])
    write_json(layout.tables_dir / AUDIT_FILE, result.to_dict())
    return result


def secondary_problems(root: str | Path) -> list[str]:
    """One problem per secondary analysis recorded as failed (tables/secondary_failures.json), or one for an
    unreadable record; [] when none failed or the secondary analyses never ran."""
    from raybench.analysis.records import read_failures

    try:
        failures = read_failures(root)
    except ValueError as err:
        return [str(err)]
    return [f"secondary analysis {f.get('analysis')} failed ({f.get('reason')}); its tables and figures are "
            "missing: fix the cause and rerun raybench analyze" for f in failures]



# ---------------------------------------------------------------- helpers

def _arm_audit(arm: str, keys: list[tuple], rows: dict[tuple, dict[str, Any]], grid: GridProtocol) -> ArmAudit:
    missing, failed = [], []
    blocks: dict[tuple, dict[str, list]] = {}
    for key in keys:
        block = blocks.setdefault(key[1:4], {"missing": [], "failed": []})
        row = rows.get(key)
        if row is None:
            missing.append(cell_label(*key))
            block["missing"].append(key[0])
        elif not _is_ok(row):
            reason = _reason(row["status"])
            failed.append({"cell": cell_label(*key), "cell_id": row["cell_id"], "reason": reason})
            block["failed"].append(key[0])
    incomplete = [{"block": f"q{q:.2f}/E{e}/s{s}", "missing": b["missing"], "failed": b["failed"]}
                  for (q, e, s), b in blocks.items() if b["missing"] or b["failed"]]
    return ArmAudit(arm=arm, expected_cells=len(keys), ok_cells=len(keys) - len(missing) - len(failed),
                    expected_blocks=len(blocks), complete_blocks=len(blocks) - len(incomplete),
                    missing=missing, failed=failed, incomplete_blocks=incomplete)


def _realization_problems(key: tuple, rec: dict[str, Any], cid: str, protocol: Protocol) -> list[str]:
    """Depth q must realize as layer_for_depth(q, n_layers); k must follow the arm's k rule."""
    out = []
    n_layers, layer = rec.get("n_layers"), rec.get("layer")
    if _finite(n_layers) and _finite(layer):
        want = layer_for_depth(key[1], int(n_layers))
        if int(layer) != want:
            out.append(f"{cid}: depth q={key[1]:g} with {int(n_layers)} layers must realize as layer {want}, "
                       f"table has layer {int(layer)}")
    n_lat, k = rec.get("n_latents"), rec.get("k")
    if _finite(n_lat) and _finite(k) and key[2] > 0 and key[4] in ("primary", "sensitivity"):
        d = int(n_lat) // key[2]
        want_k = k_for(d, int(n_lat), key[4], protocol.sae, protocol.grid)
        if int(k) != want_k:
            out.append(f"{cid}: {key[4]} arm with N={int(n_lat)} (d={d}) needs k={want_k}, table has k={int(k)}")
    return out


def _is_ok(row: dict[str, Any]) -> bool:
    return str(row.get("status", "")).strip() == "ok"


def _reason(status: Any) -> str:
    text = str(status).strip()
    head, sep, tail = text.partition(":")
    return tail.strip() if sep and head.strip() == "failed" else text or "no status"


def _finite(v: Any) -> bool:
    try:
        return v is not None and pd.notna(v)
    except (TypeError, ValueError):
        return False



def _empty_cells() -> pd.DataFrame:
    return pd.DataFrame({c: [] for c in (*KEY, "status", "layer", "n_layers", "cell_id")})
