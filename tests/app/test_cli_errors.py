"""User errors print one `Error: ...` line naming the file/key/record and the fix (exit code 2), no traceback;
`raybench --verbose` keeps the traceback for a bug report."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from raybench.app.cli import main
from raybench.core.errors import USER_EXIT_CODE, RaybenchError


def _run(args: list[str]):
    return CliRunner().invoke(main, args)


def _assert_user_error(res, *needles: str) -> None:
    assert res.exit_code == USER_EXIT_CODE, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error: ")]
    assert len(lines) == 1, res.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_config_key(tmp_path):
    cfg = tmp_path / "my.yaml"
    cfg.write_text("preset: demo\nbogus_key: 1\n")
    _assert_user_error(_run(["grid", "--config", str(cfg)]), str(cfg), "bogus_key")


def test_malformed_yaml_names_the_file(tmp_path):
    cfg = tmp_path / "broken.yaml"
    cfg.write_text("preset: demo\ncohort: {kind: ptbxl\n")
    _assert_user_error(_run(["grid", "--config", str(cfg)]), "malformed YAML", str(cfg))


def test_missing_ptbxl_folder(tmp_path):
    res = _run(["manifest", "ptbxl", str(tmp_path / "nowhere"), "--out", str(tmp_path / "m")])
    _assert_user_error(res, "nowhere")


def test_broken_manifest_names_the_file_and_the_fix(tmp_path):
    run = tmp_path / "run"
    (run / "manifest").mkdir(parents=True)
    (run / "manifest" / "manifest.parquet").write_bytes(b"not a parquet file")
    res = _run(["encode", "--run-dir", str(run)])
    _assert_user_error(res, "manifest.parquet")


def test_missing_run_folder(tmp_path):
    _assert_user_error(_run(["analyze", "--run-dir", str(tmp_path / "none")]), "none")


@pytest.mark.slow
def test_missing_checkpoint_names_the_model_and_file(ray_cluster, tmp_path):
    assert _run(["cohort", "synth", "--out", str(tmp_path / "c"), "--records", "12", "--patients", "6"]).exit_code == 0
    run = tmp_path / "run"
    assert _run(["manifest", "synth", str(tmp_path / "c"), "--out", str(run / "manifest")]).exit_code == 0
    missing = tmp_path / "missing.pth"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"preset: demo\nrun_dir: {run}\nprotocol: {{grid: {{models: [csfm]}}}}\n"
                   f"encoders: {{size: full, checkpoints: {{csfm: {missing}}}}}\n")
    _assert_user_error(_run(["encode", "--run-dir", str(run), "--config", str(cfg)]), "csfm", str(missing))


def test_verbose_keeps_the_traceback(tmp_path):
    cfg = tmp_path / "my.yaml"
    cfg.write_text("preset: demo\nbogus_key: 1\n")
    res = _run(["--verbose", "grid", "--config", str(cfg)])
    assert res.exit_code != 0
    assert isinstance(res.exception, RaybenchError)


def test_every_input_error_class_is_a_user_error():
    from raybench.cohorts.manifest import ManifestError
    from raybench.cohorts.waveforms import RecordError
    from raybench.core.config import ConfigError
    from raybench.encoders.base import CheckpointError
    from raybench.encoders.extract import ExtractionError
    from raybench.encoders.store import StoreError
    from raybench.infra.storage import StorageError

    for cls in (ConfigError, ManifestError, RecordError, CheckpointError, ExtractionError, StoreError, StorageError):
        assert issubclass(cls, RaybenchError), cls


def test_a_bug_is_not_disguised_as_a_user_error():
    import click

    @click.command("boom")
    def boom() -> None:
        raise ZeroDivisionError("a bug")

    main.add_command(boom)
    try:
        res = _run(["boom"])
    finally:
        main.commands.pop("boom")
    assert isinstance(res.exception, ZeroDivisionError) and res.exit_code == 1


# ---------------------------------------------------------------- issue 39: bad inputs as named cases

def _grid_config(tmp_path, body: str) -> list[str]:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"preset: demo\nrun_dir: {tmp_path / 'run'}\ncohort: {{kind: synth, records: 12, patients: 6}}\n"
                   + body)
    return ["grid", "--config", str(cfg), "--until", "cohort"]


GRID_REFUSALS = {  # name -> (config body, what the one line names); refused before any stage writes anything
    "checkpoint_key_in_wrong_case": ("encoders: {checkpoints: {ECG_FM: /w.pt}}\n", ("'ECG_FM'", "ecg_fm")),
    "checkpoint_key_not_a_model": ("encoders: {checkpoints: {ecgfm: /w.pt}}\n", ("'ecgfm'", "cardiac_fm")),
    "unknown_model": ("protocol: {grid: {models: [ecgfm]}}\n", ("unknown model 'ecgfm'", "ecg_fm")),
    "missing_checkpoint_file": ("encoders: {size: full, checkpoints: {csfm: /nowhere/csfm.pth}}\n",
                                ("encoders.checkpoints.csfm", "/nowhere/csfm.pth")),
}


@pytest.mark.parametrize("case", sorted(GRID_REFUSALS))
def test_grid_refuses_models_and_checkpoints_before_any_stage(tmp_path, case):
    body, needles = GRID_REFUSALS[case]
    res = _run(_grid_config(tmp_path, body))
    _assert_user_error(res, *needles)
    assert "--verbose" not in res.output, "a config typo needs no traceback"
    assert not (tmp_path / "run").exists(), "nothing written: checked before the cohort stage"


CLUSTER_COMMANDS = {
    "status": ["status", "--address", "http://127.0.0.1:9"],
    "logs": ["logs", "--address", "http://127.0.0.1:9"],
    "stop": ["stop", "--address", "http://127.0.0.1:9", "raysubmit_x"],
    "submit": ["submit", "--address", "http://127.0.0.1:9", "--", "grid"],
}


@pytest.mark.parametrize("command", sorted(CLUSTER_COMMANDS))
def test_cluster_commands_without_a_cluster_print_one_line(command, monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    res = _run(CLUSTER_COMMANDS[command])
    _assert_user_error(res, "no Ray cluster answers at http://127.0.0.1:9", f"`raybench {command}` talks to Ray Jobs")
    assert "--verbose" not in res.output


def test_the_traceback_hint_only_where_a_traceback_helps():
    from raybench.app.cli import _one_line
    from raybench.core.config import ConfigError

    assert "--verbose" not in _one_line(ConfigError("encoders.checkpoints: 'X' is not a model"))
    try:
        try:
            raise OSError("disk says no")
        except OSError as err:
            raise ConfigError("cannot read the config") from err
    except ConfigError as wrapped:
        assert "--verbose" in _one_line(wrapped)


def test_export_errors_exit_2(tmp_path):
    res = _run(["export", "--run-dir", str(tmp_path / "none"), "--to", str(tmp_path / "out")])
    _assert_user_error(res, "none")


# ---------------------------------------------------------------- issue 39, point 7: the smaller cases

def _fake(tmp_path):
    from tests.fake_run import small_protocol, write_fake_run

    return write_fake_run(tmp_path / "run", small_protocol(), tables=("cells", "profiles"))


def test_a_failed_train_leaves_the_folder_untouched(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    _assert_user_error(_run(["train", "--run-dir", str(empty)]), "no manifest", "raybench manifest")
    assert list(empty.iterdir()) == [], "no demo run.yaml that would refuse a later `grid --config`"


def test_a_header_only_ptbxl_csv_is_no_manifest(tmp_path, ptbxl_sample):
    root = tmp_path / "ptbxl"
    root.mkdir()
    (root / "ptbxl_database.csv").write_text((ptbxl_sample / "ptbxl_database.csv").read_text().splitlines()[0] + "\n")
    (root / "scp_statements.csv").write_text((ptbxl_sample / "scp_statements.csv").read_text())
    res = _run(["manifest", "ptbxl", str(root), "--out", str(tmp_path / "m")])
    _assert_user_error(res, str(root), "no usable record", "lists no record")
    assert not (tmp_path / "m").exists()


def test_rate_100_without_records100_is_no_manifest(tmp_path, ptbxl_sample, ray_cluster):
    root = tmp_path / "ptbxl"
    root.mkdir()
    for name in ("ptbxl_database.csv", "scp_statements.csv"):
        (root / name).write_text((ptbxl_sample / name).read_text())
    (root / "records500").symlink_to(ptbxl_sample / "records500")
    res = _run(["manifest", "ptbxl", str(root), "--rate", "100", "--out", str(tmp_path / "m")])
    _assert_user_error(res, "no usable record", "--rate")
    assert not (tmp_path / "m").exists()


def test_compare_refuses_a_folder_that_is_no_run_without_naming_a_missing_option(tmp_path):
    run, other = _fake(tmp_path), tmp_path / "other"
    other.mkdir()
    res = _run(["compare", str(run), str(other)])
    _assert_user_error(res, str(other), "no run.yaml")
    assert "--config" not in res.output


def test_compare_warns_that_a_run_compared_with_itself_agrees_by_construction(tmp_path, monkeypatch):
    import raybench.analysis.compare.run as compare_run

    run = _fake(tmp_path)

    def stop(*a, **k):
        raise RaybenchError("stopped after the checks")

    monkeypatch.setattr(compare_run, "check_comparable", stop)
    res = _run(["compare", str(run), str(run)])
    assert "WARNING:" in res.output and "are the same run" in res.output, res.output


@pytest.mark.parametrize(("content", "needle"), [(b"", "the file is empty (0 bytes)"),
                                                 (bytes(range(256)) * 4, "not a checkpoint raybench can read")],
                         ids=["empty_file", "random_bytes"])
@pytest.mark.parametrize("model", ["csfm", "ecg_fm", "hubert_ecg"])
def test_checkpoint_inspect_says_why_in_its_own_words(tmp_path, content, needle, model):
    path = tmp_path / "w.pt"
    path.write_bytes(content)
    res = _run(["checkpoint", "inspect", str(path), "--model", model])
    _assert_user_error(res, str(path), needle)
    assert "weights_only=False" not in res.output and "will likely succeed" not in res.output


def test_features_names_an_unknown_model(tmp_path):
    res = _run(["features", "--run-dir", str(_fake(tmp_path)), "--model", "ecgfm", "--concept", "qt",
                "--out", str(tmp_path / "o")])
    _assert_user_error(res, "unknown model 'ecgfm'", "ecg_fm")


def test_top_level_help_keeps_whole_sentences_and_train_help_counts_nothing():
    commands = _run(["--help"]).output.split("Commands:")[1]
    assert "..." not in commands
    assert " ".join(commands.split()).count("Compute the analysis tables (Ray bootstraps), then figures, the release "
                                            "audit and report.html.") == 1
    assert "450" not in _run(["train", "--help"]).output
