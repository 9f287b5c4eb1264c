"""The report section "How far to trust each metric" (registered by raybench.analysis.report.render)."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

from raybench.analysis.api import Context, Section
from raybench.analysis.reliability.figures import CAPTIONS
from raybench.analysis.reliability.verdicts import ASSESSED_BY, CLASSES, TABLE
from raybench.analysis.report.html import df_html, figure_html, table_block

CRITERION_LABELS = {"share_snapshots": "variance share (snapshots)", "share_cells": "variance share (final cells)",
                    "snr": "SNR", "rank_agreement": "cross-seed ρ", "winners": "distinct winners",
                    "training": "through training", "ground_truth": "ground truth", "reseed": "reseed noise"}
NUMBERS = {"metric": "metric", "share_snapshots": "share variant", "share_seed": "share seed",
           "share_snapshot": "share snapshot", "share_cells": "share variant (cells)", "snr": "SNR",
           "winners": "winners", "rank_rho": "cross-seed ρ", "rho_step": "ρ step", "rho_gt_mcc": "ρ GT-MCC",
           "p_gt_mcc": "p GT-MCC", "rho_gt_f1": "ρ GT-F1", "p_gt_f1": "p GT-F1", "n_gt": "trained members",
           "reseed_s": "reseed s (median)", "reseed_s_min": "s min", "reseed_s_max": "s max", "reseed_cv": "CV",
           "reseed_mrd_1": "|D|*₁", "reseed_mrd_3": "|D|*₃", "mrd_3_profile": "|D|*₃ profile",
           "rho_gt_min_variants": "ρ GT (worst variant)", "encoder_only": "encoder-only",
           "saturated": "saturated", "out_tracks": "out-of-SAE tracks GT", "rho_gt_out": "ρ GT out-of-SAE",
           "rho_gt_mcc_step": "ρ GT-MCC | step", "rho_step_gt_mcc": "ρ(step, GT-MCC)",
           "contrasts_below_mrd": "contrasts < |D|*₃"}


VALUE_OF = {"share_snapshots": "share_snapshots", "share_cells": "share_cells", "snr": "snr",
            "rank_agreement": "rank_rho", "winners": "winners", "training": "rho_step", "reseed": "reseed_mrd_1"}


NULL_UNITS = (
    ("variance shares, SNR", "training runs: the models' mean square against that between the (model, seed) means "
                             "(block means out, snapshots averaged), an F with V - 1 and V (S - 1) df; "
                             "reproducibility's seed pairs share seeds: the pair-aware F"),
    ("cross-seed ρ", "seeds: independent random orders per seed (exact for few models; its smallest attainable p is "
                     "the pass cut where it exceeds 0.001); seed pairs: orders of pairs sharing seed effects"),
    ("through training", "snapshots within one run: every series in random order"),
    ("ground truth", "trained panel members: one-sided Spearman test, and the partial ρ given the training step"),
    ("reseed noise", "one SAE: the R evaluation reseeds"))


def decision_table_html() -> str:
    """The decision table of verdicts.TABLE, first matching row wins (docs/protocol.md §11.8 prints the same)."""
    return df_html(pd.DataFrame(TABLE, columns=["verdict", "when (first matching row wins)"]))


def classes_note(rel: pd.DataFrame) -> str:
    """Which evidence classes were assessed for every metric, and what assesses the missing ones."""
    parts = []
    for name in CLASSES:
        col = rel.get(f"class_{name}")
        if col is None:
            continue
        missing = rel.metric[col == "not assessed"].tolist()
        if not missing:
            parts.append(f"<b>{name}</b> assessed for every metric")
        else:
            parts.append(f"<b>{name}</b> not assessed for {html.escape(', '.join(missing))}: "
                         f"<code>{html.escape(ASSESSED_BY[name])}</code>")
    return "<p>Evidence classes: " + "; ".join(parts) + ".</p>"


def criteria_view(rel: pd.DataFrame) -> pd.DataFrame:
    """metric, verdict, each evidence class's state and, per criterion, 'state: value (null)' (or 'not
    assessed'), then the rule."""
    out = rel[["metric", "verdict", *[c for c in (f"class_{k}" for k in CLASSES) if c in rel]]].copy()
    out = out.rename(columns={f"class_{k}": k for k in CLASSES})
    for key, label in CRITERION_LABELS.items():
        if f"state_{key}" not in rel:
            continue
        cells = []
        for _, r in rel.iterrows():
            state = str(r[f"state_{key}"])
            if state == "not assessed":
                cells.append(state)
                continue
            num = max(r.rho_gt_mcc, r.rho_gt_f1) if key == "ground_truth" else float(r[VALUE_OF[key]])
            cells.append(f"{state}: {num:.3g} ({r[f'null_{key}']})" if np.isfinite(num) else state)
        out[label] = cells
    out["rule"] = rel["rule"]
    return out


def _fmt(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if out[c].dtype.kind == "f":
            out[c] = [("–" if not np.isfinite(v) else f"{v:.3g}") for v in out[c]]
    return out


def reliability_body(ctx: Context) -> str:
    rel = ctx.tables["reliability"]
    heavy = "reliability_panel" in ctx.tables
    out = [("<p class='note'>Heavy parts (evaluation reseeds, ground-truth panel, snapshots through training, "
            "bias-corrected intervals) are included.</p>") if heavy else
           ("<p class='badge warn'>Only the cheap parts ran (the signal class from final cells, interval bias, "
            "|D|*₃ of a profile): stability and validity are not assessed, so no metric can read "
            "<i>reliable</i>. Run <code>raybench reliability --run-dir …</code> or set "
            "<code>reliability.enabled: true</code> for reseeds, ground truth and training curves.</p>")]
    rs = ctx.tables.get("reliability_reseed")
    if rs is not None and not rs.empty:
        sel = rs[(rs.source == "selection_subset") & (rs.metric == "accessibility")]
        if not sel.empty and sel.groupby(["model", "q", "expansion", "seed"]).value.nunique().max() == 1:
            out.append("<p class='note'>The selection subset is the whole train split in this run (it is no larger "
                       "than eval.selection_records), so it involves no draw: the reseed noise of accessibility and "
                       "coverage is not assessed here (zero by construction says nothing about noise).</p>")
    out.append(classes_note(rel))
    out.append(df_html(criteria_view(rel)))
    out.append("<p>Verdicts by the decision table (docs/protocol.md §11.8): the criteria form three evidence "
               "classes, signal (variance shares, cross-seed ρ, SNR), stability (through training, reseed noise) "
               "and validity (ground truth with its out-of-SAE negative control); a class is assessed when any "
               "of its criteria has evidence and passes when all of its assessed criteria pass.</p>")
    out.append(decision_table_html())
    out.append("<p class='note'>States: pass above the null's 99.9% point (p &lt; 0.001), weak above its 98% point "
               "(p &lt; 0.02), fail otherwise; ground truth fails only on evidence against and is <i>not "
               "established</i> when significant neither way; <i>not assessed</i> when the evidence was not "
               "collected or no random draw is involved. Winners are shown beside their null, never used.</p>")
    out.append(df_html(pd.DataFrame(NULL_UNITS, columns=["criterion", "null's unit"])))
    nums = rel[[c for c in NUMBERS if c in rel]].rename(columns=NUMBERS)
    out.append(df_html(_fmt(nums)))
    out.append("<p class='note'>|D|*_S = t(0.975, ν)·s·√(2/S): the smallest difference between two S-seed means "
               "a 5% test would call real; |D|*₁ uses ν = R − 1 of the R reseeds of one SAE (3.93 s at R = 5), "
               "|D|*₃ ν = 4. Reseed s is per SAE; its median and range over the sampled SAEs are shown. |D|*₃ "
               "profile: s = the training-seed sd of one seed's common-scale AUC, the scale of the pairwise "
               "contrasts.</p>")
    con = ctx.tables.get("reliability_contrasts")
    if con is not None and not con.empty:
        flagged = con[con.below_mrd_3.astype(bool)]
        out.append(f"<p>{len(flagged)} of {len(con)} pairwise model contrasts in the main tables are smaller than "
                   "their metric's |D|*₃ profile: a difference that size could come from training seeds alone.</p>")
        if not flagged.empty:
            out.append(table_block("reliability_contrasts", _fmt(flagged), f"Contrasts below |D|*₃ ({len(flagged)})"))
    pi = ctx.tables.get("reliability_profile_intervals")
    outside = ctx.tables.get("reliability_outside")
    if outside is not None and not outside.empty:
        out.append(f"<p class='badge warn'>{len(outside)} point estimate(s) lie outside their own 95% percentile "
                   "interval (a mean of |r| near zero is biased upward under resampling).</p>")
        out.append(table_block("reliability_outside", _fmt(outside), "Points outside their percentile CI"))
    if pi is not None and not pi.empty:
        out.append("<p>The report shows the published percentile intervals everywhere else (they are what the "
                   "protocol reports). Here they stand next to bias-corrected ones from the same draws: BCa "
                   "(undefined, –, when every draw lies on one side of the point), basic, and the percentile interval "
                   "shifted by the bootstrap bias. ci_mc_sd is an asymptotic estimate from one set of draws "
                   "(√(p(1−p)/B)/f), not a rerun under other bootstrap seeds; it enters no verdict.</p>")
        out.append(table_block("reliability_profile_intervals", _fmt(pi), "Profile intervals"))
    for stem in ("reliability_variance", "reliability_ground_truth", "reliability_training"):
        if stem in ctx.figures:
            out.append(figure_html(stem, ctx.figures[stem], CAPTIONS[stem]))
            ctx.claimed_figures.add(stem)
    return "\n".join(out)


SECTIONS = (Section(
    "reliability", "How far to trust each metric",
    "For every metric raybench reports: which evidence classes (signal, stability, validity) were assessed, each "
    "criterion's state (pass, weak, fail, not established, not assessed) and number beside its null, and a verdict "
    "by the decision table with the rule that produced it (docs/protocol.md §11).",
    tables=("reliability_variance", "reliability_seed_profiles", "reliability_panel_rho", "reliability_panel",
            "reliability_training_summary", "reliability_training", "reliability_reseed", "reliability_reseed_cells",
            "reliability_panel_flags"),
    optional=True, body=reliability_body, needs=("reliability",),
    claims=("reliability", "reliability_contrasts", "reliability_outside", "reliability_profile_intervals")),)
