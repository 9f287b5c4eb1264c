"""This run vs the paper: the published numbers join the run's tables, and the report section highlights
differences (tables built here; no Ray)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from raybench.analysis.api import Context
from raybench.analysis.paper_vs_run import run as pvr
from raybench.analysis.paper_vs_run import section as pvs
from raybench.analysis.published import paper_values
from raybench.analysis.registry import ANALYSES
from raybench.core.paths import RunLayout


def profiles_as_published() -> pd.DataFrame:
    """A profiles table whose AUCs and CIs are Table S1's, to within the printed precision."""
    s1 = paper_values(source="table_s1")
    wide = s1.pivot_table(index=["model", "metric"], columns="quantity", values="value").reset_index()
    wide["auc"] += 0.0004  # still rounds to the printed value
    wide["rank1_prob"] = np.where((wide.model == "hubert_ecg") & (wide.metric == "reconstruction"), 1.0, 0.0)
    return wide[["model", "metric", "auc", "ci_low", "ci_high", "rank1_prob"]]


def test_paper_column_joins_the_matching_rows():
    prof = profiles_as_published()
    prof.loc[(prof.model == "csfm") & (prof.metric == "coverage"), "auc"] = 0.70  # the paper prints 0.659
    out = pvr.comparison_table({"profiles": prof}, "ptbxl")
    assert list(out.columns) == pvr.COMPARISON_COLUMNS
    assert set(out.cohort) == {"ptbxl"} and len(out) == len(paper_values(cohort="ptbxl"))
    s1 = out[out.source == "table_s1"].set_index(["model", "metric", "quantity"])
    assert (s1.drop(("csfm", "coverage", "auc")).status == "agrees").all()
    row = s1.loc["csfm", "coverage", "auc"]
    assert (row.paper, row.ours, row.status) == (0.659, 0.70, "differs")
    assert row.difference == 0.70 - 0.659
    hub = out[(out.quantity == "rank1_prob")].iloc[0]
    assert (hub.model, hub.ours, hub.status) == ("hubert_ecg", 1.0, "agrees")
    # no table of this run computes Table S5: not in this run, never "agrees"
    assert set(out[out.source == "table_s5"].status) == {"not in this run"}


def test_mimic_run_is_compared_with_table_2_and_s4():
    dead = pd.DataFrame({"model": ["ecg_fm", "csfm"], "mean_over_configs": [0.0994, 0.2]})
    s4 = pd.DataFrame({"axis": ["expansion"], "setting": ["32"], "metric": ["dead_fraction"], "value": [0.6364]})
    out = pvr.comparison_table({"dead_fraction_summary": dead, "scale_depth_summary": s4}, "mimic")
    assert set(out.source) == {"table_2", "table_s4", "appendix_e"}
    d = out[(out.source == "table_2") & (out.metric == "dead_fraction")].set_index("model").status
    assert (d["ecg_fm"], d["csfm"], d["st_mem"]) == ("agrees", "differs", "not in this run")
    e32 = out[(out.source == "table_s4") & (out.setting == "32") & (out.metric == "dead_fraction")].iloc[0]
    assert (e32.paper, e32.status) == (0.636, "agrees")


def test_leader_rows_name_the_runs_own_leader_when_it_differs():
    hn = pd.DataFrame({"quantity": ["auc"], "metric": ["excess"], "model": ["csfm"], "value": [0.4],
                       "paper": [0.371], "paper_model": ["ecg_fm"]})
    rep = pd.DataFrame({"model": ["csfm", "ecg_fm"], "measure": ["excess", "excess"], "auc": [0.4, 0.371]})
    out = pvr.comparison_table({"headline_numbers": hn, "reproducibility_auc": rep}, "ptbxl")
    row = out[(out.source == "results") & (out.quantity == "auc") & (out.metric == "excess")].iloc[0]
    assert (row.model, row.ours, row.status) == ("ecg_fm", 0.371, "agrees")
    assert "run's leader: csfm" in row.note


def test_secondary_tables_meet_tables_1_s2_and_s5():
    harm = pd.DataFrame({"model": ["st_mem", "st_mem"], "protocol": ["native", "joint"],
                         "accessibility": [0.38912, 0.376], "coverage": [0.9, 0.898], "cka_to_native": [1.0, 0.7702]})
    hcon = pd.DataFrame({"model": ["st_mem"], "protocol": ["temporal"], "metric": ["accessibility"],
                         "delta": [-0.01312]})
    cal = pd.DataFrame({"model": ["ecg_jepa", "ecg_jepa"], "method": ["sae_single", "dense_ridge"],
                        "accessibility": [0.342, 0.70], "coverage": [0.758, 1.0]})
    inter = pd.DataFrame({"model": ["csfm", "csfm"], "method": ["dense", "sae"], "concepts_eligible": [11, 11],
                          "wbi_cross": [2.134, 0.9441]})
    icon = pd.DataFrame({"model": ["csfm"], "comparison": ["sae_minus_dense"], "metric": ["wbi_cross"],
                         "delta": [-1.1899]})
    out = pvr.comparison_table({"harmonization": harm, "harmonization_contrasts": hcon, "calibration": cal,
                                "intervention": inter, "intervention_contrasts": icon}, "ptbxl")
    st = {(r.source, r.quantity, r.metric, r.model, r.setting): r.status for r in out.itertuples()}
    assert st["table_1", "mean_abs_r", "", "st_mem", "native"] == "agrees"  # 0.3891 at four decimals
    assert st["table_1", "delta_mean_abs_r", "", "st_mem", "temporal"] == "agrees"
    assert st["table_1", "cka", "", "st_mem", "joint"] == "agrees"
    assert st["table_1", "delta_mean_abs_r", "", "st_mem", "joint"] == "not in this run"
    assert st["table_s2", "mean_abs_r", "", "ecg_jepa", "sae_single"] == "agrees"
    assert st["table_s2", "coverage", "", "ecg_jepa", "sae_single"] == "agrees"
    assert st["table_s2", "mean_abs_r", "", "ecg_jepa", "dense_ridge"] == "differs"  # 0.70 against 0.726
    assert st["table_s5", "n_concepts_eligible", "", "csfm", ""] == "agrees"
    assert st["table_s5", "wbi", "wbi_cross", "csfm", "dense"] == "agrees"
    assert st["table_s5", "wbi", "wbi_cross", "csfm", "sae"] == "agrees"
    assert st["table_s5", "delta_sae_minus_dense", "wbi_cross", "csfm", ""] == "differs"  # -1.1899 vs -1.189


def test_appendix_f_g_calibration_ranges_and_counts_meet_the_runs_tables(tmp_path):
    """Issue 42 item 6: the numbers the values file lacked, each beside the run's own."""
    hcon = pd.DataFrame({"model": ["cardiac_fm", "ecg_jepa", "hubert_ecg", "hubert_ecg", "csfm"],
                         "protocol": ["temporal", "temporal", "lead", "joint", "lead"],
                         "metric": "accessibility", "delta": [-0.00581, 0.000035, -0.0005, 0.00057, 0.0002],
                         "ci_low": [-0.0095, 0, 0, 0, 0], "ci_high": [-0.0022, 0, 0, 0, 0],
                         "q_value_bh": [0.0162, 1, 1, 1, 1]})
    hcon = pd.concat([hcon, pd.DataFrame({"model": ["csfm"], "protocol": ["lead"], "metric": ["coverage"],
                                          "delta": [0.0], "q_value_bh": [1.0]})], ignore_index=True)
    harm = pd.DataFrame({"model": ["csfm", "st_mem"], "protocol": ["lead", "lead"], "cka_to_native": [1.0, 0.99995]})
    rank = pd.DataFrame({"protocol": ["lead", "temporal"], "metric": ["accessibility", "coverage"],
                         "spearman_rho": [1.0, 0.9714], "kendall_tau": [1.0, 0.87]})
    icon = pd.DataFrame({"model": ["csfm", "csfm", "st_mem", "st_mem"], "arm": "matched", "k": 5,
                         "comparison": "sae_minus_dense", "metric": ["off_cross_rms", "wbi_cross"] * 2,
                         "delta": [-0.08, -1.1, -0.06, 0.2], "p_value": [0.001] * 4,
                         "q_value_bh": [0.0011, 0.0008, 0.001, 0.001]})
    ranges = pd.DataFrame({"quantity": ["sae_ridge_retention", "sae_minus_random_by_depth", "sae_single_win_rate"],
                           "low": [0.7991, 0.02, 0.788], "high": [0.874, 0.088, 0.878], "n_models": 6})
    out = pvr.comparison_table({"harmonization_contrasts": hcon, "harmonization": harm, "harmonization_rank": rank,
                                "intervention_contrasts": icon, "calibration_ranges": ranges}, "ptbxl")
    st = {(r.source, r.quantity, r.metric, r.model, r.setting): (r.ours, r.status) for r in out.itertuples()}
    assert st["appendix_f", "delta_mean_abs_r", "accessibility", "cardiac_fm", "temporal"][1] == "agrees"
    assert st["appendix_f", "q_value", "accessibility", "cardiac_fm", "temporal"] == (0.0162, "agrees")
    assert st["appendix_f", "delta_mean_abs_r", "accessibility", "st_mem", "temporal"][1] == "not in this run"
    assert st["appendix_f", "max_abs_delta_mean_abs_r", "accessibility", "", "lead"] == (0.0005, "agrees")  # bound
    assert st["appendix_f", "min_cka", "", "", "lead"] == (0.99995, "agrees")  # at least 0.9999
    assert st["appendix_f", "min_q_value", "coverage", "", ""] == (1.0, "agrees")
    assert st["appendix_f", "spearman_rho", "accessibility", "", "lead"] == (1.0, "agrees")
    assert st["appendix_f", "spearman_rho", "coverage", "", "temporal"] == (0.9714, "agrees")
    assert st["appendix_f", "abs_delta_mean_abs_r_min", "accessibility", "", "ecg_jepa+hubert_ecg"][1] == "agrees"
    assert st["appendix_f", "abs_delta_mean_abs_r_max", "accessibility", "", "ecg_jepa+hubert_ecg"][1] == "agrees"
    assert st["appendix_g", "max_q_value", "", "", "sae_minus_dense"] == (0.0011, "agrees")
    assert st["appendix_g", "n_tests", "", "", "sae_minus_dense"] == (4.0, "differs")  # the paper: 10
    assert st["appendix_g", "significant_tests", "", "", "sae_minus_dense"] == (3.0, "differs")  # one delta > 0
    assert st["results", "sae_ridge_over_dense_ridge_min", "accessibility", "", ""] == (0.7991, "agrees")
    assert st["results", "sae_single_minus_random_single_min", "accessibility", "", ""] == (0.02, "differs")
    assert st["results", "sae_single_win_fraction_max", "accessibility", "", ""] == (0.878, "agrees")
    # a bound broken: the lead harmonization moved mean |r| by more than 0.0006
    worse = pvr.comparison_table({"harmonization_contrasts": hcon.assign(delta=hcon.delta * 3)}, "ptbxl")
    row = worse[worse.quantity == "max_abs_delta_mean_abs_r"].iloc[0]
    assert (row.ours, row.status) == (0.0015, "differs")


def test_cohort_counts_come_from_the_manifest_summary(tmp_path):
    from raybench.core.atomic import write_json

    layout = RunLayout.at(tmp_path)
    splits = {"train": {"records": 70260, "patients": 34000}, "val": {"records": 9768, "patients": 4700},
              "test": {"records": 19972, "patients": 9791}}
    write_json(layout.manifest_summary, {"records": 100000, "splits": splits, "complete_cases": {
        "records": 54591, "splits": {"test": {"records": 10900, "patients": 6609}}}})
    counts = pvr.cohort_counts(layout.manifest_summary, "mimic")
    out = pvr.comparison_table({"cohort_counts": counts}, "mimic")
    got = {(r.quantity, r.setting): (r.ours, r.status) for r in out[out.source == "appendix_e"].itertuples()
           if r.quantity.startswith("n_")}
    assert got["n_records", ""] == (100000, "agrees") and got["n_records", "test"] == (19972, "agrees")
    assert got["n_complete_records", ""] == (54591, "agrees") and got["n_test_patients", ""] == (6609, "agrees")
    assert got["n_patients", ""] == (48491, "agrees")
    ptb = pvr.comparison_table({"cohort_counts": pvr.cohort_counts(layout.manifest_summary, "ptbxl")}, "ptbxl")
    row = ptb[(ptb.source == "design") & (ptb.quantity == "n_test_patients")].iloc[0]
    assert (row.paper, row.ours) == (2862, 9791)  # every test patient outside MIMIC-IV-ECG


def test_write_comparison_reads_every_table_of_the_run(tmp_path):
    from raybench.core.atomic import write_table

    layout = RunLayout.at(tmp_path)
    write_table(layout.tables_dir / "profiles.parquet", profiles_as_published())
    write_table(layout.tables_dir / "calibration.parquet", pd.DataFrame(
        {"model": ["csfm"], "method": ["dense_ridge"], "accessibility": [0.651], "coverage": [1.0]}))
    out = pvr.write_comparison(tmp_path, "ptbxl")
    pd.testing.assert_frame_equal(pd.read_parquet(layout.tables_dir / "paper_comparison.parquet"), out)
    got = out[(out.source == "table_s2") & (out.model == "csfm") & (out.setting == "dense_ridge")].iloc[0]
    assert (got.ours, got.status) == (0.651, "agrees")
    assert (out[out.source == "table_s1"].status == "agrees").all()


def _context(tmp_path, tables: dict[str, pd.DataFrame], cohort: str) -> Context:
    return Context(layout=RunLayout.at(tmp_path), tables=tables, figures={}, run={"cohort": {"kind": cohort}},
                   audit=None)


def _rows(page: str) -> list[str]:
    return re.findall(r"<tr[^>]*>.*?</tr>", page, flags=re.S)


def test_section_renders_and_highlights_a_difference(tmp_path):
    prof = profiles_as_published()
    prof.loc[(prof.model == "st_mem") & (prof.metric == "reconstruction"), "auc"] = 0.95  # paper: 0.916
    page = pvs.paper_comparison_body(_context(tmp_path, {"profiles": prof}, "ptbxl"))
    assert "1 differ (highlighted)" in page and "badge warn" in page and "orientation only" not in page
    highlighted = [r for r in _rows(page) if "class='differs'" in r]
    assert len(highlighted) == 2  # once under "Differences", once in the full listing
    assert all("ST-MEM" in r and "0.916" in r and "0.95" in r for r in highlighted)
    agreeing = [r for r in _rows(page) if "CSFM" in r and "table_s1" in r]
    assert agreeing and not any("differs" in r for r in agreeing)
    # the analyze stage's table is rendered when present (here: one that differs nowhere)
    table = pvr.comparison_table({"profiles": profiles_as_published()}, "ptbxl")
    page = pvs.paper_comparison_body(_context(tmp_path, {"paper_comparison": table}, "ptbxl"))
    assert "0 differ" in page and "badge ok" in page and "class='differs'" not in page


def test_other_cohorts_are_compared_for_orientation_only(tmp_path):
    page = pvs.paper_comparison_body(_context(tmp_path, {"profiles": profiles_as_published()}, "synth"))
    assert "orientation only" in page and "ptbxl" in page


def test_registered_in_the_report():
    ids = [s.id for a in ANALYSES for s in a.sections]
    assert "paper_comparison" in ids and ids.index("paper_comparison") < ids.index("protocol")
    assert {"paper_comparison", "headline_numbers", "scale_depth_summary"} <= set(pvs.SECTIONS[0].claims)
