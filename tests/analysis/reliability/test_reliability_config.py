"""reliability: a RunConfig section outside config_hash, validated, read back from YAML."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from raybench.core.config import ConfigError, ReliabilityConfig, demo_run, dump_run_config, load_run_config


def test_reliability_is_outside_the_config_hash_and_round_trips(tmp_path):
    cfg = demo_run()
    other = replace(cfg, reliability=ReliabilityConfig(enabled=True, reseeds=3, fractions=(0.5, 1.0)))
    assert other.config_hash() == cfg.config_hash()
    path = tmp_path / "c.yaml"
    path.write_text(dump_run_config(other))
    assert load_run_config(path).reliability == other.reliability


@pytest.mark.parametrize("bad", [{"reseeds": 1}, {"fractions": [0.5]}, {"fractions": [0.0, 2.0, 1.0]},
                                 {"panel_ks": []}, {"sample_points": 0}, {"warmup_fraction": 1.0},
                                 {"panel_variants": ["nope"]}])
def test_bad_values_name_the_key(tmp_path, bad):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"preset": "demo", "reliability": bad}))
    with pytest.raises(ConfigError, match="reliability"):
        load_run_config(path)
