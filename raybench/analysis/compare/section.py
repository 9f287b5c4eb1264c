"""The comparison's one self-contained HTML report (report_html.py's template, style, figure and table pieces).

Drawn from the tables and the figure's PNG only; every value from a run folder (names, cohort kinds) is escaped.
"""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from raybench.analysis.compare.figures import CAPTION, STEM
from raybench.analysis.report.html import CSS, TEMPLATE, figure_html, kv_table, table_block
from raybench.analysis.report.plotting import metric_label, model_label
from raybench.core.atomic import write_text

REPORT = "report.html"
SECTIONS = (("summary", "Summary"), ("figure", "Figure"), ("leaders", "Leaders"),
            ("rank_agreement", "Rank agreement"), ("auc_differences", "AUC differences"),
            ("protocol", "Protocol"), ("method", "Method"))


def _leaders_text(name: str) -> str:
    return ", ".join(model_label(m) for m in str(name).split("|"))


def summary_html(tables: dict[str, pd.DataFrame]) -> str:
    """The two runs, then one line per metric: each run's leader, preserved or not, and tau with its interval."""
    runs = tables["runs"].set_index("role")
    a, b = runs.loc["a"], runs.loc["b"]
    kv = kv_table([("run A", f"{a.run} ({a.cohort_kind}, {a.n_patients} patients, {a.n_cells} cells)"),
                   ("run B", f"{b.run} ({b.cohort_kind}, {b.n_patients} patients, {b.n_cells} cells)"),
                   ("protocol", f"{a.protocol} / {b.protocol}"),
                   ("bootstrap", f"{a.draws} independent patient draws per run (seeds {a.seed}, {b.seed})")])
    lead, agree = tables["leaders"], tables["rank_agreement"].set_index("metric")
    kept = int(lead.leader_preserved.astype(bool).sum())
    badge = "ok" if kept == len(lead) else "warn"
    lines = []
    for r in lead.itertuples():
        g = agree.loc[r.metric]
        state = "preserved" if bool(r.leader_preserved) else "not preserved"
        lines.append(f"<li><b>{html.escape(metric_label(r.metric))}</b>: leader "
                     f"{html.escape(_leaders_text(r.leader_a))} in A, {html.escape(_leaders_text(r.leader_b))} "
                     f"in B: <b>{state}</b> (in "
                     f"{r.preserved_prob:.0%} of draw pairs); Kendall τ {g.kendall_tau:.2f} "
                     f"[{g.kendall_ci_low:.2f}, {g.kendall_ci_high:.2f}], Spearman ρ {g.spearman:.2f} "
                     f"[{g.spearman_ci_low:.2f}, {g.spearman_ci_high:.2f}]</li>")
    return (f"{kv}<p class='badge {badge}'>Metric-specific leader preserved in {kept} of {len(lead)} metrics</p>"
            f"<ul>{''.join(lines)}</ul>")


def protocol_html(diffs: pd.DataFrame) -> str:
    if diffs.empty:
        return "<p class='note'>The two runs' protocols are identical.</p>"
    return ("<p class='note'>Protocol fields that differ between the runs; none of them defines the profiles "
            "(runs differing in one that does are refused).</p>" + table_block("protocol", diffs))


METHOD = ("Each run's model profile is its common-scale AUC per metric, averaged over depths and seeds as in its "
          "profiles table. Each run is resampled by its own patient bootstrap (the two cohorts are independent), "
          "and draw i of A is paired with draw i of B to form draws of every between-run statistic: Kendall τ-b "
          "and Spearman ρ of the model orders, the AUC difference B − A (interval, bootstrap p, Benjamini-Hochberg "
          "within each metric) and whether the runs' leaders share a model. Intervals are percentile intervals "
          "(docs/protocol.md §8.9).")


def render(tables: dict[str, pd.DataFrame], png: Path | None) -> str:
    """The report's HTML text."""
    runs = tables["runs"].set_index("role")
    title = f"raybench compare: {runs.loc['a'].run} vs {runs.loc['b'].run}"
    body = {"summary": summary_html(tables),
            "figure": figure_html(STEM, png, CAPTION) if png is not None else "<p class='note'>No figure.</p>",
            "leaders": table_block("leaders", tables["leaders"]),
            "rank_agreement": table_block("rank_agreement", tables["rank_agreement"]),
            "auc_differences": table_block("auc_differences", tables["auc_differences"]),
            "protocol": protocol_html(tables["protocol"]),
            "method": f"<p class='intro'>{html.escape(METHOD)}</p>"}
    parts = [f"<h2 id='{sid}'>{html.escape(label)}</h2>{body[sid]}" for sid, label in SECTIONS]
    nav = "\n".join(f"<a href='#{sid}'>{html.escape(label)}</a>" for sid, label in SECTIONS)
    return TEMPLATE.format(title=html.escape(title), css=CSS, nav=nav, body="\n".join(parts))


def write_report(tables: dict[str, pd.DataFrame], out_dir: Path, figures: list[Path]) -> Path:
    """Write out_dir/report.html (the figure's PNG inlined) -> its path."""
    png = next((p for p in figures if p.suffix == ".png"), None)
    path = out_dir / REPORT
    write_text(path, render(tables, png))
    return path
