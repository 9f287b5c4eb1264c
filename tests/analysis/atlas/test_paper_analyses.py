"""The paper analyses (issue 11): pure functions on hand-checkable cases, incomplete grids, gate aggregation,
CLI wiring of --allow-incomplete, and the report / tables / figures of a fabricated run."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from scipy.stats import kendalltau

from raybench.analysis.atlas import paper_analyses as pa
from raybench.analysis.completeness import IncompleteGridError, check_complete, grid_frame
from raybench.analysis.inference import stats as st
from raybench.analysis.inference.stats import benjamini_hochberg
from raybench.core.errors import USER_EXIT_CODE
from raybench.core.protocol import MODELS, PUBLISHED_MODEL_ORDER, analysis_order

# ---------------------------------------------------------------- pure functions


def test_rank_tau_matches_scipy_on_the_published_ranks():
    a = {"m1": 0.30, "m2": 0.20, "m3": 0.10, "m4": 0.25}
    b = {"m1": 0.30, "m2": 0.05, "m3": 0.10, "m4": 0.35}
    order = ["m1", "m2", "m3", "m4"]
    tau, p, oa, ob, n = st.rank_tau(a, b, order)
    assert (oa, ob, n) == ("m1>m4>m2>m3", "m4>m1>m3>m2", 4)
    want = kendalltau([1, 3, 4, 2], [2, 4, 3, 1])  # ranks of m1..m4 under a and b
    assert tau == pytest.approx(want.statistic) and p == pytest.approx(want.pvalue)
    assert tau == pytest.approx(2 / 6)  # 4 concordant, 2 discordant pairs
    assert st.rank_tau(a, b, order, higher_better=False)[0] == pytest.approx(tau)  # both orders reversed
    # models the published scripts do not know keep the order given; missing models drop out
    tied = st.rank_tau({"x": 1.0, "y": 1.0, "z": np.nan}, {"x": 1.0, "y": 2.0}, ["x", "y", "z"])
    assert tied[2:] == ("x>y", "y>x", 2) and tied[0] == pytest.approx(-1.0)


def test_ties_fall_in_the_published_model_order_not_the_grid_order():
    grid = list(MODELS)  # csfm before cardiac_fm
    assert analysis_order(grid) == list(PUBLISHED_MODEL_ORDER) and grid != list(PUBLISHED_MODEL_ORDER)
    assert analysis_order(["seventh", "st_mem", "csfm", "cardiac_fm"]) == ["cardiac_fm", "csfm", "st_mem", "seventh"]
    a = {m: 0.5 for m in grid} | {"ecg_fm": 0.9}
    b = dict(zip(grid, [0.6, 0.5, 0.4, 0.3, 0.2, 0.1], strict=True))  # csfm above cardiac_fm
    tau, _, oa, ob, n = st.rank_tau(a, b, grid)
    assert oa == "ecg_fm>cardiac_fm>csfm>ecg_jepa>hubert_ecg>st_mem" and n == 6
    want = kendalltau([2, 3, 1, 4, 5, 6], [2, 1, 3, 4, 5, 6]).statistic  # cardiac_fm .. st_mem
    assert tau == pytest.approx(want)
    assert st.rank_tau(a, b, grid[::-1])[0] == tau  # whatever order the caller lists them in
    assert st.rank_order(a, grid, sort="pandas")[0] == "ecg_fm"


def test_scale_rank_stability_every_pair_of_E():
    curve = pd.DataFrame({"model": ["a", "b", "c"] * 3, "expansion": np.repeat([1, 4, 16], 3),
                          "value": [.1, .2, .3, .1, .3, .2, .3, .2, .1]})
    rs = pa.scale_rank_stability(curve, ["a", "b", "c"], higher_better=False)
    assert list(zip(rs.expansion_a, rs.expansion_b, strict=True)) == [(1, 4), (1, 16), (4, 16)]
    assert rs.kendall_tau.tolist() == pytest.approx([1 / 3, -1.0, -1 / 3])
    assert rs.order_a.iloc[0] == "a>b>c"  # lower first


def test_auc_units_weights_by_hand():
    # E = 1, 4, 8: log-spacings 2 ln2 and ln2 -> weights (1/3, 1/2, 1/6)
    frame = pd.DataFrame({"model": "m", "q": 0.5, "seed": 1, "expansion": [1, 4, 8], "value": [1.0, 2.0, 3.0]})
    units = pa.auc_units(frame, ["m"], [0.5], [1], [1, 4, 8])
    assert units.shape == (1, 1, 1) and units[0, 0, 0] == pytest.approx(1 / 3 + 1 + 0.5)
    gap = pa.auc_units(frame.iloc[:2], ["m"], [0.5], [1], [1, 4, 8])  # one E missing: no AUC for this unit
    assert np.isnan(gap).all()


def test_pairwise_contrasts_order_ci_p_and_bh():
    draws = np.array([[3.0, 1.0, 2.0], [3.5, 1.5, 1.0], [2.5, 0.5, 2.5], [3.0, 1.0, 3.5]])
    con = pa.pairwise_contrasts("m", ["a", "b", "c"], np.array([3.0, 1.0, 2.0]), draws, 0, 100)
    assert list(zip(con.model_a, con.model_b, strict=True)) == [("a", "b"), ("a", "c"), ("b", "c")]
    ab = con[(con.model_a == "a") & (con.model_b == "b")].iloc[0]
    assert ab["diff"] == 2.0 and (ab.ci_low, ab.ci_high) == (2.0, 2.0) and ab.p == pytest.approx(2 / 5)
    bc = con[(con.model_a == "b") & (con.model_b == "c")].iloc[0]
    assert bc["diff"] == -1.0 and (bc.ci_low, bc.ci_high) == (-2.5, 0.5)  # left minus right, not the higher first
    assert con.p_bh.tolist() == pytest.approx(benjamini_hochberg(con.p.to_numpy()).tolist())
    # published orientation: left before right in MODEL_ORDER, whatever the grid order and the values
    real = pa.pairwise_contrasts("m", ["csfm", "cardiac_fm", "st_mem"], np.array([3.0, 1.0, 2.0]), draws, 0, 100)
    assert list(zip(real.model_a, real.model_b, strict=True)) == [("cardiac_fm", "csfm"), ("cardiac_fm", "st_mem"),
                                                                  ("csfm", "st_mem")]
    assert real["diff"].tolist() == [-2.0, -1.0, 1.0]


def test_bh_hand_example():
    # sorted p .01 .03 .04 .20 -> p*m/rank .04 .06 .0533 .20 -> step-up minimum .04 .0533 .0533 .20
    got = benjamini_hochberg([0.01, 0.04, 0.03, 0.20])
    assert got.tolist() == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.20])


def test_paired_seed_draws_are_the_published_generator_call():
    got = pa.paired_seed_draws(20260714, 50, 3)
    want = np.random.default_rng(20260714).integers(0, 3, size=(50, 3))
    assert np.array_equal(got, want)


def _arm_frame(shift: float, drop: tuple = ()) -> pd.DataFrame:
    rows = []
    for arm, m, e, s in itertools.product(("primary", "sensitivity"), ("a", "b"), (1, 4), (1, 2, 3)):
        if (arm, m, e, s) in drop:
            continue
        base = {"a": 0.5, "b": 0.4}[m] + 0.01 * s + (0.2 if (m, e) == ("b", 4) else 0.0)
        rows.append({"arm": arm, "model": m, "expansion": e, "seed": s,
                     "acc": base + (shift if arm == "sensitivity" else 0.0)})
    return pd.DataFrame(rows)


def test_arm_tables_paired_seed_bootstrap_and_tau():
    draws = pa.paired_seed_draws(7, 400, 3)
    out = pa.arm_tables(_arm_frame(0.05), {"acc": True}, ["a", "b"], [1, 4], [1, 2, 3], draws, 2.5, 97.5)
    cells, aucs, ranks = out["arm_differences"], out["arm_auc_differences"], out["arm_rank_agreement"]
    assert list(cells.columns) == pa.PAPER_COLUMNS["arm_differences"][:9]
    assert cells["diff"].to_numpy() == pytest.approx(0.05) and (cells.n_pairs == 3).all()
    assert cells.p.to_numpy() == pytest.approx(2 / 401)  # every draw positive: 2 (1 + 0) / (B + 1)
    assert cells.p_bh.to_numpy() == pytest.approx(2 / 401)
    assert aucs["diff"].to_numpy() == pytest.approx(0.05)
    assert aucs.primary_auc.iloc[0] == pytest.approx(0.52)  # a: seed mean .52 at both E
    # b overtakes a at E = 4 in both arms: the arms agree (tau 1) at each E
    assert ranks.kendall_tau.tolist() == pytest.approx([1.0, 1.0])
    assert ranks.primary_order.tolist() == ["a>b", "b>a"]
    # an unpaired seed (missing in one arm) leaves that pair out of the cell and of the AUC difference
    gap = pa.arm_tables(_arm_frame(0.05, drop=(("sensitivity", "a", 4, 3),)), {"acc": True}, ["a", "b"], [1, 4],
                        [1, 2, 3], draws, 2.5, 97.5)
    row = gap["arm_differences"].query("model == 'a' and expansion == 4").iloc[0]
    assert row.n_pairs == 2 and row["diff"] == pytest.approx(0.05)
    assert gap["arm_auc_differences"].query("model == 'a'").n_pairs.iloc[0] == 2


# ---------------------------------------------------------------- fidelity gate (deviation 5)


def test_seed_mean_gate_differs_from_per_cell_count():
    """Planted: seed means pass where single seeds fail and vice versa; a configuration with no ok seed fails."""
    r2 = {4: (0.95, 0.95, 0.82), 8: (0.89, 0.89, 0.95), 16: (0.91, 0.91, 0.85), 32: (0.95, 0.95, 0.95)}
    dead = {4: (.1, .1, .1), 8: (.1, .1, .1), 16: (.1, .1, .1), 32: (.1, .1, .35)}
    ok = pd.DataFrame([{"arm": "primary", "model": "m", "q": 0.5, "expansion": e, "seed": s, "val_r2": r2[e][i],
                        "val_dead_fraction": dead[e][i]} for e in r2 for i, s in enumerate((1, 2, 3))])
    expected = [("primary", "m", 0.5, e, s) for e in (1, 4, 8, 16, 32) for s in (1, 2, 3)]  # E = 1: all failed
    gate, models = pa.fidelity_gate(ok, grid_frame(expected, ok), 0.90, 0.20)
    g = gate.set_index("expansion")
    assert g.gate_pass.to_dict() == {1: False, 4: True, 8: True, 16: False, 32: True}
    assert g.n_cells_pass.to_dict() == {1: 0, 4: 2, 8: 1, 16: 2, 32: 2}
    assert g.val_r2_mean[4] == pytest.approx((0.95 + 0.95 + 0.82) / 3)
    assert g.short_denominator.to_dict() == {1: True, 4: False, 8: False, 16: False, 32: False}
    m = models.iloc[0]
    assert (m.n_configs, m.n_configs_pass, m.pass_fraction) == (5, 3, pytest.approx(0.6))  # fixed denominator
    assert (m.n_cells_pass, m.n_expected, m.cell_pass_fraction) == (7, 15, pytest.approx(7 / 15))
    assert bool(m.short_denominator)


# ---------------------------------------------------------------- incomplete grids (deviation 6)


def test_check_complete_names_every_missing_cell():
    missing = pd.DataFrame([("primary", "ecg_fm", 0.5, 4, 1, "ecg_fm-q050-E04-primary-s1", "failed: NaN loss"),
                            ("primary", "csfm", 1.0, 8, 2, "", "no row in cells table")],
                           columns=["arm", "model", "q", "expansion", "seed", "cell_id", "reason"])
    with pytest.raises(IncompleteGridError) as err:
        check_complete(missing, 40, allow_incomplete=False)
    text = str(err.value)
    assert "2 of 40 expected cells" in text and "--allow-incomplete" in text
    assert "ecg_fm-q050-E04-primary-s1: failed: NaN loss" in text
    assert "csfm-q100-E08-primary-s2: no row in cells table" in text  # the SAE stage's id for a cell with no row
    check_complete(missing, 40, allow_incomplete=True)
    check_complete(missing.iloc[:0], 40, allow_incomplete=False)


def _small_protocol():
    from test_tables import planted_protocol

    p = planted_protocol()
    return dataclasses.replace(p, inference=dataclasses.replace(p.inference, patient_draws=64, crossed_draws=64))


def test_incomplete_grid_refused_then_flagged(tmp_path, ray_cluster):
    from test_tables import write_planted_run

    from raybench.analysis.atlas.run import analyze_run
    from raybench.analysis.completeness import cell_label
    from raybench.core.atomic import write_table
    from raybench.core.paths import RunLayout

    proto = _small_protocol()
    root = write_planted_run(tmp_path, proto, fail=(("st_mem", 0.5, 4, 1, "primary"),))
    layout = RunLayout.at(root)
    cells = pd.read_parquet(layout.cells_table)
    gone = ("csfm", 1.0, 1, 2, "primary")
    cells = cells[~((cells.model == "csfm") & (cells.q == 1.0) & (cells.expansion == 1) & (cells.seed == 2)
                    & (cells.arm == "primary"))]
    write_table(layout.cells_table, cells)
    with pytest.raises(IncompleteGridError) as err:
        analyze_run(root, proto, cohort_kind="synth", write=False)
    assert "st_mem-q0.50-E4-s1-primary: failed: diverged" in str(err.value)
    assert f"{cell_label(*gone)}: no row in cells table" in str(err.value)

    out = analyze_run(root, proto, cohort_kind="synth", write=False, allow_incomplete=True)
    for name, df in out.items():
        if name != "missing":
            assert {"n_expected", "n_present", "short_denominator"} <= set(df.columns), name
    short = out["profiles"].groupby("model").short_denominator.all()
    assert short.to_dict() == {"csfm": True, "ecg_jepa": False, "st_mem": True}
    prof = out["profiles"].set_index(["model", "metric"])
    assert prof.loc[("st_mem", "coverage"), "n_expected"] == 8 and prof.loc[("st_mem", "coverage"), "n_present"] == 7
    con = out["crossed_contrasts"]
    assert (con.short_denominator == ((con.model_a != "ecg_jepa") | (con.model_b != "ecg_jepa"))).all()
    gate = out["fidelity_gate"].set_index(["arm", "model", "q", "expansion"])
    assert gate.loc[("primary", "st_mem", 0.5, 4), ["n_expected", "n_present"]].tolist() == [2, 1]
    assert not gate.loc[("primary", "ecg_jepa", 0.5, 4), "short_denominator"]
    arm = out["arm_differences"].set_index(["metric", "model", "expansion"])
    assert arm.loc[("accessibility", "st_mem", 4), "n_pairs"] == 1
    assert arm.loc[("accessibility", "st_mem", 4), "short_denominator"]
    assert not arm.loc[("accessibility", "st_mem", 1), "short_denominator"]
    curves = out["curves"].set_index(["model", "metric", "expansion"])
    assert curves.loc[("csfm", "coverage", 1), "short_denominator"]
    assert not curves.loc[("csfm", "coverage", 4), "short_denominator"]
    sens = out["sensitivity"]
    assert sens[(sens.model == "st_mem") & (sens.factor == "depth") & (sens.level == "0.5")].short_denominator.all()
    assert not sens[(sens.model == "st_mem") & (sens.factor == "depth") & (sens.level == "1")].short_denominator.any()


def _fake_analysis(monkeypatch, analyze_run) -> None:
    """The analyze stage with `analyze_run` standing in for the tables, no secondary analyses and no Ray."""
    import raybench.analysis.atlas.run as atlas_run
    import raybench.analysis.secondary.run as secondary_run
    import raybench.infra.ray_session

    monkeypatch.setattr(atlas_run, "analyze_run", analyze_run)
    monkeypatch.setattr(secondary_run, "run_secondary", lambda root, protocol, cfg: {})
    monkeypatch.setattr(raybench.infra.ray_session, "init_ray", lambda resources=None: None)


def test_cli_refuses_incomplete_grid_and_passes_the_flag(tmp_path, monkeypatch):
    from fake_run import small_protocol, write_fake_run

    from raybench.app.cli import main

    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells",))  # the folder check passes
    seen = {}

    def analyze_run(run_root, protocol, num_workers=None, cohort_kind="synth", allow_incomplete=False):
        seen["allow"] = allow_incomplete
        if not allow_incomplete:
            raise IncompleteGridError("the grid is incomplete: 1 of 54 expected cells are missing or failed:\n"
                                      "  ecg_fm-q050-E04-primary-s4311: failed: NaN loss")
        write_fake_run(run_root, small_protocol(), tables=("cells", "profiles"), run_yaml=False)
        return {"cells": None, "profiles": None}

    _fake_analysis(monkeypatch, analyze_run)
    res = CliRunner().invoke(main, ["analyze", "--run-dir", str(root)])
    assert res.exit_code == USER_EXIT_CODE and "ecg_fm-q050-E04-primary-s4311" in res.output
    assert "Traceback" not in res.output and seen["allow"] is False
    res = CliRunner().invoke(main, ["analyze", "--run-dir", str(root), "--allow-incomplete"])
    assert res.exit_code == 0, res.output
    assert seen["allow"] is True


def test_grid_command_passes_allow_incomplete(monkeypatch):
    import raybench.app.pipeline as pl
    from raybench.app.cli import main

    seen = {}

    def run_pipeline(cfg, echo=None, allow_incomplete=False, **kw):
        seen["allow"] = allow_incomplete
        return {"total": 0.0}

    monkeypatch.setattr(pl, "run_pipeline", run_pipeline)
    res = CliRunner().invoke(main, ["grid", "--allow-incomplete"])
    assert res.exit_code == 0, res.output
    assert seen["allow"] is True
    assert "--allow-incomplete" in CliRunner().invoke(main, ["grid", "--help"]).output


def test_pipeline_analyze_stage_refuses_with_a_user_error(tmp_path, monkeypatch):
    """`raybench grid`'s analyze stage refuses with a RaybenchError: one message naming the cell (exit code 2)."""
    import raybench.app.pipeline as pl
    from raybench.app.cli import main

    calls = []

    def analyze_run(root, protocol, num_workers=None, cohort_kind="synth", allow_incomplete=False):
        calls.append(allow_incomplete)
        raise IncompleteGridError("the grid is incomplete: cell-x: failed: oom")

    _fake_analysis(monkeypatch, analyze_run)
    monkeypatch.setattr(pl, "STAGES", [s for s in pl.STAGES if s.name == "analyze"])
    for flags in ([], ["--allow-incomplete"]):
        res = CliRunner().invoke(main, ["grid", "--run-dir", str(tmp_path / "run"), *flags])
        assert res.exit_code == USER_EXIT_CODE and "cell-x: failed: oom" in res.output
        assert "Traceback" not in res.output
    assert calls == [False, True]


# ---------------------------------------------------------------- harmonization: concept-level BH


def test_harmonization_concept_level_bh_over_every_concept_test():
    from raybench.analysis.secondary.harmonization import CONCEPT_CONTRAST_COLUMNS, harmonization_tables

    rng = np.random.default_rng(0)
    n_sel, n_te, n_pat, names = 60, 80, 40, ("qrs_duration", "hr_ventricular", "t_amp_global")
    y_sel, y_te = rng.normal(size=(n_sel, 3)), rng.normal(size=(n_te, 3))
    codes = np.repeat(np.arange(n_pat), 2)
    feats, concepts, test_codes = {}, {}, {}
    for m, noise in (("a", 0.5), ("b", 2.0)):
        x_sel = np.concatenate([y_sel + noise * rng.normal(size=y_sel.shape), rng.normal(size=(n_sel, 2))], axis=1)
        x_te = np.concatenate([y_te + noise * rng.normal(size=y_te.shape), rng.normal(size=(n_te, 2))], axis=1)
        feats[m] = {"native": (x_sel, x_te), "lead": (x_sel, x_te + 0.3 * rng.normal(size=x_te.shape))}
        concepts[m], test_codes[m] = (y_sel, y_te), codes
    counts = rng.multinomial(n_pat, np.full(n_pat, 1 / n_pat), size=300).astype(float)
    out = harmonization_tables(feats, concepts, test_codes, names, {"a": 5, "b": 5}, counts, 0.2, (2.5, 97.5))
    con = out["harmonization_concept_contrasts"]
    assert list(con.columns) == CONCEPT_CONTRAST_COLUMNS and len(con) == 2 * 1 * 3
    assert con.q_value_bh.tolist() == pytest.approx(benjamini_hochberg(con.p_value.to_numpy()).tolist())
    within_model = np.concatenate([benjamini_hochberg(g.p_value.to_numpy()) for _, g in con.groupby("model")])
    assert not np.allclose(within_model, con.sort_values("model").q_value_bh)  # one family across models
    conc = out["harmonization_concepts"].set_index(["model", "protocol", "concept"])
    row = con.iloc[0]
    want = conc.loc[(row.model, "lead", row.concept), "test_abs_r"] - conc.loc[(row.model, "native", row.concept),
                                                                               "test_abs_r"]
    assert row.delta == pytest.approx(want)
    model_level = out["harmonization_contrasts"]
    for _, g in model_level.groupby("metric"):  # the model-level family is unchanged
        assert g.q_value_bh.tolist() == pytest.approx(benjamini_hochberg(g.p_value.to_numpy()).tolist())


# ---------------------------------------------------------------- a fabricated run: tables, figures, report

NEW_TABLES = ("fidelity_gate", "fidelity_gate_models", "crossed_contrasts", "arm_rank_agreement", "arm_differences",
              "arm_auc_differences", "reproducibility_pairs", "reproducibility_auc", "dead_fraction",
              "dead_fraction_auc", "dead_fraction_rank_stability")
NEW_FIGURES = ("reproducibility_auc", "arm_agreement", "dead_fraction_profile")
NEW_SECTIONS = ("crossed_contrasts", "arm_sensitivity", "reproducibility_auc", "dead_fraction",
                "harmonization_concepts", "fidelity_gate", "denominators")


def test_small_run_has_the_new_tables_figures_and_sections(tmp_path, ray_cluster):
    from fake_run import harmonization_concepts
    from test_tables import write_planted_run

    from raybench.analysis.atlas.figures import make_figures
    from raybench.analysis.atlas.run import analyze_run
    from raybench.analysis.stage import render_report
    from raybench.core.atomic import write_table
    from raybench.core.paths import RunLayout

    proto = _small_protocol()
    root = write_planted_run(tmp_path / "run", proto)
    out = analyze_run(root, proto, cohort_kind="ptbxl")
    layout = RunLayout.at(root)
    for name in NEW_TABLES:
        assert list(out[name].columns) == pa.PAPER_COLUMNS[name], name
        assert len(out[name]) > 0, name
        assert list(pd.read_parquet(layout.tables_dir / f"{name}.parquet").columns) == pa.PAPER_COLUMNS[name]
        assert (layout.tables_dir / f"{name}.csv").exists()
        assert not out[name].short_denominator.any(), name
    rep = out["reproducibility_auc"]
    assert set(rep.measure) == {"excess", "subspace_overlap"} and rep.published.notna().all()
    assert ((rep.ci_low <= rep.auc + 1e-12) & (rep.auc <= rep.ci_high + 1e-12)).all()
    # the AUC is the published one: AUC over E of the depth- and pair-mean of each measure
    pairs = out["reproducibility_pairs"]
    mean_e = pairs.groupby(["model", "expansion"]).excess.mean().unstack()
    w = np.array([0.5, 0.5])  # E = 1, 4: the two ends of one trapezoid
    assert rep.query("measure == 'excess'").set_index("model").auc.to_dict() == pytest.approx(
        dict(zip(mean_e.index, mean_e.to_numpy() @ w, strict=True)))
    assert np.allclose(pairs.groupby(["model", "q", "expansion"]).excess.mean().to_numpy(),
                       out["reproducibility"].sort_values(["model", "q", "expansion"]).excess.to_numpy())
    write_table(layout.tables_dir / "harmonization_concept_contrasts.parquet",
                harmonization_concepts(["csfm", "ecg_jepa", "st_mem"], np.random.default_rng(1)))
    written = {p.name for p in make_figures(root)}
    for stem in NEW_FIGURES:
        assert {f"{stem}.png", f"{stem}.svg"} <= written
    text = render_report(root).read_text()
    for sid in NEW_SECTIONS:
        assert f'<section id="{sid}">' in text, sid
    for stem in NEW_FIGURES:
        assert f'id="fig-{stem}"' in text
    assert "Every denominator is full" in text and "published aggregation" in text


def test_crossed_summary_of_no_model_is_empty_not_an_error():
    """One training seed gives no seed pair, so reproducibility has no model to summarise (the remote-run test's
    one-seed grid crashed here)."""
    import numpy as np

    from raybench.analysis.atlas import paper_analyses as pa

    assert pa.crossed_auc_rows([], np.zeros(0), np.zeros((10, 0)), 2.5, 97.5) == []
    rows = pa.crossed_auc_rows(["a", "b"], np.array([0.5, 0.4]), np.array([[0.5, 0.4], [0.6, 0.3]]), 2.5, 97.5)
    assert [r[0] for r in rows] == ["a", "b"] and rows[0][4] == 1.0
