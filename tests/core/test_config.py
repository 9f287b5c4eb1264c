"""Protocol config: presets, YAML round trip, validation errors that name the key."""

from __future__ import annotations

from dataclasses import replace

import pytest

from raybench.core.config import (
    ConfigError,
    GridProtocol,
    RunConfig,
    demo_run,
    dump_run_config,
    k_for,
    layer_for_depth,
    load_run_config,
    paper_protocol,
)


def test_paper_preset_is_the_published_protocol():
    p = paper_protocol()
    assert p.grid.n_primary_cells == 450 and p.grid.n_blocks == 75
    assert p.sae.steps == 8000 and p.sae.batch_size == 256 and p.sae.lr == 3e-4
    assert (p.sae.beta1, p.sae.beta2) == (0.9, 0.99)
    assert p.grid.seeds == (4311, 4312, 4313) and p.grid.expansions == (1, 4, 8, 16, 32)
    assert p.inference.patient_draws == 2000 and p.inference.crossed_draws == 10000
    assert k_for(768, 768 * 32, "primary", p.sae, p.grid) == 96
    assert [k_for(768, 768 * e, "sensitivity", p.sae, p.grid) for e in p.grid.expansions] == [12, 48, 96, 192, 384]


def test_demo_has_the_same_structure():
    d = demo_run().protocol
    assert d.grid.n_primary_cells == 450 and d.grid.sensitivity_depth == 0.5
    assert d.sae.steps < paper_protocol().sae.steps


@pytest.mark.parametrize(("n_layers", "expected"), [(6, [0, 1, 3, 4, 5]), (12, [0, 3, 6, 8, 11])])
def test_layer_map(n_layers, expected):
    assert [layer_for_depth(q, n_layers) for q in (0, 0.25, 0.5, 0.75, 1.0)] == expected


def test_yaml_round_trip(tmp_path):
    cfg = demo_run(str(tmp_path / "run"))
    path = tmp_path / "cfg.yaml"
    path.write_text(dump_run_config(cfg))
    assert load_run_config(path) == cfg
    assert load_run_config(path).config_hash() == cfg.config_hash()


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("preset: demo\nprotocol:\n  sae:\n    stepz: 10\n")
    with pytest.raises(ConfigError, match="stepz"):
        load_run_config(path)


def test_bad_values_are_named(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("protocol:\n  sae:\n    lr: -1\n")
    with pytest.raises(ConfigError, match="sae.lr"):
        load_run_config(path)
    path.write_text("protocol:\n  grid:\n    depths: [0.5, 2.0]\n")
    with pytest.raises(ConfigError, match="depths"):
        load_run_config(path)
    path.write_text("cohort:\n  kind: ptbxl\n")
    with pytest.raises(ConfigError, match="cohort.root"):
        load_run_config(path)
    path.write_text("protocol:\n  sae:\n    steps: ten\n")
    with pytest.raises(ConfigError, match="steps"):
        load_run_config(path)


def test_sensitivity_depth_must_be_a_grid_depth():
    with pytest.raises(ConfigError, match="sensitivity_depth"):
        GridProtocol(depths=(0.0, 1.0), sensitivity_depth=0.5).validate()


def test_config_hash_ignores_speed_knobs():
    a = RunConfig()
    b = replace(a, run_dir="elsewhere", encoders=replace(a.encoders, batch_size=7))
    assert a.config_hash() == b.config_hash()
    c = replace(a, protocol=replace(a.protocol, sae=replace(a.protocol.sae, steps=10)))
    assert a.config_hash() != c.config_hash()


def test_every_fixed_choice_is_checked_from_its_literal(tmp_path):
    """Each Literal-typed field rejects a value outside its declared choices, in validate() and in YAML."""
    import typing
    from dataclasses import fields, is_dataclass

    from raybench.core.protocol import literal_choices

    cfg = RunConfig()
    sections = {f"protocol.{f.name}": (f.name, getattr(cfg.protocol, f.name)) for f in fields(cfg.protocol)
                if is_dataclass(getattr(cfg.protocol, f.name))}
    sections |= {f.name: (f.name, getattr(cfg, f.name)) for f in fields(cfg)
                 if f.name != "protocol" and is_dataclass(getattr(cfg, f.name))}
    checked = []
    for key, (name, section) in sections.items():
        hints = typing.get_type_hints(type(section))
        for f in fields(section):
            allowed = literal_choices(hints[f.name])
            if allowed is None:
                continue
            assert getattr(section, f.name) in allowed
            with pytest.raises(ConfigError, match=rf"{name}\.{f.name} must be one of"):
                replace(section, **{f.name: "bogus"}).validate()
            head, _, tail = key.partition(".")
            body = f"{head}:\n  {tail}:\n    {f.name}: bogus\n" if tail else f"{head}:\n  {f.name}: bogus\n"
            (tmp_path / "cfg.yaml").write_text(body)
            with pytest.raises(ConfigError, match=rf"{key}\.{f.name} must be one of"):
                load_run_config(tmp_path / "cfg.yaml")
            checked.append(f"{name}.{f.name}")
    assert {"sae.sampler", "eval.missing_concepts", "inference.stream", "cohort.kind", "cohort.sampling_rate",
            "encoders.profile", "encoders.size", "resources.trial_unit"} <= set(checked)


def test_the_mimic_rate_concept_is_hashed_for_mimic_runs_only():
    """cohort.rate_concept changes a MIMIC run's results, nothing else's: other runs keep the hash they had before
    the field existed, so their run folders stay theirs."""
    from dataclasses import replace

    from raybench.core.config import demo_run

    demo = demo_run()
    rr = replace(demo, cohort=replace(demo.cohort, rate_concept="rr_mean_ms"))
    assert rr.config_hash() == demo.config_hash() and "rate_concept" not in demo.hashed_config()["cohort"]
    mimic = replace(demo, cohort=replace(demo.cohort, kind="mimic"))
    mimic_rr = replace(mimic, cohort=replace(mimic.cohort, rate_concept="rr_mean_ms"))
    assert mimic.config_hash() != mimic_rr.config_hash()


def test_a_wfdb_cohort_is_configured_from_yaml_and_other_kinds_keep_their_hash(tmp_path):
    """cohort.kind: wfdb with its patient source and credentialed flag; the new keys are refused on other kinds and
    never enter their config_hash (their run folders stay theirs); credentialed never enters any hash."""
    from dataclasses import replace

    from raybench.core.config import CohortConfig, ConfigError, demo_run, load_run_config

    (tmp_path / "cfg.yaml").write_text("cohort:\n  kind: wfdb\n  root: /data/cpsc\n  patients_csv: patients.csv\n"
                                       "  credentialed: false\n")
    cfg = load_run_config(tmp_path / "cfg.yaml")
    assert (cfg.cohort.kind, cfg.cohort.patients_csv, cfg.cohort.credentialed) == ("wfdb", "patients.csv", False)
    assert "credentialed" not in cfg.hashed_config()["cohort"] and "patients_csv" in cfg.hashed_config()["cohort"]
    assert replace(cfg, cohort=replace(cfg.cohort, credentialed=True)).config_hash() == cfg.config_hash()
    demo = demo_run()
    assert not {"patients_csv", "patient_key", "credentialed"} & set(demo.hashed_config()["cohort"])
    for bad in ({"patient_key": "Patient"}, {"credentialed": False}):
        with pytest.raises(ConfigError, match="wfdb cohort setting"):
            CohortConfig(kind="ptbxl", root="/x", **bad).validate()
    with pytest.raises(ConfigError, match="concepts: tables"):
        CohortConfig(kind="wfdb", root="/x", concepts="tables").validate()


def test_the_secondary_analyses_are_set_from_yaml(tmp_path):
    """`secondary:` is a run-config section like the audits' (outside config_hash); a YAML that sets one key keeps
    the preset's other settings, and a wrong value names its key."""
    from raybench.core.analysis_config import SecondaryConfig
    from raybench.core.config import ConfigError, demo_run, load_run_config, paper_run

    path = tmp_path / "run.yaml"
    path.write_text("preset: demo\nsecondary:\n  analyses: [calibration, intervention]\n  random_dictionaries: 5\n")
    cfg = load_run_config(path)
    assert cfg.secondary.analyses == ("calibration", "intervention") and cfg.secondary.random_dictionaries == 5
    assert cfg.secondary.harmonization_train_records == SecondaryConfig.demo().harmonization_train_records == 96
    assert cfg.config_hash() == demo_run().config_hash(), "settings of an analysis of the finished grid"
    assert paper_run().secondary_settings() == SecondaryConfig() and demo_run().secondary_settings() == \
        SecondaryConfig.demo()
    path.write_text("preset: demo\nsecondary:\n  analyses: [ladder]\n")
    with pytest.raises(ConfigError, match="secondary.analyses"):
        load_run_config(path)
    path.write_text("preset: demo\nsecondary:\n  random_dictionaries: many\n")
    with pytest.raises(ConfigError, match="secondary.random_dictionaries"):
        load_run_config(path)


# ---------------------------------------------------------------- presets are explicit (issue 39, point 4)

@pytest.mark.parametrize(("text", "preset"), [
    ("", "demo"),  # an empty file is the embedded default, not the paper protocol with native preprocessing
    ("protocol:\n  sae:\n    lr: 0.001\n", "demo"),
    ("cohort:\n  records: 600\n  patients: 200\n", "demo"),
    ("preset: paper\ncohort:\n  records: 600\n  patients: 200\n", "paper"),
])
def test_a_config_without_preset_is_the_demo_never_a_mislabelled_paper(tmp_path, text, preset):
    from raybench.core.config import RUN_PRESETS

    path = tmp_path / "cfg.yaml"
    path.write_text(text)
    cfg = load_run_config(path)
    want = RUN_PRESETS[preset]()
    assert cfg.protocol.name == preset
    assert (cfg.protocol.sae, cfg.encoders.profile, cfg.encoders.size) == (
        replace(want.protocol.sae, lr=0.001) if "lr" in text else want.protocol.sae,
        want.encoders.profile, want.encoders.size)


def test_a_dumped_config_names_its_preset_and_loads_back(tmp_path):
    from raybench.core.config import paper_native_run, paper_run

    for cfg in (paper_run(str(tmp_path / "p")), paper_native_run(str(tmp_path / "n")), demo_run(str(tmp_path / "d"))):
        text = dump_run_config(cfg)
        assert text.startswith(f"preset: {cfg.protocol.name}\n")
        path = tmp_path / "cfg.yaml"
        path.write_text(text)
        assert load_run_config(path) == cfg
        # a full dump without its first line still loads as what it is (protocol.name names the preset)
        path.write_text(text.split("\n", 1)[1])
        assert load_run_config(path) == cfg


def test_a_preset_and_a_protocol_name_of_another_preset_are_refused(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("preset: demo\nprotocol:\n  name: paper\n")
    with pytest.raises(ConfigError, match=r"preset: demo.*protocol.name is 'paper'"):
        load_run_config(path)
    path.write_text("preset: demo\nprotocol:\n  name: my-study\n")  # a name of one's own is fine
    assert load_run_config(path).protocol.name == "my-study"


@pytest.mark.parametrize(("text", "named"), [
    ("protocol:\n  grid:\n    seeds: []\n", "grid.seeds is empty"),
    ("protocol:\n  grid:\n    depths: []\n", "grid.depths is empty"),
    ("protocol:\n  grid:\n    expansions: []\n", "grid.expansions is empty"),
    ("protocol:\n  grid:\n    models: []\n", "grid.models is empty"),
    ("cohort:\n  records: 0\n", "cohort.records must be > 0"),
    ("cohort:\n  patients: 0\n", "cohort.patients must be > 0"),
    ("cohort:\n  records: 100\n  patients: 500\n", r"cohort.patients \(500\) must be <= cohort.records"),
])
def test_empty_and_impossible_grids_are_refused_at_config_time(tmp_path, text, named):
    path = tmp_path / "cfg.yaml"
    path.write_text("preset: demo\n" + text)
    with pytest.raises(ConfigError, match=named):
        load_run_config(path)

