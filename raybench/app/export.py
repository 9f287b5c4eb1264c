"""`raybench export --run-dir R --to DIR`: copy what may leave the environment, and nothing record-level.

A run folder mixes shareable results with record-level data (manifest/, activation stores with their
`*_ids.npy`, each cell's `patient_stats.npz`, harmonization caches, quarantine lists, the generated cohort,
Tune's trial logs and tracebacks). The export is an allow-list, so a new kind of file stays home until it
is added here on purpose:

    report.html                      the report (figures inlined; it links long tables' CSVs and dashboard images)
    tables/*.parquet|csv|json        aggregate tables, the release audit
    figures/*.png|svg                figures
    figures/dashboards/              feature dashboards (index.json, ECG strips of single test records): open
                                     cohorts only, never for a credentialed one (they are record-level)
    cells/<cell>/sae.safetensors     SAE weights and the cfg.json that makes them usable on their own
    cells/<cell>/cfg.json
    compare/<other run>/             `raybench compare` against another run: its report, tables and figures (aggregate)
    run.yaml                         the resolved config, any record-level field (`*_ids`, quarantine) removed and
                                     credentials cut out of every URI (raybench.core.redaction)
    EXPORT.json                      what was copied (path, bytes, sha256) and how much was left behind

Even an allow-listed file is refused if its name looks record-level (`*_ids*`, `*.npz`, quarantine,
manifest, patient_stats). The cohort kind comes from manifest/summary.json and run.yaml (credentialed if
either says so; refused if neither names one). For credentialed cohorts (raybench.core.privacy) every copied file
is then scanned for the cohort's record and subject ids (the full manifest's, plus quarantine and the dataset's
record_list.csv); a hit aborts the export, leaving nothing at DIR, and names the file - e.g. a run whose tables
predate the failure-text rules. When the manifest cannot be loaded (a partial copy of an s3:// run without
manifest/) the export is refused: a partial id set would pass the other records' ids. A compare/<run>/ folder
against a credentialed run is scanned for that run's ids (found where `raybench compare` recorded it), also in an
open run's export. A copied file holding the userinfo or query string of a URI in
run.yaml (a report rendered before redaction) is refused too. Every file report.html links (relative
src/href/data-src) must be in the export, or it is refused.
The export is written to a temporary folder beside DIR and renamed when complete.
"""

from __future__ import annotations

import fnmatch
import html
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from raybench.core.atomic import file_sha256
from raybench.core.errors import RaybenchError
from raybench.core.paths import RunLayout
from raybench.core.privacy import is_credentialed
from raybench.core.redaction import redact_config, redact_text, uri_secrets

ALLOW = ("report.html", "tables/*.parquet", "tables/*.csv", "tables/*.json", "figures/*.png", "figures/*.svg",
         "figures/dashboards/index.json", "cells/*/sae.safetensors", "cells/*/cfg.json",
         "compare/*/report.html", "compare/*/tables/*.parquet", "compare/*/tables/*.csv",
         "compare/*/figures/*.png", "compare/*/figures/*.svg")
# Record-level pictures (ECG strips of single records): copied for open cohorts only, never for credentialed ones.
CREDENTIALED_DENY = ("figures/dashboards/*",)
_REF = re.compile(r"""\b(?:src|href|data-src)\s*=\s*["']([^"'#]+)["']""")
# Refused even when allow-listed (case-insensitive, matched against the relative path).
DENY = ("*_ids*", "*.npz", "*.npy", "*quarantine*", "*manifest*", "*patient_stats*", "*record_list*",
        "*machine_measurements*")
RECORD_KEYS = re.compile(r"(^|_)(ids|ecg_ids|subject_ids|patient_ids|study_ids|records_list|quarantine)$")
_DATA_URI = re.compile(rb"data:[\w/+.-]+;base64,[A-Za-z0-9+/=]+")


class ExportError(RaybenchError, RuntimeError):
    """The export cannot be made safely; nothing was written to the destination."""


@dataclass
class ExportResult:
    dest: Path
    files: list[dict[str, Any]] = field(default_factory=list)
    left_behind: int = 0
    scanned_ids: int = 0


def export_run(run_dir: str | Path, dest: str | Path) -> ExportResult:
    """Copy the allow-listed artifacts of `run_dir` to `dest` (which must not exist, or be empty)."""
    layout = RunLayout.at(run_dir)
    src = layout.root.resolve()
    dest = Path(dest).expanduser().resolve()
    if not src.is_dir():
        raise ExportError(f"--run-dir {run_dir} is not a folder: give the run folder written by `raybench grid`")
    if dest == src or src in dest.parents:
        raise ExportError(f"--to {dest} is inside the run folder {src}: export to a folder outside it")
    if dest in src.parents:
        raise ExportError(f"--to {dest} contains the run folder {src}: export to a new, empty folder")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ExportError(f"--to {dest} exists and is not an empty folder: export to a new folder")
    raw = _read_yaml(layout.run_yaml)
    kind = cohort_kind(layout, raw)
    credentialed = is_credentialed(kind) and not (kind == "wfdb" and _declared_open(layout, raw))
    ids = _required_ids(layout, raw, kind) if credentialed else set()
    secrets = uri_secrets(layout.run_yaml.read_text()) if raw is not None else set()

    chosen, left = [], 0
    for path in sorted(p for p in src.rglob("*") if p.is_file() or p.is_symlink()):
        rel = path.relative_to(src).as_posix()
        if rel == "run.yaml":
            continue
        if path.is_symlink() or not _allowed(rel) or (credentialed and _matches(rel, CREDENTIALED_DENY)):
            left += 1
            continue
        chosen.append(rel)

    scans = {"": ids} if credentialed else {}  # path prefix -> the ids the files under it are scanned for
    scans.update(_compare_ids(src, chosen, ids))
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    result = ExportResult(dest=dest, left_behind=left)
    try:
        for rel in chosen:
            target = tmp / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src / rel, target)
        if raw is not None:
            (tmp / "run.yaml").write_text(_export_run_yaml(layout.run_yaml.read_text(), raw))
        dangling = [ref for ref in report_links(tmp / "report.html") if not (tmp / ref).is_file()]
        if dangling:
            raise ExportError(f"report.html links {len(dangling)} file(s) the export would not hold: "
                              f"{', '.join(dangling[:10])}. Re-render the report (`raybench report --run-dir "
                              f"{run_dir}`) so it links only shareable files, then export again")
        leaks = [rel for rel in _files(tmp) if secrets and _holds_any(tmp / rel, secrets)]
        if leaks:
            raise ExportError(
                f"{len(leaks)} file(s) that would be exported hold credentials from a URI in run.yaml (user:password@ "
                f"or a query string): {', '.join(leaks[:10])}. Re-render the report with this raybench version "
                f"(`raybench report --run-dir {run_dir}`: it drops them), then export again")
        if scans:
            result.scanned_ids = len(set().union(*scans.values()))
            hits = [rel for rel in _files(tmp)
                    if any(rel.startswith(prefix) and _holds_ids(tmp / rel, s) for prefix, s in scans.items())]
            if hits:
                raise ExportError(
                    f"{len(hits)} file(s) that would be exported hold record or subject ids of a credentialed "
                    f"cohort: {', '.join(hits[:10])}. Re-render them with this raybench version (failure text is "
                    "reduced to the exception type), or remove them from the run folder, then export again")
        result.files = [{"path": rel, "bytes": (tmp / rel).stat().st_size, "sha256": file_sha256(tmp / rel)}
                        for rel in _files(tmp)]
        manifest = {"source_run": src.name, "credentialed": credentialed, "files": result.files,
                    "left_behind": left, "allow": list(ALLOW) + ["run.yaml"],
                    "id_scan": {"ids": result.scanned_ids} if scans else None}
        (tmp / "EXPORT.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if dest.exists():
            dest.rmdir()
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return result


def _compare_ids(src: Path, chosen: list[str], own: set[bytes]) -> dict[str, set[bytes]]:
    """compare/<run>/ -> the ids its exported files are scanned for: those of each credentialed run it compares
    (found where `raybench compare` recorded it), also when this run is open. Refuses a comparison whose runs table,
    or credentialed run's manifest, cannot be read."""
    import pandas as pd

    from raybench.analysis.compare.cli import SOURCES

    out: dict[str, set[bytes]] = {}
    for folder in sorted({"/".join(rel.split("/")[:2]) for rel in chosen if rel.startswith("compare/")}):
        fix = f"re-run `raybench compare` where both runs lie, or remove {src / folder}, then export again"
        try:
            kinds = dict(pd.read_parquet(src / folder / "tables" / "runs.parquet",
                                         columns=["role", "cohort_kind"]).itertuples(index=False))
        except Exception as err:
            raise ExportError(f"{src / folder}/tables/runs.parquet is unreadable ({type(err).__name__}), so the export "
                              f"cannot tell whether {folder} compares a credentialed cohort: {fix}") from None
        roles = sorted(r for r, k in kinds.items() if is_credentialed(str(k)))
        try:
            sources = json.loads((src / folder / SOURCES).read_text()) if roles else {}
        except (OSError, ValueError, RecursionError):
            sources = {}
        scan: set[bytes] = set()
        for role in roles:
            path = sources.get(role) if isinstance(sources, dict) else None
            if not isinstance(path, str) or not Path(path).is_dir():
                raise ExportError(f"{folder} compares a run of the credentialed cohort {kinds[role]!r} (run "
                                  f"{role.upper()}) whose folder is not found, so its record ids cannot be scanned "
                                  f"for: {fix}")
            other = RunLayout.at(path)
            scan |= own if other.root.resolve() == src else _required_ids(other, _read_yaml(other.run_yaml),
                                                                           str(kinds[role]))
        if roles:
            out[f"{folder}/"] = scan
    return out


def cohort_kind(layout: RunLayout, raw: dict[str, Any] | None) -> str:
    """The run's cohort kind from manifest/summary.json (written with the record ids) and run.yaml; a credentialed
    kind wins when they disagree. Refuses when neither names one: a partial copy cannot be judged safe."""
    from raybench.core.run_state import run_section

    kinds = []
    if layout.manifest_summary.is_file():
        try:
            summary = json.loads(layout.manifest_summary.read_text())
        except json.JSONDecodeError as err:
            raise ExportError(f"{layout.manifest_summary} is unreadable ({err}): copy the run's manifest/ folder "
                              "again, then export") from None
        kinds.append(summary.get("cohort") if isinstance(summary, dict) else None)
    kinds.append((run_section(raw, "cohort") or {}).get("kind"))
    kinds = [str(k) for k in kinds if k]
    if not kinds:
        raise ExportError(f"{layout.root} has neither manifest/summary.json nor a run.yaml naming the cohort kind, "
                          "so the export cannot tell whether the cohort is credentialed: copy the whole run folder "
                          "(run.yaml and manifest/ included), then export again")
    return next((k for k in kinds if is_credentialed(k)), kinds[0])


def _declared_open(layout: RunLayout, raw: dict[str, Any] | None) -> bool:
    """A `wfdb` run is open data only when run.yaml says `cohort.credentialed: false` and the manifest's summary does
    not say otherwise (the stricter of the two wins)."""
    from raybench.core.run_state import run_section

    if (run_section(raw, "cohort") or {}).get("credentialed") is not False:
        return False
    try:
        summary = json.loads(layout.manifest_summary.read_text()) if layout.manifest_summary.is_file() else {}
    except json.JSONDecodeError:
        return False
    return not isinstance(summary, dict) or summary.get("credentialed") is not True


def _required_ids(layout: RunLayout, raw: dict[str, Any] | None, kind: str) -> set[bytes]:
    """The ids the export scans a credentialed run for: the full manifest's (plus quarantine and the dataset's record
    list). Refuses when the manifest cannot be loaded: a partial id set (e.g. a quarantine list of one id, from a
    partial copy of an s3:// run without manifest.parquet) would pass a table holding any other record's id."""
    fix = ("Copy the run's manifest/ folder too (inside the credentialed environment), then export again")
    if not layout.manifest.is_file():
        raise ExportError(f"{layout.root} is a run of the credentialed cohort {kind!r}, but {layout.manifest} is "
                          f"missing, so no record or subject ids can be loaded for the id scan. {fix}")
    try:
        ids = record_ids(layout, raw)
    except ExportError:
        raise
    except Exception as err:  # a damaged parquet file, a table without the id columns
        raise ExportError(f"{layout.manifest} of the credentialed cohort {kind!r} could not be read "
                          f"({type(err).__name__}), so its record ids cannot be scanned for. {fix}") from None
    if not ids:
        raise ExportError(f"{layout.root} is a run of the credentialed cohort {kind!r}, but no record or subject ids "
                          f"could be loaded from {layout.manifest}, so the id scan cannot check the export. {fix}")
    return ids


def record_ids(layout: RunLayout, raw: dict[str, Any] | None) -> set[bytes]:
    """Every record and subject id the run knows (manifest, quarantine, the dataset's record list), as bytes."""
    import pandas as pd

    ids: set[str] = set()

    def add(values) -> None:
        for v in values:
            s = str(v).strip()
            if s.endswith(".0") and s[:-2].isdigit():
                s = s[:-2]
            if s and s.lower() != "nan":
                ids.add(s)

    id_cols = ("ecg_id", "patient_id", "subject_id", "study_id")
    if layout.manifest.exists():
        import pyarrow.parquet as pq

        names = pq.read_schema(layout.manifest).names
        if not any(c in names for c in id_cols):
            raise ExportError(f"{layout.manifest} has none of the id columns {', '.join(id_cols)}")
        table = pq.read_table(layout.manifest, columns=[c for c in id_cols if c in names])
        for col in table.column_names:
            add(table.column(col).to_pylist())
    from raybench.core.run_state import run_section

    listings = [layout.quarantine]
    root = (run_section(raw, "cohort") or {}).get("root")
    if root:
        listings.append(Path(str(root)).expanduser() / "record_list.csv")
    for path in listings:
        if path.is_file():
            df = pd.read_csv(path, dtype=str)
            for col in id_cols:
                if col in df.columns:
                    add(df[col].dropna())
    return {s.encode() for s in ids}


def report_links(report: Path) -> list[str]:
    """The files report.html links relative to its folder (src, href, data-src; no fragments, data: URIs or
    absolute addresses): the long tables' CSVs and the dashboard images. Sorted, unique."""
    if not report.is_file():
        return []
    text = _DATA_URI.sub(b"", report.read_bytes()).decode("utf-8", errors="replace")
    refs = {html.unescape(m) for m in _REF.findall(text)}
    return sorted(r for r in refs if "://" not in r and not r.startswith(("/", "data:", "mailto:", "javascript:")))


def _matches(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(rel, pat) for pat in patterns)


def _allowed(rel: str) -> bool:
    low = rel.lower()
    return any(fnmatch.fnmatchcase(rel, pat) for pat in ALLOW) and \
        not any(fnmatch.fnmatchcase(low, pat) for pat in DENY)


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _texts(path: Path) -> list[bytes]:
    """The file's bytes without inline images (data: URIs), plus a parquet table's text (its pages may be
    compressed)."""
    texts = [_DATA_URI.sub(b"", path.read_bytes())]
    if path.suffix == ".parquet":
        import pandas as pd

        texts.append(pd.read_parquet(path).to_csv(index=False).encode())
    return texts


def _holds_any(path: Path, needles: set[bytes]) -> bool:
    """Whether the file (or a parquet table's text) holds one of `needles` anywhere."""
    return any(n in text for text in _texts(path) for n in needles)


def _holds_ids(path: Path, ids: set[bytes]) -> bool:
    """Whether the file (or a parquet table's text) holds one of `ids` as a whole digit run, or a non-numeric id
    as a whole word. Inline images (data: URIs) are skipped."""
    texts = _texts(path)
    numeric = {i for i in ids if i.isdigit()}
    words = ids - numeric
    runs = None
    if numeric:
        lengths = sorted({len(i) for i in numeric})
        runs = re.compile(rb"(?<!\d)\d{%d,%d}(?!\d)" % (lengths[0], lengths[-1]))
    for text in texts:
        if runs is not None and not numeric.isdisjoint(runs.findall(text)):
            return True
        if words and not words.isdisjoint(re.findall(rb"[\w.-]+", text)):
            return True
    return False


def _read_yaml(path: Path) -> dict[str, Any] | None:
    if not path.exists():
        return None
    raw = yaml.safe_load(path.read_text())
    return raw if isinstance(raw, dict) else None


def _scrub(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _scrub(v) for k, v in obj.items() if not RECORD_KEYS.search(str(k))}
    if isinstance(obj, list):
        return [_scrub(v) for v in obj]
    return obj


def _export_run_yaml(text: str, raw: dict[str, Any]) -> str:
    """run.yaml with record-level keys dropped (the resolved config holds none today; a recorded id list would)
    and credentials cut out of every URI (raybench.core.redaction)."""
    out = redact_config(_scrub(raw))
    header = [redact_text(ln) for ln in text.splitlines() if ln.startswith("#")]
    header.append("# exported by `raybench export`: record-level fields and URI credentials removed")
    return "\n".join(header) + "\n" + yaml.safe_dump(out, sort_keys=False)
