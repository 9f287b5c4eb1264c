"""The provenance audit's report section: the verdict table first, then Recover, the features that carry
provenance, the figures, and the full tables (docs/protocol.md §12). Its registry entry is analysis.py."""

from __future__ import annotations

import html
from collections import Counter

import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.provenance_audit.figures import CAPTIONS
from raybench.analysis.report.html import table_block
from raybench.analysis.report.plotting import model_label


def _pair(a: pd.Series, b: pd.Series) -> list[str]:
    return [f"{x:.3f} → {y:.3f}" if pd.notna(x) and pd.notna(y) else "–" for x, y in zip(a, b, strict=True)]


def verdict_view(ver: pd.DataFrame) -> pd.DataFrame:
    """The verdict table as the report shows it: both heads' AUROC from aligned to reversed beside G (what "no
    reliance" compares), kappa with its pair, what U and the controls remove, and the groups left out."""
    out = pd.DataFrame({"model": ver.model.map(model_label), "q": ver.q, "variable": ver.variable,
                        "verdict": ver.verdict, "reason": ver.reason})
    if "dropped" in ver:
        out.insert(len(out.columns) - 1, "groups left out", ver.dropped.fillna(""))
    if "kappa" in ver:
        pair = ver["kappa_pair"].fillna("") if "kappa_pair" in ver else pd.Series("", index=ver.index)
        out.insert(4, "κ (pair)", [f"{k:.2f} ({p})" if pd.notna(k) else "–" for k, p in zip(ver.kappa, pair,
                                                                                           strict=True)])
    for head in ("control", "exposed"):
        if f"auroc_{head}_aligned" in ver:
            out.insert(4, f"{head} AUROC aligned → reversed", _pair(ver[f"auroc_{head}_aligned"],
                                                                    ver[f"auroc_{head}_reversed"]))
    if "g" in ver:
        out.insert(4, "G", ver.g)
        out.insert(5, "G 95% CI", [f"{a:.3f}–{b:.3f}" if pd.notna(a) else "–"
                                   for a, b in zip(ver.g_ci_low, ver.g_ci_high, strict=True)])
    if "lpi_bits" in ver:
        out.insert(4, "LPI (bits)", ver.lpi_bits)
    rank = ver["verdict_rank"].dropna() if "verdict_rank" in ver else ver.iloc[:0]
    if len(rank):
        p = int(rank.min())
        for col, label in ((f"g_after_p{p}", f"G after (p={p})"), (f"controls_beaten_p{p}", "controls beaten"),
                           (f"utility_change_p{p}_ci_low", "utility 95% LB"),
                           (f"exposed_natural_change_p{p}", "exposed natural change")):
            if col in ver:
                out.insert(len(out.columns) - 1, label, ver[col])
        if f"removed_variance_p{p}" in ver:
            out.insert(len(out.columns) - 1, "removed variance: U / controls (median)",
                       [f"{a:.3f} / {b:.3f}" if pd.notna(a) else "–" for a, b in
                        zip(ver[f"removed_variance_p{p}"], ver[f"control_removed_variance_p{p}"], strict=True)])
    return out


def meanings() -> str:
    """One sentence per verdict (verdict.MEANINGS), as a list."""
    from raybench.analysis.provenance_audit.verdict import MEANINGS

    return "<ul class='note'>" + "".join(f"<li><b>{html.escape(v)}</b>: {html.escape(m)}.</li>"
                                         for v, m in MEANINGS.items()) + "</ul>"


def gates_view(gates: pd.DataFrame) -> pd.DataFrame:
    """The gates table as the report shows it (Table 16's layout: gate, criterion, estimate, interval, result)."""
    result = gates.passed.map(lambda v: "not evaluated" if v is None or pd.isna(v) else ("pass" if v else "fail"))
    return pd.DataFrame({"model": gates.model.map(model_label), "q": gates.q, "variable": gates.variable,
                         "gate": gates.gate, "criterion": gates.criterion, "estimate": gates.estimate,
                         "95% CI": [f"{a:.3f}–{b:.3f}" if pd.notna(a) else "–"
                                    for a, b in zip(gates.ci_low, gates.ci_high, strict=True)],
                         "result": result, "note": gates.note})


def provenance_body(ctx: Context) -> str:
    ver = ctx.tables["provenance_verdicts"]
    counts = Counter(ver.verdict)
    out = ["<p>" + "; ".join(f"<b>{html.escape(v)}</b>: {n}" for v, n in sorted(counts.items())) + ".</p>",
           table_block("provenance_verdicts", verdict_view(ver), f"Verdicts ({len(ver)} model × depth × variable)")]
    out.append(meanings())
    gates = ctx.tables.get("provenance_gates")
    if gates is not None and not gates.empty:
        out.append(table_block("provenance_gates", gates_view(gates), "Validity and verification gates"))
    odds = ctx.tables.get("provenance_odds")
    if odds is not None and not odds.empty:
        view = odds.assign(model=odds.model.map(model_label)).drop(columns=["layer"], errors="ignore")
        out.append(table_block("provenance_odds", view, "Natural odds ratios of the target, each group against "
                                                        "its reference (the regimes raise each to the power e)"))
    rec = ctx.tables.get("provenance_recover")
    if rec is not None and not rec.empty:
        view = rec[["model", "q", "variable", "lpi_bits", "ci_low", "ci_high", "prior_bits", "accuracy", "groups",
                    "groups_dropped"]].copy()
        view["model"] = view.model.map(model_label)
        out.append(table_block("provenance_recover", view, "Recover: LPI (bits per record)"))
    feats = ctx.tables.get("provenance_features")
    if feats is not None and not feats.empty and "flagged" in feats:
        flagged = feats[(feats.kind == "concept") & feats.flagged.astype(bool)]
        out.append(f"<p>{len(flagged)} concept-selected SAE latents carry more provenance than concept signal "
                   "(provenance LPI above −½ log₂(1 − r²) of their held-out concept correlation).</p>")
        if len(flagged):
            out.append(table_block("provenance_flagged", flagged.assign(model=flagged.model.map(model_label)),
                                   "Flagged latents"))
    dropped = ver[ver.get("groups_dropped", pd.Series(0, index=ver.index)).fillna(0).astype(float) > 0] \
        if "groups_dropped" in ver else ver.iloc[:0]
    if len(dropped):
        out.append(f"<p class='note'>{len(dropped)} rows left out provenance groups too small to audit, each with "
                   "the first fold and cell that failed (<b>groups left out</b> in the verdict table).</p>")
    shown = [stem for stem in CAPTIONS if stem in ctx.figures]
    if shown:
        out.append("<p>Figures below: " + " ".join(f"<b>{html.escape(stem.replace('_', ' '))}</b>: "
                                                   f"{html.escape(CAPTIONS[stem])}" for stem in shown) + "</p>")
    out.append("<p class='note'>Every association level of both heads before and after removal, and every random "
               "control: <code>tables/provenance_stress.csv</code>, <code>tables/provenance_controls.csv</code>.</p>")
    return "\n".join(out)


SECTIONS = (Section(
    "provenance_audit", "Provenance audit",
    "Does an encoder carry how the ECG was recorded (device, site), and does a head on its embedding rely on "
    "it? Recover: calibrated probe LPI. Stress: excess vulnerability G of a head fitted with the natural "
    "target–provenance association over a control head fitted without it, from the natural odds ratio κ to 1/κ "
    "(both marginals fixed). Validity gates: the control head's reversed advantage, the exposed head's aligned "
    "non-inferiority, device recoverability within diagnosis strata, above a metadata-only comparator. Intervene: "
    "remove a rank-p provenance component; Verify: certify the removal only if it beats every random projection "
    "that removes as much raw variance and the control head loses at most δ AUROC under independence. A device "
    "verdict of reliance stands only when it holds within site (device|site) (docs/protocol.md §12).",
    figures=("provenance_*",), tables=("provenance_features",), optional=True, body=provenance_body,
    claims=("provenance_verdicts", "provenance_gates", "provenance_recover", "provenance_stress",
            "provenance_controls", "provenance_odds"),
    needs=("provenance_verdicts",)),)
