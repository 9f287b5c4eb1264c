"""`raybench submit/status/logs/stop` plumbing: token lookup and the last-job memory.

The real Ray Jobs round trip against a `ray start` cluster is tests/test_remote_run.py.
"""

from __future__ import annotations

import click
import pytest

from raybench import jobs


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
