"""`raybench submit/status/logs/stop` plumbing: token lookup and the last-job memory.

The real Ray Jobs round trip against a `ray start` cluster is tests/app/test_remote_run.py.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from raybench.app import jobs
from raybench.app.cli import main


@pytest.fixture
def no_ray_env(monkeypatch, tmp_path):
    for var in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_token_follows_rays_lookup_order(no_ray_env, monkeypatch):
    home = no_ray_env
    assert jobs.auth_token() is None
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text("from-default-file\n")
    assert jobs.auth_token() == "from-default-file"
    path = home / "elsewhere"
    path.write_text("  from-path  ")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(path))
    assert jobs.auth_token() == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert jobs.auth_token() == "from-env"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert jobs.auth_token() is None


def test_empty_token_file_sends_nothing(no_ray_env):
    (no_ray_env / ".ray").mkdir()
    (no_ray_env / ".ray" / "auth_token").write_text("\n")
    assert jobs.auth_token() is None


def test_last_job_is_remembered(no_ray_env, monkeypatch):
    monkeypatch.setattr(jobs, "LAST_JOB_FILE", str(no_ray_env / ".raybench_last_job"))
    with pytest.raises(click.UsageError, match="no job id given"):
        jobs._job_or_last(None)
    jobs._remember("raysubmit_abc")
    assert jobs._job_or_last(None) == "raysubmit_abc"
    assert jobs._job_or_last("raysubmit_other") == "raysubmit_other"


# ---------------------------------------------------------------- the token never travels in clear text


@pytest.mark.parametrize("address", ["http://10.0.0.5:8265", "http://ray-head.example.org:8265", "10.0.0.5:8265",
                                     "ray://10.0.0.5:10001", "http://[2001:db8::1]:8265"])
def test_a_token_is_not_sent_over_plain_http_to_another_host(address):
    with pytest.raises(click.UsageError, match="refusing to send the cluster token over plain") as err:
        jobs.check_transport(address, "s3cret")
    assert "--allow-insecure-http" in str(err.value) and "s3cret" not in str(err.value)


@pytest.mark.parametrize("address", ["http://127.0.0.1:8265", "http://localhost:8265", "http://[::1]:8265",
                                     "127.0.0.1:8265", "http://127.5.6.7:8265", "https://ray.example.org"])
def test_a_token_may_go_to_loopback_or_https(address):
    jobs.check_transport(address, "s3cret")


@pytest.mark.parametrize("address", ["http://ray.localhost:8265", "http://evil.localhost:8265", "http://localhost.:8265",
                                     "auto", "local", "http://127.1:8265", "http://127.0.0.1.nip.io:8265",
                                     "http://0x7f000001:8265", "http://127.0.0.1@10.0.0.5:8265"])
def test_only_literal_loopback_addresses_skip_the_plain_http_check(address):
    """A name that only *may* resolve to loopback (`*.localhost` goes to DNS on most resolvers; `auto` reads the
    cluster's address file) could send the token across the network: only literal loopback addresses pass."""
    with pytest.raises(click.UsageError, match="refusing to send the cluster token"):
        jobs.check_transport(address, "s3cret")


@pytest.mark.parametrize("address", ["http://10.0.0.5:8265\\@127.0.0.1:8265", "http://evil.example\\@127.0.0.1:8265",
                                     "10.0.0.5:8265\\@127.0.0.1:8265", "http://10.0.0.5:8265\\@[::1]:8265/"])
def test_the_address_is_judged_as_the_http_client_connects_to_it(address):
    """urllib reads the host after the last `@`, but the HTTP client (requests/urllib3) ends the authority at the
    backslash and would connect to 10.0.0.5 or evil.example with the bearer token."""
    with pytest.raises(click.UsageError, match="refusing to send the cluster token over plain http:// to (10|evil)"):
        jobs.check_transport(address, "s3cret")
    assert not jobs._is_loopback(jobs.client_target(address)[1])


def test_localhost_passes_only_while_it_resolves_to_loopback(monkeypatch):
    import socket

    answer = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.0.0.5", 8265))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: answer)
    with pytest.raises(click.UsageError, match="refusing to send the cluster token"):
        jobs.check_transport("http://localhost:8265", "s3cret")


def test_plain_http_is_fine_without_a_token_or_with_the_opt_in():
    jobs.check_transport("http://10.0.0.5:8265", None)
    jobs.check_transport("http://10.0.0.5:8265", "s3cret", allow_insecure=True)


class FakeClient:
    """Stands in for JobSubmissionClient: records what a submit would send, and the uploaded files."""

    made: list[dict] = []

    def __init__(self, address, headers=None):
        self.address, self.headers = address, headers
        FakeClient.made.append({"address": address, "headers": headers})

    def submit_job(self, entrypoint, runtime_env, **kw):
        wd = Path(runtime_env["working_dir"])
        self.uploaded = sorted(p.relative_to(wd).as_posix() for p in wd.rglob("*") if p.is_file())
        FakeClient.made[-1].update(entrypoint=entrypoint, runtime_env=runtime_env, uploaded=self.uploaded, resources=kw,
                                   config=(wd / "conf" / "run.yaml").read_text() if (wd / "conf").exists() else None)
        return "raysubmit_fake"

    def get_job_info(self, job_id):
        return types.SimpleNamespace(status="RUNNING", message="")


@pytest.fixture
def fake_ray(no_ray_env, monkeypatch):
    import ray.job_submission

    FakeClient.made = []
    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", FakeClient)
    monkeypatch.setattr(jobs, "LAST_JOB_FILE", str(no_ray_env / ".raybench_last_job"))
    monkeypatch.delenv("RAYBENCH_ALLOW_INSECURE_HTTP", raising=False)
    return FakeClient


def test_commands_refuse_a_remote_http_address_when_a_token_would_be_sent(fake_ray, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_TOKEN", "s3cret")
    runner = CliRunner()
    for args in (["status", "--address", "http://10.0.0.5:8265", "j1"], ["stop", "--address", "http://10.0.0.5:8265"],
                 ["logs", "--address", "http://10.0.0.5:8265", "j1"],
                 ["submit", "--address", "http://10.0.0.5:8265", "--no-wait", "--", "grid"]):
        res = runner.invoke(main, args)
        assert res.exit_code == 2 and "refusing to send the cluster token" in res.output, (args, res.output)
    assert fake_ray.made == [], "no client was even created"
    # the token file in ~/.ray is a token too, and RAY_ADDRESS is an address too
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    (Path(os.environ["HOME"]) / ".ray").mkdir()
    (Path(os.environ["HOME"]) / ".ray" / "auth_token").write_text("local-cluster-token\n")
    monkeypatch.setenv("RAY_ADDRESS", "http://10.0.0.5:8265")
    res = runner.invoke(main, ["status", "j1"])
    assert res.exit_code == 2 and "refusing" in res.output and fake_ray.made == []
    # opting in (flag or env) sends it
    assert runner.invoke(main, ["status", "--allow-insecure-http", "j1"]).exit_code == 0
    monkeypatch.setenv("RAYBENCH_ALLOW_INSECURE_HTTP", "1")
    assert runner.invoke(main, ["status", "j1"]).exit_code == 0
    assert [m["headers"] for m in fake_ray.made] == [{"Authorization": "Bearer local-cluster-token"}] * 2
    # loopback needs no opt-in
    monkeypatch.delenv("RAYBENCH_ALLOW_INSECURE_HTTP")
    assert runner.invoke(main, ["status", "--address", "http://127.0.0.1:8265", "j1"]).exit_code == 0


def test_the_driver_runs_on_the_head_unless_asked_otherwise(fake_ray):
    """The launchers' head has `CPU: 0` so that it only drives: a submitted driver asking for a CPU could not run
    there, and would hold a worker node up for the whole run (or wait for the autoscaler to add one)."""
    runner = CliRunner()
    res = runner.invoke(main, ["submit", "--address", "http://127.0.0.1:8265", "--no-wait", "--", "grid"])
    assert res.exit_code == 0, res.output
    assert fake_ray.made[-1]["resources"] == {"entrypoint_num_cpus": None, "entrypoint_num_gpus": None}
    res = runner.invoke(main, ["submit", "--address", "http://127.0.0.1:8265", "--num-cpus", "1", "--no-wait", "--",
                               "grid"])
    assert res.exit_code == 0 and fake_ray.made[-1]["resources"]["entrypoint_num_cpus"] == 1.0


# ---------------------------------------------------------------- the working dir is an allow-list


def _project(root: Path) -> Path:
    """A raybench checkout with the things that must stay home beside it."""
    files = {
        "pyproject.toml": "[project]\nname = 'raybench'\n", "README.md": "# raybench\n",
        "raybench/__init__.py": "", "raybench/app/cli.py": "", "raybench/presets/demo.yaml": "x: 1\n",
        "raybench/__pycache__/cli.cpython-311.pyc": "", "conf/run.yaml": "preset: demo\n",
        "conf/other.yaml": "preset: paper\n", ".env": "AWS_SECRET_ACCESS_KEY=abc\n", ".git/config": "[core]\n",
        "runs/demo/manifest/manifest.parquet": "ids", "runs/demo/tables/cells.parquet": "cells",
        "data/record_list.csv": "subject_id,study_id\n", "notebooks/scratch.ipynb": "{}",
        "raybench.egg-info/PKG-INFO": "", "secrets/token": "t", "extra/weights.txt": "w",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


PROJECT_UPLOAD = ["README.md", "conf/run.yaml", "pyproject.toml", "raybench/__init__.py", "raybench/app/cli.py",
                  "raybench/presets/demo.yaml"]


def test_submit_uploads_only_the_allow_list(fake_ray, tmp_path, monkeypatch):
    monkeypatch.chdir(_project(tmp_path / "proj"))
    res = CliRunner().invoke(main, ["submit", "--no-wait", "--", "grid", "--config", "conf/run.yaml"])
    assert res.exit_code == 0, res.output
    sent = fake_ray.made[-1]
    assert sent["uploaded"] == PROJECT_UPLOAD
    assert set(sent["runtime_env"]) == {"working_dir"}
    assert sent["entrypoint"] == "python -m raybench.app.cli grid --config conf/run.yaml"
    assert not Path(sent["runtime_env"]["working_dir"]).exists(), "the staged copy is removed after the upload"


def test_config_files_outside_the_working_dir_are_staged_and_the_argument_rewritten(fake_ray, tmp_path, monkeypatch):
    proj = _project(tmp_path / "proj")
    outside = tmp_path / "elsewhere" / "ptbxl.yaml"
    outside.parent.mkdir()
    outside.write_text("preset: paper\n")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["submit", "--no-wait", "--working-dir", str(proj), "--include", "extra",
                                    "--", "grid", f"--config={outside}", "--run-dir", "s3://b/r"])
    assert res.exit_code == 0, res.output
    sent = fake_ray.made[-1]
    expected = [f for f in PROJECT_UPLOAD if f != "conf/run.yaml"] + ["_configs/ptbxl.yaml", "extra/weights.txt"]
    assert sent["uploaded"] == sorted(expected)
    assert sent["entrypoint"] == "python -m raybench.app.cli grid --config=_configs/ptbxl.yaml --run-dir s3://b/r"
    # a working dir that is not a checkout uploads its config alone (the cluster's installed raybench runs)
    wd = tmp_path / "job"
    wd.mkdir()
    (wd / "run.yaml").write_text("preset: demo\n")
    (wd / "notes.txt").write_text("x")
    res = CliRunner().invoke(main, ["submit", "--no-wait", "--working-dir", str(wd), "--", "grid", "--config",
                                    "run.yaml"])
    assert res.exit_code == 0 and fake_ray.made[-1]["uploaded"] == ["run.yaml"], res.output
    with pytest.raises(click.UsageError, match="--include"):
        jobs.stage_working_dir(proj, [], tmp_path / "stage", include=("../elsewhere",))


def test_two_config_files_with_one_name_are_staged_apart(tmp_path, monkeypatch):
    """`--config a/run.yaml ... --config b/run.yaml` from outside the working dir: each argument reads its own file."""
    proj = _project(tmp_path / "proj")
    paths = []
    for name, text in (("a", "preset: demo\n"), ("b", "preset: paper\n"), ("c", "preset: demo\n")):
        (tmp_path / name).mkdir()
        paths.append(tmp_path / name / "run.yaml")
        paths[-1].write_text(text)
    monkeypatch.chdir(tmp_path)
    args = ["grid", "--config", str(paths[0]), f"--config={paths[1]}", "--config", str(paths[2]), "--config",
            str(paths[0])]
    out, copied = jobs.stage_working_dir(proj, args, tmp_path / "stage")
    staged = [out[2], out[3].split("=", 1)[1], out[5], out[7]]
    assert staged[0] == "_configs/run.yaml" and staged[3] == staged[0]  # one file named twice: one copy
    assert len(set(staged[:3])) == 3 and all(s in copied for s in staged)
    for rel, src in zip(staged, [*paths, paths[0]], strict=True):
        assert (tmp_path / "stage" / rel).read_text() == src.read_text(), rel
