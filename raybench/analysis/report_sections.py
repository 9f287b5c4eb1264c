"""The report's sections as data: each names the figure and table stems it shows (glob patterns) and may add
a body of custom HTML (the bodies of the base sections are here; paper_report.py registers the paper
analyses' sections). Optional sections (secondary analyses) render only when one of their artifacts exists;
figures or tables that no section claims land in OTHER ("Other results"), so nothing written is left out.
"""

from __future__ import annotations

import fnmatch
import html
import importlib.metadata
import json
import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from raybench.analysis.audit import run_section
from raybench.analysis.plotting import METRICS, metric_label, model_label
from raybench.analysis.report_html import LARGE_TABLE_ROWS, df_html, kv_table, table_block
from raybench.paths import RunLayout
from raybench.redaction import redact_config, redact_text

log = logging.getLogger(__name__)


@dataclass
class Context:
    """Everything a section renderer may read; built once per render."""

    layout: RunLayout
    tables: dict[str, pd.DataFrame]
    figures: dict[str, Path]  # stem -> PNG path
    run: dict[str, Any] | None
    audit: dict[str, Any] | None
    claimed_tables: set[str] = field(default_factory=set)
    claimed_figures: set[str] = field(default_factory=set)
    failures: dict[str, str] = field(default_factory=dict)  # failed secondary analysis -> reason

    @property
    def cohort_kind(self) -> str | None:
        cohort = run_section(self.run, "cohort")
        return None if cohort is None else str(cohort.get("kind"))

    def match_tables(self, patterns: tuple[str, ...]) -> list[str]:
        return _match(sorted(self.tables), patterns)

    def match_figures(self, patterns: tuple[str, ...]) -> list[str]:
        return _match(sorted(self.figures), patterns)


@dataclass(frozen=True)
class Section:
    """A report section. `figures`/`tables` are glob patterns over stems; `body` adds custom HTML first."""

    id: str
    title: str
    intro: str = ""
    figures: tuple[str, ...] = ()
    tables: tuple[str, ...] = ()
    optional: bool = False  # omitted entirely unless some figure or table matches
    body: Callable[[Context], str] | None = None
    claims: tuple[str, ...] = ()  # tables shown by `body` (kept out of "Other results")
    needs: tuple[str, ...] = ()  # tables `body` reads; without them the section says what is missing


SECTIONS: list[Section] = []


def register_section(section: Section, before: str | None = None) -> None:
    """Add (or replace, by id) a report section; `before` names the section it goes in front of."""
    SECTIONS[:] = [s for s in SECTIONS if s.id != section.id]
    ids = [s.id for s in SECTIONS]
    SECTIONS.insert(ids.index(before) if before in ids else len(SECTIONS), section)


def _summary_body(ctx: Context) -> str:
    out = [_audit_badge(ctx.audit)]
    if ctx.failures:
        out.append(f"<p class='badge bad'>Secondary analyses failed ({len(ctx.failures)}):</p><ul>" + "".join(
            f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>" for name, reason in ctx.failures.items())
            + "</ul>")
    prof = ctx.tables.get("profiles")
    if prof is not None and not prof.empty:
        items = []
        for metric in [m for m in METRICS if (prof.metric == m).any()]:
            best = prof[prof.metric == metric].sort_values(["auc", "model"], ascending=[False, True]).iloc[0]
            items.append(f"<li>{html.escape(metric_label(metric))}: best <b>{html.escape(model_label(best.model))}"
                         f"</b> (AUC {best.auc:.3f}, 95% CI {best.ci_low:.3f}–{best.ci_high:.3f}"
                         + (f", P(rank 1) {best.rank1_prob:.2f}" if pd.notna(best.get("rank1_prob")) else "")
                         + ")</li>")
        out.append("<ul>" + "".join(items) + "</ul>")
    cells = ctx.tables.get("cells")
    if cells is not None and not cells.empty:
        ok = cells[cells.status == "ok"]
        gate = int(ok.gate_pass.astype("boolean").fillna(False).astype(bool).sum()) if "gate_pass" in ok else 0
        out.append(f"<p>{len(cells)} cell rows ({len(ok)} ok); {gate} of the ok cells pass the validation "
                   f"fidelity gate (R² ≥ .90 and dead fraction &lt; .20).</p>")
    from raybench.analysis.paper_report import gate_summary

    out.append(gate_summary(ctx.tables))
    return "\n".join(out)


def _audit_badge(audit: dict[str, Any] | None) -> str:
    if audit is None:
        return "<p class='badge warn'>Release audit: not run (no run.yaml protocol and no tables/audit.json).</p>"
    cls = "ok" if audit.get("passed") else "bad"
    return f"<p class='badge {cls}'>Release audit: {html.escape(str(audit.get('summary')))}</p>"


def _audit_body(ctx: Context) -> str:
    audit = ctx.audit
    out = [_audit_badge(audit)]
    if audit is None:
        return out[0]
    for arm_name in ("primary", "sensitivity"):
        arm = audit.get(arm_name)
        if not arm:
            continue
        counts = {k: html.escape(str(arm.get(k))) for k in ("ok_cells", "expected_cells", "complete_blocks",
                                                             "expected_blocks")}
        out.append(f"<h3>{arm_name.capitalize()} arm: {counts['ok_cells']}/{counts['expected_cells']} cells ok, "
                   f"{counts['complete_blocks']}/{counts['expected_blocks']} blocks complete</h3>")
        if arm["missing"]:
            out.append(f"<p>Missing cells ({len(arm['missing'])}):</p><ul class='ids'>"
                       + "".join(f"<li><code>{html.escape(c)}</code></li>" for c in arm["missing"]) + "</ul>")
        if arm["failed"]:
            out.append(table_block("failed", pd.DataFrame(arm["failed"]), f"Failed cells ({len(arm['failed'])})"))
        if arm["incomplete_blocks"]:
            blocks = pd.DataFrame([{"block": b["block"], "missing": ", ".join(b["missing"]),
                                    "failed": ", ".join(b["failed"])} for b in arm["incomplete_blocks"]])
            out.append(table_block("blocks", blocks, f"Incomplete blocks ({len(blocks)})"))
    for key, title in (("problems", "Problems"), ("notes", "Notes")):
        items = audit.get(key) or []
        if items:
            listing = "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in items) + "</ul>"
            head = f"{title} ({len(items)})"
            out.append(f"<details><summary>{head}</summary>{listing}</details>" if len(items) > LARGE_TABLE_ROWS
                       else f"<h3>{head}</h3>{listing}")
    return "\n".join(out)


def _protocol_body(ctx: Context) -> str:
    path = ctx.layout.run_yaml
    if not path.exists():
        return "<p>No run.yaml in this run folder: the resolved protocol was not recorded.</p>"
    text = redact_text(path.read_text())  # credentials in URIs stay in run.yaml (raybench.redaction)
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


def _profiles_body(ctx: Context) -> str:
    prof = ctx.tables["profiles"]
    crossed = ctx.tables.get("crossed")
    show_published = ctx.cohort_kind == "ptbxl" or ("published" in prof and prof.published.notna().any())
    out = []
    inference = (run_section(ctx.run, "protocol") or {}).get("inference") or {}
    if inference:
        out.append(f"<p class='note'>Bootstrap draws: {int(inference.get('patient_draws', 0)):,} paired patient "
                   f"draws, {int(inference.get('crossed_draws', 0)):,} crossed draws.</p>")
    for metric in sorted(prof.metric.unique(), key=lambda m: (METRICS.index(m) if m in METRICS else 9, m)):
        sub = prof[prof.metric == metric].sort_values(["auc", "model"], ascending=[False, True])
        df = pd.DataFrame({"model": sub.model.map(model_label), "AUC": sub.auc,
                           "95% CI": [f"{a:.3f}–{b:.3f}" for a, b in zip(sub.ci_low, sub.ci_high, strict=True)]})
        for col, name in (("rank1_prob", "P(rank 1)"), ("mean_rank", "mean rank")):
            if col in sub:
                df[name] = sub[col].to_numpy()
        if crossed is not None and (crossed.metric == metric).any():
            c = crossed[crossed.metric == metric].set_index("model").reindex(sub.model)
            df["crossed AUC"] = c.auc.to_numpy()
            df["crossed 95% CI"] = [f"{a:.3f}–{b:.3f}" if pd.notna(a) else "–"
                                    for a, b in zip(c.ci_low, c.ci_high, strict=True)]
        if show_published and "published" in sub:
            df["published (paper)"] = sub.published.to_numpy()
        out.append(f"<h3>{html.escape(metric_label(metric))}</h3>{df_html(df)}")
    if show_published:
        out.append("<p class='note'>Published: ECG-InterpBench PTB-XL reference AUCs.</p>")
    return "\n".join(out)


def _contrasts_body(ctx: Context) -> str:
    con = ctx.tables["contrasts"].copy()
    if "p_bh" in con:
        con["significant (BH < .05)"] = np.where(con.p_bh < 0.05, "yes", "")
    return table_block("contrasts", con, f"Paired contrasts ({len(con)} pairs)")


def _concepts_body(ctx: Context) -> str:
    con = ctx.tables["concepts"]
    table = con.pivot_table(index="family", columns="model", values="auc", aggfunc="mean")
    table = table.rename(columns=model_label).reset_index()
    table.columns.name = None
    return (table_block("concept_families", table, "Mean concept AUC by family")
            + table_block("concepts", con, f"Per-concept AUC ({len(con)} rows)"))


def _cells_body(ctx: Context) -> str:
    cells = ctx.tables["cells"]
    cols = [c for c in ("cell_id", "model", "layer", "q", "arm", "expansion", "k", "seed", "status", "val_r2",
                        "val_dead_fraction", "gate_pass", "test_accessibility", "test_coverage", "train_seconds")
            if c in cells]
    counts = cells.groupby(["arm", "status"], sort=True).size().rename("cells").reset_index()
    return (table_block("cell_status", counts, "Cells by arm and status")
            + table_block("cells", cells[cols], f"All cells ({len(cells)} rows)"))


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


def _match(names: list[str], patterns: tuple[str, ...]) -> list[str]:
    return [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns)]


OTHER = Section("other", "Other results", "Figures and tables of this run that no section above claims.")

for _s in (
    Section("summary", "Summary", body=_summary_body),
    Section("audit", "Release audit",
            "Every expected cell (models × depths × expansions × seeds, plus the sensitivity arm) must be present "
            "and ok, and every matched block (all models at one depth, E and seed) complete. Failed cells stay in "
            "the denominator.", body=_audit_body, tables=("missing",)),
    Section("profiles", "Model profiles",
            "Common-scale summaries: AUC over log E, averaged over depths and seeds, with patient-bootstrap and "
            "crossed (depth × seed) bootstrap 95% CIs.",
            figures=("forest_auc",), body=_profiles_body, claims=("profiles", "crossed"), needs=("profiles",)),
    Section("contrasts", "Pairwise contrasts",
            "Paired bootstrap differences (model_a − model_b); p-values Benjamini–Hochberg adjusted within each "
            "metric family.", body=_contrasts_body, claims=("contrasts",), needs=("contrasts",)),
    Section("curves", "Matched-scale curves", figures=("matched_scale_curves",), tables=("curves",)),
    Section("depth", "Depth × scale", figures=("heatmap_*",), tables=("depth_scale",)),
    Section("concepts", "Concept families", figures=("concept_families",), body=_concepts_body,
            claims=("concepts",), needs=("concepts",)),
    Section("stability", "Rank stability and sensitivity",
            "Kendall τ between model orders at every pair of expansions; the fixed k/N sparsity arm against the "
            "primary fixed k/d arm; how the summaries move with depth, scale and arm.",
            figures=("rank_stability", "sensitivity_arm"), tables=("rank_stability", "arm", "sensitivity")),
    Section("reproducibility", "Reproducibility", figures=("reproducibility",), tables=("reproducibility",)),
    Section("atlas", "Validation atlas",
            "Validation R² and dead fraction of every primary cell (mean over seeds); the fidelity gate is "
            "R² ≥ .90 and dead fraction < .20.", figures=("atlas_*",), body=_cells_body, claims=("cells",),
            needs=("cells",)),
    Section("calibration", "Calibration ladder",
            "Ridge probes vs single SAE / dense / random coordinates at E = 8. An encoder that carries the concepts "
            "should order dense ridge ≥ full-code ridge ≥ top-16 ≥ top-4 and learned single coordinates above "
            "random dictionaries; calibration_order says which steps hold per model (random-init demo encoders "
            "carry the concepts too weakly for the middle steps to separate).",
            figures=("calibration*",), tables=("calibration*",), optional=True),
    Section("harmonization", "Input harmonization",
            "Dense-coordinate accessibility and linear CKA under native, lead, temporal and joint harmonization.",
            figures=("harmonization*",), optional=True,  # concept-level tests: section harmonization_concepts
            tables=("harmonization", "harmonization_contrasts", "harmonization_rank", "harmonization_concepts")),
    Section("intervention", "Intervention selectivity",
            "SAE vs dense (and, in the paper design, PCA and random-rotation) coordinates per candidate arm and k: "
            "matched target effect, off-target RMS and wrong-behavior index; BH per metric over every comparison.",
            figures=("intervention*",), tables=("intervention*",), optional=True),
    Section("protocol", "Protocol", body=_protocol_body),
    Section("provenance", "Provenance", body=_provenance_body),
):
    register_section(_s)

from raybench.analysis.provenance_audit.report import SECTION as _AUDIT  # noqa: E402 (it builds on Section above)

register_section(_AUDIT, before="protocol")

from raybench.analysis.reliability.report import RELIABILITY_SECTION as _RELIABILITY  # noqa: E402 (same)

register_section(_RELIABILITY, before="protocol")
