"""The report's closing sections: the resolved protocol (run.yaml, credentials cut out) and the provenance of the
run (versions, hashes, cohort)."""

from __future__ import annotations

import html
import importlib.metadata
import json
import logging
import platform
from typing import Any

from raybench.analysis.api import Context, Section
from raybench.analysis.report.html import kv_table
from raybench.core.redaction import redact_config, redact_text

log = logging.getLogger(__name__)


def _protocol_body(ctx: Context) -> str:
    path = ctx.layout.run_yaml
    if not path.exists():
        return "<p>No run.yaml in this run folder: the resolved protocol was not recorded.</p>"
    text = redact_text(path.read_text())  # credentials in URIs stay in run.yaml (raybench.core.redaction)
    return f"<p>Resolved configuration (<code>run.yaml</code>):</p><pre>{html.escape(text)}</pre>"


def _provenance_body(ctx: Context) -> str:
    run = ctx.run or {}
    recorded = run.get("versions") if isinstance(run.get("versions"), dict) else {}
    rows: list[tuple[str, Any]] = []
    for pkg in ("raybench", "python", "ray", "torch"):
        if pkg in recorded:
            rows.append((f"{pkg} (recorded in run.yaml)", recorded[pkg]))
        else:
            rows.append((f"{pkg} (rendering environment)", _version(pkg)))
    rows += [(k, v) for k, v in sorted(recorded.items()) if k not in ("raybench", "python", "ray", "torch")]
    for key, value in sorted(_hashes(run).items()):
        rows.append((key, value))
    cells = ctx.tables.get("cells")
    if cells is not None and "config_hash" in cells:
        hashes = sorted(set(cells.config_hash.dropna().astype(str)))
        rows.append(("config_hash in cells table", ", ".join(hashes) if hashes else "–"))
    summary = ctx.layout.manifest_summary
    if summary.exists():
        try:
            for key, value in sorted(_hashes(json.loads(summary.read_text())).items()):
                rows.append((f"manifest summary {key}", value))
        except (json.JSONDecodeError, AttributeError) as err:
            log.warning("cannot read %s: %s", summary, err)
    for key in ("created", "finished", "started"):
        if key in run:
            rows.append((key, run[key]))
    rows.append(("cohort", ctx.cohort_kind or "unknown"))
    return kv_table([(k, redact_config(v)) for k, v in rows])


def _version(pkg: str) -> str:
    if pkg == "python":
        return platform.python_version()
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _hashes(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Every key that names a hash, searched through nested mappings."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            name = f"{prefix}{k}"
            if isinstance(v, dict):
                out.update(_hashes(v, name + "."))
            elif "hash" in str(k).lower() and not isinstance(v, list):
                out[name] = v
    return out


SECTIONS = (
    Section("protocol", "Protocol", body=_protocol_body),
    Section("provenance", "Provenance", body=_provenance_body),
)
