"""The report section "This run vs the paper": a summary, the rows that differ highlighted, every published
number, and the paper-number tables of raybench.analysis.atlas.paper_numbers."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.paper_vs_run.run import STATUSES, comparison_table, reference_cohort
from raybench.analysis.report.html import table_block
from raybench.analysis.report.plotting import model_label


def _fmt(v: float) -> str:
    return "–" if not np.isfinite(v) else f"{v:.4f}".rstrip("0").rstrip(".") if v != 0 else "0"


def comparison_html(df: pd.DataFrame) -> str:
    """The comparison as an HTML table; rows whose value differs from the paper's are highlighted."""
    head = ["source", "quantity", "metric", "model", "row", "paper", "this run", "difference", "status", "note"]
    out = ["<table class='paper-vs-run'><thead><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in df.itertuples(index=False):
        row = f"{r.axis} {r.setting}".strip()
        cells = [r.source, r.quantity, r.metric, model_label(r.model) if r.model else "", row, _fmt(r.paper),
                 _fmt(r.ours), _fmt(r.difference), r.status, r.note]
        style = " class='differs' style='background:#fff4d6;font-weight:600'" if r.status == "differs" else ""
        out.append(f"<tr{style}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def paper_comparison_body(ctx: Context) -> str:
    df = ctx.tables.get("paper_comparison")
    if df is None or df.empty:
        df = comparison_table(ctx.tables, ctx.cohort_kind)
    counts = {s: int((df.status == s).sum()) for s in STATUSES}
    cohort = str(df.cohort.iloc[0]) if len(df) else reference_cohort(ctx.cohort_kind)
    out = []
    if ctx.cohort_kind != cohort:
        out.append(f"<p class='badge warn'>This run's cohort ({html.escape(str(ctx.cohort_kind))}) is not one the "
                   f"paper reports: its numbers are set beside the paper's {html.escape(cohort)} numbers for "
                   "orientation only; differences are expected.</p>")
    cls = "ok" if counts["differs"] == 0 else "warn"
    out.append(f"<p class='badge {cls}'>{len(df)} published numbers ({html.escape(cohort)}): {counts['agrees']} "
               f"agree at the printed precision, {counts['differs']} differ (highlighted), "
               f"{counts['not in this run']} are not computed by this run.</p>")
    differs = df[df.status == "differs"]
    if len(differs):
        out.append(f"<h3>Differences ({len(differs)})</h3>" + comparison_html(differs))
    out.append(f"<details><summary>Every published number ({len(df)})</summary>{comparison_html(df)}</details>")
    for name, title in (("headline_numbers", "Headline numbers of the results text"),
                        ("concept_distribution", "The accessibility leader's concept-level AUCs"),
                        ("scale_depth_summary", "Scale and depth rows over the models (Table S4 as printed)"),
                        ("marginal_means", "Validation R² and dead fraction by E, model and depth (Appendix D)"),
                        ("concept_intervals", "Concept-level AUCs with patient-bootstrap 95% CIs")):
        if name in ctx.tables:
            out.append(table_block(name, ctx.tables[name], title))
    return "\n".join(out)


SECTIONS = (Section(
    "paper_comparison", "This run vs the paper",
    "Every number the paper prints (tables, appendices and the results text; the package's paper_values.csv) "
    "beside this run's value of the same quantity. A value agrees when it rounds to the printed decimals; "
    "rows that differ are highlighted.",
    body=paper_comparison_body,
    claims=("paper_comparison", "headline_numbers", "concept_distribution", "scale_depth_summary", "marginal_means",
            "concept_intervals")),)
