"""The paper's printed numbers as package data: hand-checked values, keys, precision, and their one owner."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from raybench.analysis.atlas import paper_analyses
from raybench.analysis.atlas import run as tables
from raybench.analysis.published import COLUMNS, KEYS, agrees, model_values, paper_values

MODELS = {"cardiac_fm", "csfm", "ecg_fm", "ecg_jepa", "hubert_ecg", "st_mem"}


def _value(**where: str) -> float:
    df = paper_values(**where)
    assert len(df) == 1, (where, df)
    return float(df.value.iloc[0])


def test_hand_checked_numbers():
    # Table S1: CARDIAC-FM coverage 0.806 [0.772, 0.821]; ST-MEM reconstruction CI low 0.915
    assert _value(source="table_s1", quantity="auc", metric="coverage", model="cardiac_fm") == 0.806
    assert _value(source="table_s1", quantity="ci_low", metric="coverage", model="cardiac_fm") == 0.772
    assert _value(source="table_s1", quantity="ci_high", metric="coverage", model="cardiac_fm") == 0.821
    assert _value(source="table_s1", quantity="ci_low", metric="reconstruction", model="st_mem") == 0.915
    # Table 2 (MIMIC): ECG-FM dead fraction 0.099, CSFM subspace stability 0.778; its dead column averages 0.308
    assert _value(source="table_2", metric="dead_fraction", model="ecg_fm") == 0.099
    assert _value(source="table_2", metric="subspace_overlap", model="csfm") == 0.778
    assert paper_values(source="table_2", metric="dead_fraction").value.mean() == pytest.approx(0.308, abs=5e-4)
    # Table S4 (MIMIC): E = 32 dead fraction 0.636; depth 0 reconstruction 0.986; its E rows' dead mean is 0.308
    assert _value(source="table_s4", axis="expansion", setting="32", metric="dead_fraction") == 0.636
    assert _value(source="table_s4", axis="depth", setting="0", metric="reconstruction") == 0.986
    s4 = paper_values(source="table_s4", axis="expansion", metric="dead_fraction")
    assert s4.value.mean() == pytest.approx(0.308, abs=5e-4)
    # Table 1: ST-MEM temporal delta -0.0131 and joint CKA 0.770; Table S2: ECG-JEPA SAE 1D 0.342 / 0.758
    assert _value(source="table_1", quantity="delta_mean_abs_r", model="st_mem", setting="temporal") == -0.0131
    assert _value(source="table_1", quantity="cka", model="st_mem") == 0.770
    assert _value(source="table_s2", quantity="mean_abs_r", model="ecg_jepa", setting="sae_single") == 0.342
    assert _value(source="table_s2", quantity="coverage", model="ecg_jepa", setting="sae_single") == 0.758
    # Table S5: CSFM n = 11, delta WBI -1.189; no ECG-FM row (it fails the all-seed gate)
    assert _value(source="table_s5", quantity="n_concepts_eligible", model="csfm") == 11
    assert _value(source="table_s5", quantity="delta_sae_minus_dense", metric="wbi_cross", model="csfm") == -1.189
    assert _value(source="table_s5", quantity="wbi", setting="dense", model="csfm") == 2.134
    assert "ecg_fm" not in set(paper_values(source="table_s5").model)
    # Appendix D and the results text
    assert _value(source="appendix_d", axis="expansion", setting="16", metric="val_r2") == 0.947
    assert _value(source="results", quantity="e8_anchor_max_abs_diff") == 0.0272
    assert _value(source="results", quantity="significant_contrasts", metric="accessibility") == 13
    assert _value(source="results", quantity="scale_tau_min", metric="coverage") == 0.60
    # Appendix F (input harmonization text), Appendix G (matched effect text), cohort counts (issue 42)
    assert _value(source="appendix_f", quantity="q_value", model="ecg_fm", setting="temporal") == 0.016
    assert _value(source="appendix_f", quantity="ci_high", model="st_mem", setting="temporal") == -0.0067
    assert _value(source="appendix_f", quantity="min_cka", setting="lead") == 0.9999
    assert _value(source="appendix_f", quantity="spearman_rho", metric="coverage", setting="joint") == 0.971
    assert _value(source="appendix_f", quantity="abs_delta_mean_abs_r_min") == 3.5e-5
    assert _value(source="appendix_g", quantity="max_q_value") == 0.0011
    assert _value(source="appendix_g", quantity="significant_tests") == 10
    assert _value(source="appendix_e", quantity="n_patients") == 48491
    assert _value(source="appendix_e", quantity="n_test_patients") == 6609
    assert _value(source="design", quantity="n_records", setting="test") == 3325


def test_every_table_is_complete_and_keys_are_raybench_names():
    df = paper_values()
    assert list(df.columns) == COLUMNS and not df.duplicated(KEYS).any()
    counts = df.groupby("source").size().to_dict()
    assert counts["table_s1"] == 6 * 3 * 3 and counts["table_2"] == 6 * 6 and counts["table_1"] == 6 * 6
    assert counts["table_s2"] == 6 * 10 and counts["table_s4"] == 10 * 4 and counts["table_s5"] == 5 * 5
    assert set(df.model) - {""} <= MODELS
    assert set(df.cohort) == {"ptbxl", "mimic"}
    assert set(df[df.cohort == "mimic"].source) == {"table_2", "table_s4", "appendix_e"}
    # issue 42: rows added since name their place in the paper's source (file:line)
    for source in ("appendix_f", "appendix_g", "design"):
        assert df[df.source == source].note.str.match(r"paper/sections/\w+\.tex:\d+").all(), source


def test_printed_precision_decides_agreement():
    s1 = paper_values(source="table_s1")
    assert set(s1.decimals) == {3}
    appendix_e = paper_values(source="appendix_e")
    assert set(appendix_e[~appendix_e.quantity.str.startswith("n_")].decimals) == {4}  # counts: integers
    assert _decimals(source="results", quantity="e8_anchor_max_abs_diff") == 4
    assert _decimals(source="appendix_d", axis="depth", setting="0.5", metric="val_r2") == 2  # "approximately"
    assert agrees(0.8064, 0.806, 3) and not agrees(0.8066, 0.806, 3)
    assert agrees(0.0005, 0.0, 4) is False and agrees(0.00004, -0.0, 4)
    assert not agrees(float("nan"), 0.5, 3)


def _decimals(**where: str) -> int:
    return int(paper_values(**where).decimals.iloc[0])


def test_the_data_file_is_the_one_owner_of_published_values():
    assert model_values("table_s1", "auc") == tables.PUBLISHED
    assert tables.PUBLISHED["accessibility"]["ecg_jepa"] == 0.351
    assert model_values("paper_facts", "auc") == paper_analyses.PUBLISHED_REPRODUCIBILITY
    assert paper_analyses.PUBLISHED_REPRODUCIBILITY["excess"]["ecg_fm"] == 0.371
    with pytest.raises(KeyError, match="not a key column"):
        paper_values(value="0.5")


def test_shipped_as_package_data():
    pyproject = tomllib.loads((Path(__file__).parents[3] / "pyproject.toml").read_text())
    assert "paper_values.csv" in pyproject["tool"]["setuptools"]["package-data"]["raybench.analysis.published"]
