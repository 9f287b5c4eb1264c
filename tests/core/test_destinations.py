"""raybench/core/destinations.py: a config FILE may not send the run's data or driver off this machine unasked."""

from __future__ import annotations

from dataclasses import replace

import pytest
from click.testing import CliRunner

from raybench.app.cli import main
from raybench.core.config import CohortConfig, demo_run
from raybench.core.destinations import DestinationError, check_destinations, is_local_address

THEIR_BUCKET = "s3://their-bucket/loot"
THEIR_HOST = "ray://203.0.113.9:10001"


@pytest.mark.parametrize(("address", "local"), [
    (None, True), ("auto", True), ("local", True), ("ray://127.0.0.1:10001", True), ("127.0.0.1:6379", True),
    ("ray://localhost:10001", True), ("ray://[::1]:10001", True),
    (THEIR_HOST, False), ("10.0.0.5:6379", False), ("ray://head.example.org:10001", False),
    ("ray://127.0.0.1.nip.io:10001", False)])
def test_only_loopback_or_a_local_instance_is_a_local_address(address, local):
    assert is_local_address(address) is local


def _cfg(run_dir: str = "runs/x", address: str | None = None, kind: str = "synth"):
    cfg = demo_run()
    return replace(cfg, run_dir=run_dir, resources=replace(cfg.resources, address=address),
                   cohort=replace(cfg.cohort, kind=kind) if kind != "synth" else cfg.cohort)


@pytest.mark.parametrize(("run_dir", "address", "named"), [
    (THEIR_BUCKET, None, f"run_dir: {THEIR_BUCKET}"), ("runs/x", THEIR_HOST, f"resources.address: {THEIR_HOST}")])
def test_a_remote_destination_from_a_file_needs_the_flag_and_is_refused_for_credentialed_cohorts(run_dir, address,
                                                                                                  named):
    with pytest.raises(DestinationError, match=r"evil\.yaml sends the run off this machine \(" + named):
        check_destinations(_cfg(run_dir, address), "evil.yaml", run_dir_given=False, address_given=False,
                           trusted=False)
    check_destinations(_cfg(run_dir, address), "evil.yaml", run_dir_given=False, address_given=False, trusted=True)
    with pytest.raises(DestinationError, match="credentialed cohort's run off this machine.*on the command line"):
        check_destinations(_cfg(run_dir, address, "mimic"), "evil.yaml", run_dir_given=False, address_given=False,
                           trusted=True)
    # typed on the command line: the user's own choice, credentialed or not
    check_destinations(_cfg(run_dir, address, "mimic"), "evil.yaml", run_dir_given=True, address_given=True,
                       trusted=False)


def test_a_local_config_needs_nothing():
    check_destinations(_cfg(), "mine.yaml", run_dir_given=False, address_given=False, trusted=False)


def _write(tmp_path, text: str):
    path = tmp_path / "evil.yaml"
    path.write_text("preset: demo\n" + text)
    return str(path)


def test_grid_refuses_a_config_file_that_sends_the_run_to_another_bucket(tmp_path):
    path = _write(tmp_path, f"run_dir: {THEIR_BUCKET}?sig=abc\n")
    res = CliRunner().invoke(main, ["grid", "--config", path, "--until", "cohort"])
    assert res.exit_code == 2 and f"sends the run off this machine (run_dir: {THEIR_BUCKET})" in res.output, res.output
    assert "--trust-config-destinations" in res.output and "sig=abc" not in res.output


def test_grid_refuses_a_config_file_that_sends_the_driver_to_another_cluster(tmp_path, monkeypatch):
    import raybench.app.pipeline as pipeline

    path = _write(tmp_path, f"run_dir: {tmp_path / 'run'}\nresources: {{address: '{THEIR_HOST}'}}\n")
    res = CliRunner().invoke(main, ["grid", "--config", path, "--until", "cohort"])
    assert res.exit_code == 2 and f"resources.address: {THEIR_HOST}" in res.output, res.output
    assert not (tmp_path / "run").exists()
    ran = []
    monkeypatch.setattr(pipeline, "run_pipeline", lambda cfg, **kw: ran.append(cfg) or {"total": 0.0})
    for extra in (["--address", "local"], ["--trust-config-destinations"]):  # typed, or confirmed
        ok = CliRunner().invoke(main, ["grid", "--config", path, "--until", "cohort", *extra])
        assert ok.exit_code == 0, ok.output
    assert [c.resources.address for c in ran] == ["local", THEIR_HOST]


def test_encode_refuses_a_config_file_that_sends_the_run_to_another_bucket(tmp_path):
    path = _write(tmp_path, f"run_dir: {THEIR_BUCKET}\n")
    res = CliRunner().invoke(main, ["encode", "--config", path])
    assert res.exit_code == 2 and "sends the run off this machine" in res.output, res.output


def test_a_credentialed_config_file_may_not_choose_a_remote_run_dir_even_with_the_flag(tmp_path):
    cohort = CohortConfig(kind="mimic", root=str(tmp_path / "mimic"))
    path = _write(tmp_path, f"run_dir: {THEIR_BUCKET}\ncohort: {{kind: mimic, root: '{cohort.root}'}}\n")
    res = CliRunner().invoke(main, ["grid", "--config", path, "--trust-config-destinations", "--until", "cohort"])
    assert res.exit_code == 2 and "credentialed cohort's run off this machine" in res.output, res.output
