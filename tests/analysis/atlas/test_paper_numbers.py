"""paper_numbers: the numbers the paper states, as tables, on hand-built cell frames and tables (no Ray)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from raybench.analysis.atlas import paper_numbers as pn
from raybench.analysis.inference.metrics import trapezoid_auc

MODELS = ["csfm", "ecg_fm", "hubert_ecg"]
DEPTHS = [0.0, 0.5, 1.0]
ES = [1, 4, 8, 16, 32]
SEEDS = [1, 2, 3]


def cells_frame() -> pd.DataFrame:
    """A complete primary grid plus a sensitivity arm at q = 0.5; values are known functions of the keys."""
    rows = []
    mi = {m: i for i, m in enumerate(MODELS)}
    for m, q, e, s in itertools.product(MODELS, DEPTHS, ES, SEEDS):
        le = np.log2(e)
        rows.append(("primary", m, q, e, s, 0.9 + 0.01 * mi[m] - 0.002 * le, 0.3 + 0.01 * q + 0.001 * s,
                     0.6 + 0.02 * mi[m], 0.02 * le ** 2 + 0.05 * mi[m] + 0.01 * s, 0.95 - 0.01 * q, 0.01 * e + 0.1 * q))
    for m, e, s in itertools.product(MODELS, ES, SEEDS):  # must not enter any primary summary
        rows.append(("sensitivity", m, 0.5, e, s, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0))
    return pd.DataFrame(rows, columns=["arm", "model", "q", "expansion", "seed", "reconstruction", "accessibility",
                                       "coverage", "dead_fraction", "val_r2", "val_dead_fraction"])


def test_dead_fraction_plain_mean_first_and_differs_from_the_log_e_auc():
    cells = cells_frame()
    prim = cells[cells.arm == "primary"]
    curve = prim.groupby(["model", "expansion"]).dead_fraction.mean()
    auc = pd.DataFrame({"model": MODELS, "auc": [float(trapezoid_auc(curve[m].to_numpy(), ES)) for m in MODELS],
                        "ci_low": 0.0, "ci_high": 1.0})
    out = pn.dead_fraction_summary(cells, auc, "test", MODELS, "mimic")
    assert list(out.columns) == pn.NUMBER_COLUMNS["dead_fraction_summary"]
    assert list(out.columns).index("mean_over_configs") < list(out.columns).index("auc")
    for m in MODELS:
        row = out.set_index("model").loc[m]
        by_hand = prim[prim.model == m].groupby(["q", "expansion"]).dead_fraction.mean().mean()
        assert row.mean_over_configs == pytest.approx(by_hand, abs=1e-15)
        assert row.n_configs == len(DEPTHS) * len(ES)
        # the AUC over log E weighs E = 1 and 32 by half and the wide gaps more: not the plain mean
        assert abs(row.auc - row.mean_over_configs) > 0.01
    # Table 2 (MIMIC) is the paper column: ECG-FM .099, CSFM .380
    assert out.set_index("model").paper.to_dict() == {"csfm": 0.380, "ecg_fm": 0.099, "hubert_ecg": 0.546}
    assert pn.dead_fraction_summary(cells, auc, "test", MODELS, "synth").paper.isna().all()


def test_table_s4_rows_by_expansion_and_depth_are_plain_means_of_seed_means():
    cells = cells_frame()
    out = pn.scale_depth_summary(cells, "test", "mimic")
    assert list(out.columns) == pn.NUMBER_COLUMNS["scale_depth_summary"]
    assert len(out) == (len(ES) + len(DEPTHS)) * 4
    prim = cells[cells.arm == "primary"]
    row = out[(out.axis == "expansion") & (out.setting == "8") & (out.metric == "dead_fraction")].iloc[0]
    assert row.value == pytest.approx(prim[prim.expansion == 8].dead_fraction.mean(), abs=1e-15)
    assert row.n_configs == len(MODELS) * len(DEPTHS) and row.paper == 0.277  # Table S4, E = 8
    row = out[(out.axis == "depth") & (out.setting == "0.5") & (out.metric == "accessibility")].iloc[0]
    assert row.value == pytest.approx(prim[prim.q == 0.5].accessibility.mean(), abs=1e-15)
    assert row.paper == 0.298 and row.split == "test"
    assert out[(out.axis == "depth") & (out.setting == "1")].paper.tolist() == [0.973, 0.252, 0.546, 0.301]
    assert pn.scale_depth_summary(cells, "val", "ptbxl").paper.isna().all()  # Table S4 is the MIMIC run's


def test_appendix_d_marginal_means_by_e_model_and_depth():
    cells = cells_frame()
    out = pn.marginal_means(cells, MODELS, "ptbxl")
    assert list(out.columns) == pn.NUMBER_COLUMNS["marginal_means"]
    assert out[out.by == "model"].level.drop_duplicates().tolist() == MODELS  # grid order
    prim = cells[cells.arm == "primary"]
    e32 = out[(out.by == "expansion") & (out.level == "32") & (out.metric == "val_dead_fraction")].iloc[0]
    assert e32.value == pytest.approx(prim[prim.expansion == 32].val_dead_fraction.mean(), abs=1e-15)
    assert e32.paper == 0.604
    hub = out[(out.by == "model") & (out.level == "hubert_ecg") & (out.metric == "val_r2")].iloc[0]
    assert hub.paper == 0.986 and hub.n_configs == len(DEPTHS) * len(ES)
    assert out[(out.by == "model") & (out.level == "csfm")].paper.isna().all()  # the paper prints no CSFM mean
    q0 = out[(out.by == "depth") & (out.level == "0")].set_index("metric").paper.to_dict()
    assert q0 == {"val_r2": 0.978, "val_dead_fraction": 0.388}


def _tables() -> dict[str, pd.DataFrame]:
    con = pd.DataFrame({"metric": ["reconstruction"] * 3 + ["coverage"] * 3,
                        "p_bh": [0.001, 0.049, 0.05, 0.2, 0.01, 0.04]})
    rs = pd.DataFrame({"metric": ["reconstruction"] * 3, "kendall_tau": [1.0, 0.6, 0.2]})
    arm_rank = pd.DataFrame({"metric": ["coverage"] * 4, "kendall_tau": [0.87, 0.47, 1.0, 0.6]})
    aucd = pd.DataFrame({"metric": ["coverage"] * 3, "diff": [-0.027, 0.016, 0.001]})
    armd = pd.DataFrame({"metric": ["reconstruction", "dead_fraction", "coverage", "coverage"],
                         "expansion": [8, 8, 8, 16], "diff": [0.01, -0.0272, 0.02, 0.5]})
    prof = pd.DataFrame({"model": ["csfm", "hubert_ecg", "ecg_fm", "ecg_fm", "ecg_jepa"],
                         "metric": ["reconstruction", "reconstruction", "reconstruction", "accessibility",
                                    "accessibility"],
                         "auc": [0.9, 0.98, 0.95, 0.3, 0.35], "rank1_prob": [0.0, 0.97, 0.03, 0.1, 0.9]})
    rep = pd.DataFrame({"model": ["csfm", "ecg_fm"], "measure": ["excess", "excess"], "auc": [0.30, 0.37]})
    conc = pd.DataFrame({"model": ["ecg_jepa"] * 6 + ["ecg_fm"],
                         "concept": ["a", "b", "c", "d", "e", "f", "a"],
                         "auc": [0.62, 0.41, 0.30, 0.55, 0.20, 0.45, 0.99]})
    return {"contrasts": con, "rank_stability": rs, "arm_rank_agreement": arm_rank, "arm_auc_differences": aucd,
            "arm_differences": armd, "profiles": prof, "reproducibility_auc": rep, "concepts": conc}


def test_headline_numbers_from_the_tables():
    out = pn.headline_numbers(_tables(), "ptbxl")
    assert list(out.columns) == pn.NUMBER_COLUMNS["headline_numbers"]
    v = {(q, m): (val, model, paper) for q, m, model, val, paper in
         zip(out.quantity, out.metric, out.model, out.value, out.paper, strict=True)}
    assert v["significant_contrasts", "reconstruction"][::2] == (2.0, 15.0)  # q < .05 strictly
    assert v["significant_contrasts", "coverage"][0] == 2.0
    assert v["scale_tau_median", "reconstruction"][::2] == (0.6, 1.0)
    assert v["scale_tau_min", "reconstruction"][0] == 0.2
    assert v["arm_tau_median", "coverage"][::2] == (pytest.approx(0.735), 0.87)
    assert v["arm_tau_min", "coverage"][::2] == (0.47, 0.47)
    assert (v["arm_auc_diff_min", "coverage"][0], v["arm_auc_diff_max", "coverage"][0]) == (-0.027, 0.016)
    assert v["e8_anchor_max_abs_diff", "all"][::2] == (0.0272, 0.0272)  # every metric at E = 8, not E = 16
    assert v["rank1_prob", "reconstruction"] == (0.97, "hubert_ecg", 1.0)
    assert v["auc", "excess"] == (0.37, "ecg_fm", 0.371)
    assert pn.headline_numbers(_tables(), "synth").paper.isna().all()
    assert pn.headline_numbers({}, "ptbxl").empty


def test_concept_distribution_of_the_accessibility_leader():
    t = _tables()
    out = pn.concept_distribution(t["concepts"], t["profiles"], "ptbxl")
    assert list(out.columns) == pn.NUMBER_COLUMNS["concept_distribution"]
    assert set(out.model) == {"ecg_jepa"}  # the leader on accessibility (ecg_fm's 0.99 concept is not its)
    v = dict(zip(out.quantity[out.quantity != "concept_top"], out.value[out.quantity != "concept_top"], strict=True))
    auc = np.array([0.62, 0.41, 0.30, 0.55, 0.20, 0.45])
    assert v["concept_median"] == pytest.approx(np.median(auc))
    assert (v["concept_q25"], v["concept_q75"]) == (np.percentile(auc, 25), np.percentile(auc, 75))
    assert (v["concept_n_at_least_0.40"], v["concept_n_at_least_0.50"], v["concept_n_at_least_0.60"]) == (4, 2, 1)
    assert v["concept_n_concepts"] == 6
    top = out[out.quantity == "concept_top"]
    assert top.concept.tolist() == ["a", "d", "f", "b", "c"] and top.value.iloc[0] == 0.62
    paper = dict(zip(out.quantity, out.paper, strict=True))
    assert (paper["concept_median"], paper["concept_n_at_least_0.40"]) == (0.406, 26)


def test_number_tables_on_a_cell_frame_built_from_ok_cells():
    cells = cells_frame()
    ok = cells[["arm", "model", "q", "expansion", "seed", "val_r2", "val_dead_fraction"]]
    point = cells[["reconstruction", "accessibility", "coverage"]].to_numpy()
    frame = pn.cell_frame(ok, point, cells.dead_fraction.to_numpy(), ("reconstruction", "accessibility", "coverage"))
    pd.testing.assert_frame_equal(frame, cells[frame.columns.tolist()].reset_index(drop=True))
    out = pn.number_tables(frame, "test", _tables(), MODELS, "ptbxl")
    assert set(out) == set(pn.NUMBER_COLUMNS)
    for name, df in out.items():
        assert list(df.columns) == pn.NUMBER_COLUMNS[name] and len(df), name
    assert out["dead_fraction_summary"].auc.isna().all()  # no dead_fraction_auc table given


def test_denominators_flag_the_rows_whose_scope_lost_a_cell():
    from raybench.analysis.completeness import grid_frame

    cells = cells_frame()
    keys = list(cells[["arm", "model", "q", "expansion", "seed"]].itertuples(index=False, name=None))
    gone = ("primary", "csfm", 1.0, 32, 2)
    ok = cells[[k != gone for k in keys]]
    grid = grid_frame(keys, ok)
    out = pn.number_tables(ok, "test", _tables(), MODELS, "ptbxl", grid, 0.5)
    for name, df in out.items():
        assert list(df.columns) == pn.TABLE_COLUMNS[name], name
    dead = out["dead_fraction_summary"].set_index("model")
    assert dead.short_denominator.to_dict() == {"csfm": True, "ecg_fm": False, "hubert_ecg": False}
    assert (dead.n_expected == len(DEPTHS) * len(ES) * len(SEEDS)).all() and dead.loc["csfm", "n_present"] == 44
    s4 = out["scale_depth_summary"]
    short = set(zip(s4.axis[s4.short_denominator], s4.setting[s4.short_denominator], strict=True))
    assert short == {("expansion", "32"), ("depth", "1")}
    mm = out["marginal_means"]
    assert set(mm.level[mm.short_denominator]) == {"32", "csfm", "1"}
    hn = out["headline_numbers"].set_index(["quantity", "metric"])
    assert hn.loc[("significant_contrasts", "reconstruction"), "short_denominator"]  # the whole primary grid
    assert not hn.loc[("arm_tau_min", "coverage"), "short_denominator"]  # q = 1 is not the sensitivity depth
    assert hn.loc[("arm_tau_min", "coverage"), "n_expected"] == 2 * len(MODELS) * len(ES) * len(SEEDS)
