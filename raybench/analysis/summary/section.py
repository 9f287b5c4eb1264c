"""The report's opening: the release audit's verdict, failed secondary analyses, the best model per metric with
its interval, and the fidelity gate (docs/protocol.md §7)."""

from __future__ import annotations

import html

import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.atlas.paper_section import gate_summary
from raybench.analysis.release_audit.section import audit_badge
from raybench.analysis.report.plotting import METRICS, metric_label, model_label


def _summary_body(ctx: Context) -> str:
    out = [audit_badge(ctx.audit)]
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
    out.append(gate_summary(ctx.tables))
    return "\n".join(out)


SECTIONS = (
    Section("summary", "Summary", body=_summary_body),
)
