"""The run report: one deterministic HTML file (figures embedded), opened from the run folder or an export.

`render_document` walks the sections of the analyses it is given (the registry's, in report order) and renders each
from the run's tables and figures with the HTML pieces of report/html.py; figures and tables that no section
claims land in "Other results". Only two things are links relative to the run folder, never absolute paths or
external resources: the full CSV of a table too long to inline, and the lazy-loaded dashboard images
(figures/dashboards/); `raybench export` copies both (it refuses an export that would leave a link dangling).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path

from raybench.analysis.api import Analysis, Context, Section
from raybench.analysis.records import read_audit, read_failures
from raybench.analysis.report.html import CSS, TEMPLATE, figure_html, table_block
from raybench.analysis.report.plotting import load_tables
from raybench.core.atomic import write_text
from raybench.core.paths import RunLayout
from raybench.core.run_state import read_run_yaml

OTHER = Section("other", "Other results", "Figures and tables of this run that no section above claims.")


def render_document(root: str | Path, analyses: Sequence[Analysis]) -> Path:
    """Write `root`/report.html (atomically) from the run's tables, figures, run.yaml and audit.json, with the
    sections of `analyses` in order (raybench.analysis.stage.render_report passes the registry's)."""
    layout = RunLayout.at(root)
    run = read_run_yaml(root)
    audit = read_audit(root)
    captions = {stem: text for a in analyses for stem, text in a.captions.items()}
    sections = [s for a in analyses for s in a.sections]
    ids = [s.id for s in sections]
    clash = sorted({i for i in ids if ids.count(i) > 1})
    if clash:
        raise ValueError(f"report section id(s) {clash} are used by more than one analysis: rename one")
    figures = {p.stem: p for p in sorted(layout.figures_dir.glob("*.png"))}
    ctx = Context(layout=layout, tables=load_tables(layout.tables_dir), figures=figures, run=run, audit=audit,
                  failures=_secondary_failures(root))
    parts, nav = [], []
    for section in [*sections, OTHER]:
        body = _render_section(section, ctx, captions)
        if body is None:
            continue
        nav.append(f'<a href="#{section.id}">{html.escape(section.title)}</a>')
        parts.append(f'<section id="{section.id}"><h2>{html.escape(section.title)}</h2>{body}</section>')
    title = f"raybench report: {html.escape(layout.root.resolve().name)}"
    doc = TEMPLATE.format(title=title, css=CSS, nav="\n".join(nav), body="\n".join(parts))
    write_text(layout.report, doc)
    return layout.report


def _render_section(section: Section, ctx: Context, captions: dict[str, str]) -> str | None:
    if section.id == OTHER.id:
        figs = [s for s in sorted(ctx.figures) if s not in ctx.claimed_figures]
        tabs = [s for s in sorted(ctx.tables) if s not in ctx.claimed_tables and s != "audit"]
    else:
        figs = [s for s in ctx.match_figures(section.figures) if s not in ctx.claimed_figures]
        tabs = [s for s in ctx.match_tables(section.tables) if s not in ctx.claimed_tables]
    failed = ctx.failures.get(section.id)
    if (section.optional or section.id == OTHER.id) and not figs and not tabs and failed is None:
        return None
    ctx.claimed_figures.update(figs)
    ctx.claimed_tables.update(tabs)
    ctx.claimed_tables.update(t for t in section.claims if t in ctx.tables)
    out = [f"<p class='intro'>{section.intro}</p>"] if section.intro else []
    if failed is not None:
        out.append(f"<p class='badge bad'>This analysis failed in the last run ({html.escape(failed)}); its tables "
                   "and figures were removed.</p>")
    absent = [t for t in section.needs if t not in ctx.tables or ctx.tables[t].empty]
    if section.body is not None and not absent:
        out.append(section.body(ctx))
    out += [figure_html(stem, ctx.figures[stem], captions.get(stem) or stem.replace("_", " ")) for stem in figs]
    out += [table_block(stem, ctx.tables[stem], href=_table_href(ctx, stem)) for stem in tabs]
    if absent or (section.body is None and not figs and not tabs):
        wanted = absent or [*section.tables, *section.figures]
        out.append("<p class='note'>Not available in this run (no " + ", ".join(
            f"<code>{html.escape(w)}</code>" for w in wanted) + ").</p>")
    return "\n".join(out)


def _table_href(ctx: Context, stem: str) -> str | None:
    """The table's CSV (else Parquet) relative to the report, for tables too long to inline."""
    for ext in ("csv", "parquet"):
        path = ctx.layout.tables_dir / f"{stem}.{ext}"
        if path.exists():
            return path.relative_to(ctx.layout.root).as_posix()
    return None


def _secondary_failures(root: str | Path) -> dict[str, str]:
    """Failed secondary analyses of the last run (tables/secondary_failures.json): analysis -> reason."""

    try:
        return {str(f.get("analysis")): str(f.get("reason", "")) for f in read_failures(root)}
    except ValueError as err:
        return {"secondary_failures.json": str(err)}
