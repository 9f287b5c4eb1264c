"""The release audit's report sections: every expected cell and matched block, what is missing or failed, and
which tables rest on short denominators (raybench.analysis.completeness)."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.report.html import LARGE_TABLE_ROWS, table_block


def audit_badge(audit: dict[str, Any] | None) -> str:
    if audit is None:
        return "<p class='badge warn'>Release audit: not run (no run.yaml protocol and no tables/audit.json).</p>"
    cls = "ok" if audit.get("passed") else "bad"
    return f"<p class='badge {cls}'>Release audit: {html.escape(str(audit.get('summary')))}</p>"


def _audit_body(ctx: Context) -> str:
    audit = ctx.audit
    out = [audit_badge(audit)]
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


def denominators_body(ctx: Context) -> str:
    flagged = {n: df for n, df in sorted(ctx.tables.items()) if "short_denominator" in df}
    if not flagged:
        return ("<p class='note'>No table of this run records its denominators (tables written before "
                "n_expected / n_present / short_denominator existed).</p>")
    short = {n: int(df.short_denominator.astype(bool).sum()) for n, df in flagged.items()}
    short = {n: k for n, k in short.items() if k}
    if not short:
        return (f"<p class='badge ok'>Every denominator is full: each of the {len(flagged)} analysis tables rests "
                "on every cell the protocol expects.</p>")
    rows = pd.DataFrame({"table": list(short), "short rows": list(short.values()),
                         "rows": [len(flagged[n]) for n in short]})
    return ("<p class='badge warn'>Incomplete grid analyzed with --allow-incomplete: some estimates rest on fewer "
            "cells than the protocol's fixed denominator (n_present below n_expected). A common-scale AUC also "
            "leaves out any depth with a missing E.</p>" + table_block("short", rows, "Tables with short rows"))


SECTIONS = (
    Section("audit", "Release audit",
            "Every expected cell (models × depths × expansions × seeds, plus the sensitivity arm) must be present "
            "and ok, and every matched block (all models at one depth, E and seed) complete. Failed cells stay in "
            "the denominator.", body=_audit_body, tables=("missing",)),
    Section("denominators", "Grid completeness and denominators",
           "Every analysis table carries n_expected (grid cells of the row's scope in the protocol: the fixed "
           "denominator), n_present (those that are ok) and short_denominator. An incomplete grid is analyzed "
           "only with --allow-incomplete.", body=denominators_body),
)
