"""The report section "How far to trust each metric" (registered by raybench.analysis.report)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from raybench.analysis.reliability.figures import CAPTIONS
from raybench.analysis.report_html import df_html, figure_html, table_block
from raybench.analysis.report_sections import Context, Section

SHOWN = {"metric": "metric", "verdict": "verdict", "rule": "rule", "cv_eval": "CV (eval reseeds)",
         "mrd_1": "|D|*₁", "mrd_3": "|D|*₃", "mrd_3_profile": "|D|*₃ profile", "share_model": "model share",
         "share_residual": "seed residual share", "rho_gt_mcc": "ρ GT-MCC", "rho_gt_f1": "ρ GT-F1",
         "rises_fraction": "rises in training", "discriminability": "discriminability", "tau_seeds": "τ seeds",
         "tau_arms": "τ arms", "tau_selection": "τ selection", "n_outside": "points outside CI",
         "contrasts_below_mrd": "contrasts < |D|*₃"}


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
           ("<p class='badge warn'>Only the cheap parts ran (training-seed variance, interval bias, |D|*₃ of a "
            "profile); run <code>raybench reliability --run-dir …</code> or set <code>reliability.enabled: true"
            "</code> for reseeds, ground truth and training curves.</p>")]
    rs = ctx.tables.get("reliability_reseed")
    if rs is not None and not rs.empty:
        sel = rs[(rs.source == "selection_subset") & (rs.metric == "accessibility")]
        if not sel.empty and sel.groupby(["model", "q", "expansion", "seed"]).value.nunique().max() == 1:
            out.append("<p class='note'>The selection subset is the whole train split in this run (it is no larger "
                       "than eval.selection_records), so it involves no draw: its reseed noise is zero by "
                       "construction, and accessibility and coverage vary only with training seeds here.</p>")
    view = rel[[c for c in SHOWN if c in rel]].rename(columns=SHOWN)
    out.append(df_html(_fmt(view)))
    out.append("<p class='note'>|D|*_S = t(0.975, 2S−2)·s·√(2/S) is the smallest difference between two S-seed "
               "means a 5% test would call real (S = 1 uses the df of s). |D|*₁, |D|*₃: s = the evaluation reseed "
               "sd of one cell (0 for R² and dead fraction, which involve no draw). |D|*₃ profile: s = the noise of "
               "one seed's common-scale AUC (training seeds and evaluation), the scale of the pairwise contrasts. "
               "Verdict rules: docs/protocol.md §11.8.</p>")
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
                   "shifted by "
                   "the bootstrap bias; ci_mc_sd is how much another bootstrap seed would move an interval end.</p>")
        out.append(table_block("reliability_profile_intervals", _fmt(pi), "Profile intervals"))
    for stem in ("reliability_variance", "reliability_ground_truth", "reliability_training"):
        if stem in ctx.figures:
            out.append(figure_html(stem, ctx.figures[stem], CAPTIONS[stem]))
            ctx.claimed_figures.add(stem)
    return "\n".join(out)


RELIABILITY_SECTION = Section(
    "reliability", "How far to trust each metric",
    "For every metric raybench reports: evaluation reseed noise, training-seed variance, agreement with ground "
    "truth on a synthetic panel, behaviour through training, discriminability and rank consistency, and a verdict "
    "with the rule that produced it (docs/protocol.md §11).",
    tables=("reliability_variance", "reliability_seed_profiles", "reliability_panel_rho", "reliability_panel",
            "reliability_training_summary", "reliability_training", "reliability_reseed"),
    optional=True, body=reliability_body, needs=("reliability",),
    claims=("reliability", "reliability_contrasts", "reliability_outside", "reliability_profile_intervals"))
