"""The `provenance` section of the run config: YAML, validation, and its place outside the config hash."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raybench.core.config import ConfigError, ProvenanceConfig, demo_run, load_run_config


def test_yaml_section_and_defaults(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: demo\n"
                    "provenance: {enabled: true, target: MI, ranks: [1], association_levels: [1, 0, -1]}\n")
    cfg = load_run_config(path)
    assert cfg.provenance.enabled and cfg.provenance.target == "MI" and cfg.provenance.ranks == (1,)
    assert cfg.provenance.association_levels == (1.0, 0.0, -1.0)
    assert demo_run().provenance == ProvenanceConfig() and not ProvenanceConfig().enabled
    d = ProvenanceConfig()
    assert (d.min_cell_records, d.verdict_rank, d.delta, d.device_grouping, d.folds) == (75, 1, 0.01, "raw", 5)
    assert d.association_levels == (1.0, 0.5, 0.0, -0.5, -1.0)  # kappa, sqrt(kappa), 1, 1/sqrt(kappa), 1/kappa
    assert d.variables == ("device", "site", "device|site") and d.metadata_csv is None  # devices within sites


def test_a_metadata_csv_and_a_within_site_variable_load_from_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: demo\nprovenance: {variables: [device, 'nurse|site'], metadata_csv: /data/age.csv}\n")
    cfg = load_run_config(path)
    assert cfg.provenance.variables == ("device", "nurse|site") and cfg.provenance.metadata_csv == "/data/age.csv"


def test_the_audit_settings_do_not_change_the_config_hash():
    cfg = demo_run()
    assert replace(cfg, provenance=ProvenanceConfig(enabled=True, draws=50)).config_hash() == cfg.config_hash()


@pytest.mark.parametrize(("field", "value", "match"), [
    ("target", "AFIB", "provenance.target"),
    ("association_levels", (1.0, 0.0), "reversed"),
    ("ranks", (0,), "provenance.ranks"),
    ("draws", 0, "provenance.draws"),
    ("variables", ("device", "device"), "distinct"),
    ("variables", ("device|",), r"a\|b \(a within b\)"),
    ("variables", ("device|site|nurse",), r"a\|b"),
    ("verdict_rank", 3, "provenance.verdict_rank"),
    ("device_grouping", "model", "provenance.device_grouping"),
    ("min_cell_records", 0, "provenance.min_cell_records"),
    ("folds", 0, "provenance.folds"),
])
def test_bad_values_name_the_key(field, value, match):
    with pytest.raises(ConfigError, match=match):
        replace(ProvenanceConfig(), **{field: value}).validate()
