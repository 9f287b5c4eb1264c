"""analyze_run on a small fake run folder written here: schemas, planted ranking, missing cells, determinism."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.atlas.run import PUBLISHED, TABLE_COLUMNS, analyze_run, profile_tables
from raybench.core.atomic import write_json, write_table
from raybench.core.config import EvalProtocol, GridProtocol, InferenceProtocol, Protocol
from raybench.core.paths import RunLayout
from raybench.core.protocol import analysis_order
from raybench.core.sufficient_stats import patient_stats

MODELS = ("csfm", "ecg_jepa", "st_mem")
SKILL = {"ecg_jepa": 0.9, "st_mem": 0.45, "csfm": 0.35}  # ecg_jepa planted best on every metric
ERR = {"ecg_jepa": 0.02, "st_mem": 0.06, "csfm": 0.08}
CONCEPTS = ["qrs_duration", "hr_ventricular", "t_amp_global", "qrs_axis_front", "st_amp_global_mv"]
P, D, M_TOP = 60, 16, 8


def planted_protocol() -> Protocol:
    return Protocol(
        name="test",
        grid=GridProtocol(models=MODELS, depths=(0.5, 1.0), expansions=(1, 4), seeds=(1, 2), sensitivity_depth=0.5),
        eval=EvalProtocol(repro_top=M_TOP, repro_permutations=20),
        # raybench's chunked stream: the planted-ranking thresholds below were set on its draws
        inference=InferenceProtocol(patient_draws=200, crossed_draws=400, chunk_draws=64, seed=3, stream="chunked"),
    )


def write_planted_run(root: Path, protocol: Protocol, fail: tuple = (), *, seed: int = 0,
                      skill: dict[str, float] | None = None, weight: float | np.ndarray = 1.0,
                      grows_with_e: bool = True) -> Path:
    """Cells table + per-cell patient_stats / decoder_top / metrics.json, with a planted best model (`skill`, default
    SKILL; `weight` scales each concept's signal; `grows_with_e`: the signal grows with log E). Also the cohort runs
    of tests/analysis/compare/."""
    skill = SKILL if skill is None else skill
    rng = np.random.default_rng(seed)
    layout = RunLayout.at(root)
    per = rng.integers(1, 3, size=P)
    patient = np.repeat(np.arange(P), per)
    r = len(patient)
    y = rng.normal(size=(r, len(CONCEPTS)))
    shared = {m: rng.normal(size=(D, 3 * M_TOP)) for m in MODELS}
    g = protocol.grid
    keys = [("primary", m, q, e, s) for m, q, e, s in itertools.product(g.models, g.depths, g.expansions, g.seeds)]
    keys += [("sensitivity", m, g.sensitivity_depth, e, s) for m, e, s in itertools.product(g.models, g.expansions,
                                                                                            g.seeds)]
    rows = []
    for arm, m, q, e, s in keys:
        cid = f"{m}-q{q:.2f}-E{e}-s{s}-{arm}"
        cdir = layout.cell_dir(cid)
        cdir.mkdir(parents=True, exist_ok=True)
        gain = skill[m] * (0.8 + 0.2 * q) * ((1.0 + 0.05 * np.log2(e)) if grows_with_e else 1.0)
        a = gain * weight * y + rng.normal(size=y.shape)
        err = rng.gamma(2.0, ERR[m] * (1 + 0.1 * np.log2(e)), size=r)
        dev = rng.gamma(2.0, 1.0, size=r) + err
        stats = patient_stats(patient, P, a, y, err, dev)
        np.savez(cdir / "patient_stats.npz", **stats)
        cols = shared[m][:, rng.permutation(3 * M_TOP)[:M_TOP + s]] + 0.1 * rng.normal(size=(D, M_TOP + s))
        np.savez(cdir / "decoder_top.npz", columns=cols / np.linalg.norm(cols, axis=0), indices=np.arange(M_TOP + s))
        rt = [float(np.corrcoef(a[:, j], y[:, j])[0, 1]) for j in range(len(CONCEPTS))]
        write_json(cdir / "metrics.json", {"concepts": CONCEPTS, "r_test": rt, "r_val": rt})
        failed = (m, q, e, s, arm) in fail
        rows.append({"cell_id": cid, "model": m, "layer": int(q * 11), "n_layers": 12, "q": q,
                     "realized_depth": int(q * 11) / 11, "arm": arm, "expansion": e, "n_latents": D * e,
                     "k": 2, "seed": s, "status": "failed: diverged" if failed else "ok",
                     "val_r2": 0.9 - ERR[m], "test_r2": 0.9 - ERR[m], "val_dead_fraction": 0.01 * e,
                     "val_mean_l0": 2.0, "gate_pass": True, "test_accessibility": 0.3, "test_coverage": 0.5,
                     "train_seconds": 1.0, "config_hash": "x", "cell_dir": str(cdir.relative_to(root))})
    write_table(layout.cells_table, pd.DataFrame(rows))
    return root


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name != "cells.parquet" and p.name != "cells.csv"}


@pytest.fixture(scope="module")
def analyzed(tmp_path_factory, ray_cluster):
    root = write_planted_run(tmp_path_factory.mktemp("run"), planted_protocol())
    out = analyze_run(root, planted_protocol(), num_workers=1, cohort_kind="synth")
    return root, out


def test_every_table_with_exact_columns(analyzed):
    root, out = analyzed
    tables = RunLayout.at(root).tables_dir
    for name, cols in TABLE_COLUMNS.items():
        assert list(out[name].columns) == cols, name
        assert list(pd.read_parquet(tables / f"{name}.parquet").columns) == cols
        assert (tables / f"{name}.csv").exists()
        if name != "missing":
            assert len(out[name]) > 0, name
    assert len(out["missing"]) == 0
    prof = out["profiles"]
    assert len(prof) == 3 * len(MODELS) and prof.published.isna().all()
    assert len(out["contrasts"]) == 3 * 3  # 3 pairs per metric
    assert len(out["curves"]) == 3 * len(MODELS) * 2
    assert len(out["rank_stability"]) == 3  # one E pair per metric
    assert set(out["depth_scale"].metric) == {"reconstruction", "accessibility", "coverage", "val_r2",
                                               "val_dead_fraction"}
    assert set(out["sensitivity"].factor) == {"depth", "scale", "arm"}
    assert len(out["reproducibility"]) == len(MODELS) * 2 * 2
    assert len(out["arm"]) == len(MODELS) * 2 * 3
    conc = out["concepts"]
    fam = dict(zip(conc.concept, conc.family, strict=True))
    assert fam["qrs_duration"] == "INTERVAL" and fam["st_amp_global_mv"] == "ST_T"
    assert (out["crossed"].ci_low <= out["crossed"].auc).all() and (out["crossed"].auc <= out["crossed"].ci_high).all()


def test_paper_number_tables_written_by_analyze(analyzed):
    from raybench.analysis.atlas.paper_numbers import TABLE_COLUMNS as NUMBER_TABLE_COLUMNS
    from raybench.analysis.completeness import DENOM_COLUMNS
    from raybench.analysis.paper_vs_run.run import COMPARISON_COLUMNS

    root, out = analyzed
    tables = RunLayout.at(root).tables_dir
    for name, cols in {**NUMBER_TABLE_COLUMNS, "paper_comparison": [*COMPARISON_COLUMNS, *DENOM_COLUMNS]}.items():
        assert list(out[name].columns) == cols, name
        assert list(pd.read_parquet(tables / f"{name}.parquet").columns) == cols, name
        assert len(out[name]), name
    dead = out["dead_fraction_summary"].set_index("model")
    assert list(dead.index) == list(MODELS) and set(dead.split) == {"val"}  # no cell records a test dead fraction
    assert np.allclose(dead.mean_over_configs, np.mean([0.01 * e for e in (1, 4)]))  # val_dead_fraction = .01 E
    assert (dead.n_configs == 4).all() and dead.paper.isna().all()  # synth: no paper value
    assert (dead.n_expected == 8).all() and not dead.short_denominator.any()  # 2 depths x 2 E x 2 seeds
    s4 = out["scale_depth_summary"]
    assert set(zip(s4.axis, s4.setting, strict=True)) == {("expansion", "1"), ("expansion", "4"), ("depth", "0.5"),
                                                          ("depth", "1")}
    hn = out["headline_numbers"].set_index(["quantity", "metric"])
    assert hn.loc[("significant_contrasts", "reconstruction"), "value"] == (
        out["contrasts"].query("metric == 'reconstruction'").p_bh < 0.05).sum()
    assert out["concept_distribution"].model.unique().tolist() == ["ecg_jepa"]
    assert set(out["paper_comparison"].cohort) == {"ptbxl"}  # a synthetic run is set beside PTB-XL
    ci = out["concept_intervals"]
    assert list(ci.columns) == ["model", "concept", "family", "auc", "ci_low", "ci_high", *DENOM_COLUMNS]
    merged = ci.merge(out["concepts"], on=["model", "concept"], suffixes=("", "_table"))
    assert len(merged) == len(ci) == len(MODELS) * len(CONCEPTS)
    assert np.allclose(merged.auc, merged.auc_table, rtol=0, atol=1e-15)
    assert (ci.ci_low <= ci.auc).all() and (ci.auc <= ci.ci_high).all() and (ci.ci_low < ci.ci_high).all()


def test_planted_best_model_ranks_first(analyzed):
    _, out = analyzed
    prof, con = out["profiles"], out["contrasts"]
    for metric in ("reconstruction", "accessibility", "coverage"):
        p = prof[prof.metric == metric].set_index("model")
        assert p.auc.idxmax() == "ecg_jepa"
        assert p.loc["ecg_jepa", "rank1_prob"] > 0.95 and p.loc["ecg_jepa", "mean_rank"] < 1.1
        runner_up = p.auc.drop("ecg_jepa").idxmax()
        assert p.loc["ecg_jepa", "ci_low"] > p.loc[runner_up, "ci_high"]
        left, right = analysis_order(["ecg_jepa", runner_up])  # published orientation, not the higher first
        c = con[(con.metric == metric) & (con.model_a == left) & (con.model_b == right)].iloc[0]
        sign = 1.0 if left == "ecg_jepa" else -1.0
        assert c.p_bh < 0.05 and sign * c["diff"] > 0 and (c.ci_low > 0 if sign > 0 else c.ci_high < 0)
    assert all(analysis_order([a, b]) == [a, b] for a, b in zip(con.model_a, con.model_b, strict=True))
    # point AUC = the mean over depths and seeds of the common-scale AUC of cell values (independent recomputation)
    ds = out["depth_scale"]
    acc = ds[(ds.metric == "accessibility") & (ds.model == "st_mem")].pivot(index="q", columns="expansion",
                                                                              values="value")
    x = np.log([1, 4])
    want = np.mean(np.trapezoid(acc[[1, 4]].to_numpy(), x, axis=1) / (x[-1] - x[0]))
    got = prof[(prof.metric == "accessibility") & (prof.model == "st_mem")].auc.iloc[0]
    assert got == pytest.approx(want, abs=1e-12)
    rep = out["reproducibility"]
    assert (rep.excess > 0.3).all() and np.allclose(rep.excess, rep.matched_cosine - rep.random_floor)


def test_rank_probabilities_and_surface_intervals(analyzed):
    """Issue 42 item 4: the published summary's rank table per scope and the model x depth x E intervals."""
    from raybench.analysis.atlas.rank_tables import RANK_COLUMNS, SURFACE_COLUMNS
    from raybench.analysis.completeness import DENOM_COLUMNS

    root, out = analyzed
    tables = RunLayout.at(root).tables_dir
    ranks, surf = out["rank_probabilities"], out["surface"]
    assert list(ranks.columns) == [*RANK_COLUMNS, *DENOM_COLUMNS]
    assert list(surf.columns) == [*SURFACE_COLUMNS, *DENOM_COLUMNS]
    assert list(pd.read_parquet(tables / "surface.parquet").columns) == [*SURFACE_COLUMNS, *DENOM_COLUMNS]
    assert not ranks.short_denominator.any() and not surf.short_denominator.any()
    assert set(surf.n_expected) == {2} and set(ranks[ranks.scope == "E1"].n_expected) == {2 * 2}
    assert set(ranks.scope) == {"common_scale_auc", "E1", "E4"} and len(ranks) == 3 * 3 * len(MODELS)
    common = ranks[ranks.scope == "common_scale_auc"].set_index(["metric", "model"])
    prof = out["profiles"].set_index(["metric", "model"])
    np.testing.assert_allclose(common.loc[prof.index, "rank1_prob"], prof.rank1_prob, rtol=1e-12)
    np.testing.assert_allclose(common.loc[prof.index, "mean_rank"], prof.mean_rank, rtol=1e-12)
    best = ranks[ranks.model == "ecg_jepa"]  # planted best on every metric and E
    assert (best.rank1_prob > 0.8).all() and (best.top2_prob == 1.0).all() and (best.median_rank == 1.0).all()
    assert (ranks.top2_prob >= ranks.rank1_prob).all()
    for (metric, _), g in ranks.groupby(["metric", "scope"]):  # chunked stream: tied models share their ranks
        assert g.rank1_prob.sum() == pytest.approx(1.0) and g.top2_prob.sum() <= 2.0
        if metric != "coverage":  # coverage (k/C) ties now and then; the others do not
            assert g.top2_prob.sum() == pytest.approx(2.0)
    # the surface's values are depth_scale's seed means; each sits in its patient-bootstrap interval
    assert len(surf) == len(MODELS) * 2 * 2 * 3 and (surf.n_seeds == 2).all()
    ds = out["depth_scale"].set_index(["model", "q", "expansion", "metric"])
    np.testing.assert_allclose(surf.value, ds.loc[list(zip(surf.model, surf.q, surf.expansion, surf.metric,
                                                          strict=True)), "value"], rtol=1e-12)
    assert (surf.ci_low <= surf.value + 1e-12).all() and (surf.value <= surf.ci_high + 1e-12).all()
    assert (surf.ci_high > surf.ci_low).any()


def test_rerun_is_byte_identical_and_worker_invariant(analyzed):
    root, _ = analyzed
    tables = RunLayout.at(root).tables_dir
    first = _digest(tables)
    analyze_run(root, planted_protocol(), num_workers=4, cohort_kind="synth")
    assert _digest(tables) == first


def test_failed_cells_reported_and_published_column(tmp_path, ray_cluster):
    proto = planted_protocol()
    proto = dataclasses.replace(proto, inference=dataclasses.replace(proto.inference, patient_draws=64,
                                                                     crossed_draws=64))
    root = write_planted_run(tmp_path, proto, fail=(("st_mem", 1.0, 4, 1, "primary"), ("csfm", 1.0, 4, 1, "primary"),
                                            ("csfm", 1.0, 4, 2, "primary")))
    out = analyze_run(root, proto, cohort_kind="ptbxl", write=False, allow_incomplete=True)
    miss = out["missing"]
    assert len(miss) == 3 and set(miss.reason) == {"failed: diverged"}
    prof = out["profiles"]
    assert prof.published.notna().all()
    row = prof[(prof.model == "csfm") & (prof.metric == "coverage")].iloc[0]
    assert row.published == PUBLISHED["coverage"]["csfm"]
    # csfm lost every seed at (q=1, E=4): its profile uses depth 0.5 only, and depth 1.0 has no AUC
    sens = out["sensitivity"]
    assert not ((sens.model == "csfm") & (sens.factor == "depth") & (sens.level == "1")).any()
    assert ((sens.model == "st_mem") & (sens.factor == "depth") & (sens.level == "1")).any()
    assert len(out["reproducibility"]) == len(MODELS) * 4 - 2  # st_mem and csfm lose (q=1, E=4)


def test_profile_contrasts_are_left_minus_right_in_the_published_model_order():
    """As the published patient-bootstrap summary lists them: (left, right) in MODEL_ORDER, whichever is higher,
    and whatever the grid order (csfm before cardiac_fm)."""
    models = ["csfm", "cardiac_fm", "st_mem"]
    point = np.array([[0.5, 0.3, 0.8], [0.4, 0.2, 0.9], [0.1, 0.3, 0.2]])  # [cells = models, 3 metrics]
    draws = point[None] + np.random.default_rng(0).normal(0, 0.01, (200, 3, 3))
    _, con = profile_tables(point, draws, np.eye(3), models, InferenceProtocol(), "synth")
    for k, (_, g) in enumerate(con.groupby("metric", sort=False)):
        assert list(zip(g.model_a, g.model_b, strict=True)) == [("cardiac_fm", "csfm"), ("cardiac_fm", "st_mem"),
                                                                ("csfm", "st_mem")]
        np.testing.assert_allclose(g["diff"], [point[1, k] - point[0, k], point[1, k] - point[2, k],
                                               point[0, k] - point[2, k]])
    first = con.iloc[0]  # cardiac_fm - csfm < 0: the lower model on the left keeps its sign
    assert first["diff"] == pytest.approx(-0.1) and first.ci_high < 0

