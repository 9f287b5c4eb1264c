"""The report's opening: the encoders' weights and the cohort, then what was run (the release audit's verdict,
failed secondary analyses), kept apart from what the run found (per metric the leaders the contrasts separate,
the fidelity gate, flagged when no configuration passes; docs/protocol.md §7, §8)."""

from __future__ import annotations

import html

import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.atlas.paper_section import gate_summary
from raybench.analysis.release_audit.section import audit_badge
from raybench.analysis.report.plotting import METRICS, model_label
from raybench.analysis.summary.headline import (
    cohort_text,
    gate_flag,
    leader_sentence,
    leaders,
    weights,
    weights_text,
)


def _summary_body(ctx: Context) -> str:
    """What was run (weights, cohort, grid completeness), then, apart from it, what the run found."""
    out = [f"<p class='badge warn'>{html.escape(weights_text(ctx.layout, ctx.run))}</p>"
           if any(w.startswith("random") for w in weights(ctx.layout, ctx.run).values())
           else f"<p><b>{html.escape(weights_text(ctx.layout, ctx.run))}</b></p>",
           f"<p><b>{html.escape(cohort_text(ctx.layout, ctx.run))}</b></p>",
           "<h3>What was run</h3>", audit_badge(ctx.audit),
           "<p class='note'>The release audit checks that every cell of the grid was trained and evaluated; it says "
           "nothing about how the models compare.</p>"]
    if ctx.failures:
        out.append(f"<p class='badge bad'>Secondary analyses failed ({len(ctx.failures)}):</p><ul>" + "".join(
            f"<li><b>{html.escape(name)}</b>: {html.escape(reason)}</li>" for name, reason in ctx.failures.items())
            + "</ul>")
    cells = ctx.tables.get("cells")
    if cells is not None and not cells.empty:
        ok = cells[cells.status == "ok"]
        gate = int(ok.gate_pass.astype("boolean").fillna(False).astype(bool).sum()) if "gate_pass" in ok else 0
        out.append(f"<p>{len(cells)} cell rows ({len(ok)} ok); {gate} of the ok cells pass the validation "
                   f"fidelity gate (R² ≥ .90 and dead fraction &lt; .20).</p>")
    out.append("<h3>What it found</h3>")
    prof = ctx.tables.get("profiles")
    if prof is not None and not prof.empty:
        items = []
        for metric in [m for m in METRICS if (prof.metric == m).any()]:
            lead = leaders(prof, ctx.tables.get("contrasts"), metric)
            best = prof[(prof.metric == metric) & (prof.model == lead.models[0])].iloc[0]
            items.append(f"<li>{html.escape(leader_sentence(lead))} Highest AUC: "
                         f"{html.escape(model_label(best.model))} {best.auc:.3f} (95% CI {best.ci_low:.3f}–"
                         f"{best.ci_high:.3f}" + (f", P(rank 1) {best.rank1_prob:.2f}"
                                                  if pd.notna(best.get("rank1_prob")) else "") + ").</li>")
        out.append("<ul>" + "".join(items) + "</ul>")
    flag = gate_flag(ctx.tables)
    if flag:
        out.append(f"<p class='badge bad'>{html.escape(flag)}</p>")
    out.append(gate_summary(ctx.tables))
    return "\n".join(out)


SECTIONS = (
    Section("summary", "Summary", body=_summary_body),
)
