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


def test_panel_paper_selects_the_paper_size_spec(tmp_path):
    from raybench.analysis.reliability.ground_truth import PAPER_SPEC, SyntheticSpec
    from raybench.analysis.reliability.panel import panel_spec

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"preset": "demo", "reliability": {"panel": "paper", "panel_seed": 3}}))
    spec = panel_spec(load_run_config(path).reliability)
    assert spec.synthetic == replace(PAPER_SPEC, seed=3) and spec.synthetic.n_features == 16384
    assert panel_spec(ReliabilityConfig()).synthetic == SyntheticSpec()
    path.write_text(yaml.safe_dump({"preset": "demo", "reliability": {"panel": "huge"}}))
    with pytest.raises(ConfigError, match="reliability.panel"):
        load_run_config(path)


def test_the_configs_text_describes_the_measured_panel():
    """The reliability section's comments state the demo panel's d, feature count, width and mean number of
    active features per record: each is measured here on the synthetic model the panel trains on."""
    import inspect

    from raybench.analysis.reliability.ground_truth import SyntheticSpec, synthetic_data
    from raybench.core import analysis_config

    spec = SyntheticSpec()
    data = synthetic_data(spec)
    active = float((data.acts > 0).sum(axis=1).mean())
    text = " ".join(inspect.getsource(analysis_config.ReliabilityConfig).split())
    n = ReliabilityConfig().panel_expansions[0] * spec.d
    assert f"d = {spec.d}" in text and f"{spec.n_features} true features" in text
    assert f"N = {n} latents" in text and f"{spec.n_records:,} records" in text
    assert f"about {active:.1f} active" in text, active
