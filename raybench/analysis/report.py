"""The run report: one deterministic HTML file (figures embedded), opened from the run folder or an export.

`render_report` walks the sections (report_sections.py, plus the paper analyses' sections of
paper_report.py and the feature dashboards registered below) and renders each from the run's tables and
figures with the HTML pieces of report_html.py; figures and tables that no section claims land in "Other
results". Only two things are links relative to the run folder, never absolute paths or external resources:
the full CSV of a table too long to inline, and the lazy-loaded dashboard images (figures/dashboards/);
`raybench export` copies both (it refuses an export that would leave a link dangling).
"""

from __future__ import annotations

import html
from pathlib import Path

from raybench.analysis.audit import read_audit, read_run_yaml, release_audit, run_protocol
from raybench.analysis.features.section import SECTION as FEATURES_SECTION
from raybench.analysis.figures import FIGURES
from raybench.analysis.paper_report import PAPER_SECTIONS
from raybench.analysis.paper_vs_run import SECTION as PAPER_VS_RUN_SECTION
from raybench.analysis.plotting import load_tables
from raybench.analysis.report_html import CSS, TEMPLATE, figure_html, table_block
from raybench.analysis.report_sections import OTHER, SECTIONS, Context, Section, register_section
from raybench.atomic import write_text
from raybench.paths import RunLayout

CAPTIONS = {spec.stem: spec.caption for spec in FIGURES}

for _section, _before in PAPER_SECTIONS:
    register_section(_section, before=_before)
register_section(FEATURES_SECTION, before="protocol")
register_section(PAPER_VS_RUN_SECTION, before="protocol")


def render_report(root: str | Path) -> Path:
    """Write `root`/report.html (atomically) from the run's tables, figures, run.yaml and audit."""
    layout = RunLayout.at(root)
    run = read_run_yaml(root)
    audit = read_audit(root)
    if audit is None:
        protocol = run_protocol(root)
        if protocol is not None and layout.cells_table.exists():
            audit = release_audit(root, protocol).to_dict()
    figures = {p.stem: p for p in sorted(layout.figures_dir.glob("*.png"))}
    ctx = Context(layout=layout, tables=load_tables(layout.tables_dir), figures=figures, run=run, audit=audit,
                  failures=_secondary_failures(root))
    parts, nav = [], []
    for section in [*SECTIONS, OTHER]:
        body = _render_section(section, ctx)
        if body is None:
            continue
        nav.append(f'<a href="#{section.id}">{html.escape(section.title)}</a>')
        parts.append(f'<section id="{section.id}"><h2>{html.escape(section.title)}</h2>{body}</section>')
    title = f"raybench report: {html.escape(layout.root.resolve().name)}"
    doc = TEMPLATE.format(title=title, css=CSS, nav="\n".join(nav), body="\n".join(parts))
    write_text(layout.report, doc)
    return layout.report


def _render_section(section: Section, ctx: Context) -> str | None:
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
    out += [figure_html(stem, ctx.figures[stem], CAPTIONS.get(stem) or stem.replace("_", " ")) for stem in figs]
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
    from raybench.analysis.secondary.run import read_failures

    try:
        return {str(f.get("analysis")): str(f.get("reason", "")) for f in read_failures(root)}
    except ValueError as err:
        return {"secondary_failures.json": str(err)}
