"""The records an analyze run leaves beside its tables: the release audit's verdict (tables/audit.json) and the
secondary analyses that failed (tables/secondary_failures.json, {"failures": [{"analysis", "type", "reason"}]},
sorted by analysis). The report, the release audit and the secondary analyses read and write them here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from raybench.core.config import RunConfig
from raybench.core.paths import RunLayout

AUDIT_FILE = "audit.json"
FAILURES_FILE = "secondary_failures.json"  # in tables/, beside audit.json
REASON_LIMIT = 300


def read_audit(root: str | Path) -> dict[str, Any] | None:
    """The last written audit (tables/audit.json) or None."""
    path = RunLayout.at(root).tables_dir / AUDIT_FILE
    return json.loads(path.read_text()) if path.exists() else None


def failure_text(err: BaseException, cfg: RunConfig | None = None) -> str:
    """The one place failure text is made before it is logged or persisted (tables/secondary_failures.json,
    then audit.json and report.html): `Type: last line of the message`, cut to REASON_LIMIT characters.

    `cfg` is the run's config: for credentialed cohorts (raybench.core.privacy) only the exception type and a count
    of identifier-like values are kept, never the message.
    """
    from raybench.core.privacy import failure_text as persistable_text
    from raybench.core.privacy import is_credentialed

    if cfg is not None and is_credentialed(cfg):
        return persistable_text(err, True)
    message = str(err).strip()
    last = message.splitlines()[-1].strip() if message else ""
    return f"{type(err).__name__}: {last}"[:REASON_LIMIT] if last else type(err).__name__


def failure_record(name: str, err: BaseException, cfg: RunConfig | None = None) -> dict[str, str]:
    return {"analysis": name, "type": type(err).__name__, "reason": failure_text(err, cfg)}


def failures_path(root: str | Path) -> Path:

    return RunLayout.at(root).tables_dir / FAILURES_FILE


def read_failures(root: str | Path) -> list[dict[str, Any]]:
    """The recorded failures of the last secondary run ([] when none, or no record)."""
    path = failures_path(root)
    if not path.exists():
        return []
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} is unreadable ({err}); rerun the secondary analyses (raybench analyze)") from None
    failures = raw.get("failures") if isinstance(raw, dict) else None
    if not isinstance(failures, list) or not all(isinstance(f, dict) for f in failures):
        raise ValueError(f"{path} has no list of failures; rerun the secondary analyses (raybench analyze)")
    return failures


def write_failures(root: str | Path, failures: list[dict[str, str]]) -> None:
    from raybench.core.atomic import write_json

    write_json(failures_path(root), {"failures": failures})
