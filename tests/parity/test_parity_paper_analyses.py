"""Parity of the paper analyses (raybench.analysis.atlas.paper_analyses) with the published protocol code (issue 11).

- sparsity arms: paper_sensitivity.{npz,json}, written by make_fixtures_paper_analyses.py running the published
  scripts/analyze_multiscale_sae_sparsity_sensitivity.py (see README.md). Same draws, same arithmetic: the
  Kendall tau and its p, the model orders, every difference, CI, p and BH q compare exactly (bitwise).
- crossed-bootstrap contrasts and dead-fraction AUCs: the existing inference_crossed_bootstrap fixture
  (scripts/analyze_multiscale_sae_inference.py), fed through paper_analyses' own unit AUCs and contrasts.
raybench is fed its own model ids in its grid order (csfm before cardiac_fm): the published MODEL_ORDER, which
breaks ties and orients contrasts, has to come from raybench itself (issue 30). A changed seed fails each group.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.atlas import paper_analyses as pa
from raybench.analysis.inference import bootstrap as bs
from raybench.analysis.inference import streams
from raybench.core.protocol import MODELS

HERE = Path(__file__).resolve().parent
SEED = 20260714
METRICS = {"reconstruction": True, "semantic_alignment": True, "concept_coverage": True, "dead_fraction": False}


def _load(stem: str) -> tuple[dict[str, np.ndarray], dict]:
    with np.load(HERE / f"{stem}.npz", allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    return arrays, json.loads((HERE / f"{stem}.json").read_text())


SENS, SENSJ = _load("paper_sensitivity")
CB, CBJ = _load("inference_crossed_bootstrap")
OURS = {v: k for k, v in streams.PUBLISHED_MODEL_NAMES.items()}  # published name -> raybench id
GRID = [m for m in MODELS if m in OURS.values()]  # raybench's grid order


def _named(order: str) -> str:
    return ">".join(streams.PUBLISHED_MODEL_NAMES[m] for m in order.split(">"))


def _arm_tables(seed: int) -> dict[str, pd.DataFrame]:
    row = {OURS[n]: i for i, n in enumerate(SENS["models"].tolist())}
    es, seeds = SENS["expansions"].tolist(), SENS["seeds"].tolist()
    rows = []
    for arm, name in (("primary", "fixed_k_over_d"), ("sensitivity", "fixed_k_over_n")):
        for m in GRID:
            for j, e in enumerate(es):
                for k, s in enumerate(seeds):
                    rows.append({"arm": arm, "model": m, "expansion": e, "seed": s,
                                 **{metric: float(SENS[f"{name}__{metric}"][row[m], j, k]) for metric in METRICS}})
    draws = pa.paired_seed_draws(seed, SENSJ["bootstrap_samples"], len(seeds))
    return pa.arm_tables(pd.DataFrame(rows), METRICS, GRID, es, seeds, draws, 2.5, 97.5)


def test_sparsity_arms_reproduce_the_published_sensitivity_analysis():
    out = _arm_tables(SEED)
    ranks = out["arm_rank_agreement"].set_index(["metric", "expansion"])
    for r in SENSJ["rank_agreement"]:
        got = ranks.loc[(r["metric"], int(r["expansion_E"]))]
        assert (got.kendall_tau, got.p_value) == (float(r["kendall_tau"]), float(r["p_value"]))
        assert (_named(got.primary_order), _named(got.sensitivity_order)) == (r["fixed_k_over_d_order"],
                                                                              r["fixed_k_over_N_order"])
    cells = out["arm_differences"].set_index(["metric", "model", "expansion"])
    assert len(cells) == len(SENSJ["cell_differences"])
    for r in SENSJ["cell_differences"]:
        got = cells.loc[(r["metric"], OURS[r["model"]], int(r["expansion_E"]))]
        assert (got["diff"], got.ci_low, got.ci_high, got.p, got.p_bh) == tuple(float(r[k]) for k in (
            "fixed_k_over_N_minus_fixed_k_over_d", "ci_low", "ci_high", "p_two_sided", "q_bh"))
    aucs = out["arm_auc_differences"].set_index(["metric", "model"])
    for r in SENSJ["auc_differences"]:
        got = aucs.loc[(r["metric"], OURS[r["model"]])]
        assert (got["diff"], got.ci_low, got.ci_high, got.p, got.p_bh) == tuple(float(r[k]) for k in (
            "fixed_k_over_N_minus_fixed_k_over_d_auc", "ci_low", "ci_high", "p_two_sided", "q_bh"))


def test_sparsity_arms_with_another_seed_differ():
    cells = _arm_tables(SEED + 1)["arm_differences"]  # 3 seeds: the CI ends are nearly seed-free, p is not
    want = [float(r["p_two_sided"]) for r in SENSJ["cell_differences"]]
    assert cells.p.tolist() != want


def _crossed(metric: str, column: str, seed: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    depths, es, seeds = (CB[k].tolist() for k in ("depths", "expansions", "seeds"))
    row = {OURS[n]: i for i, n in enumerate(CB["models"].tolist())}
    vals = CB[column]  # [M, D, E, S]
    frame = pd.DataFrame([{"model": m, "q": q, "expansion": e, "seed": s, "value": float(vals[row[m], j, k, u])}
                          for m in GRID for j, q in enumerate(depths) for k, e in enumerate(es)
                          for u, s in enumerate(seeds)])
    models = list(GRID)
    units = pa.auc_units(frame, models, sorted(depths), sorted(seeds), es)
    di, si = streams.published_crossed_indices(seed, CBJ["bootstrap_samples"], len(depths), len(seeds))
    draws = bs.crossed_values_published(units, di, si)
    point = bs.crossed_values(units, np.ones((1, len(depths))), np.ones((1, len(seeds))))[0]
    return models, point, draws


@pytest.mark.parametrize("metric", ["dead_fraction", "concept_coverage"])
def test_crossed_contrasts_and_dead_fraction_auc_reproduce_the_published_inference(metric):
    models, point, draws = _crossed(metric, CBJ["metric_columns"][metric], SEED)
    con = pa.pairwise_contrasts(metric, models, point, draws, 2.5, 97.5)
    want = [r for r in CBJ["pairs"] if r["metric"] == metric]  # published: model_left - model_right, in its order
    assert list(zip(con.model_a, con.model_b, strict=True)) == [(OURS[r["model_left"]], OURS[r["model_right"]])
                                                                for r in want]
    for got, r in zip(con.itertuples(index=False), want, strict=True):
        assert got.diff == pytest.approx(float(r["observed_difference"]), abs=1e-12)  # summation order
        assert (got.ci_low, got.ci_high, got.p, got.p_bh) == tuple(float(r[k]) for k in (
            "ci_low", "ci_high", "p_two_sided", "q_bh"))
    profile = {OURS[r["model"]]: r for r in CBJ["profile"] if r["metric"] == metric}
    for m, auc, lo, hi, _ in pa.crossed_auc_rows(models, point, draws, 2.5, 97.5):
        assert auc == pytest.approx(float(profile[m]["observed_multiscale_auc"]), abs=1e-12)
        assert (lo, hi) == (float(profile[m]["ci_low"]), float(profile[m]["ci_high"]))
    other = pa.pairwise_contrasts(metric, *_crossed(metric, CBJ["metric_columns"][metric], SEED + 1), 2.5, 97.5)
    assert other.ci_low.tolist() != con.ci_low.tolist()
