"""Laptop -> cluster: `raybench submit/status/logs/stop`, thin wrappers over Ray Jobs.

The job's entrypoint is `raybench ...` run on the cluster, where `raybench grid` attaches to the
cluster (RAY_ADDRESS is set by Ray Jobs) instead of starting a local instance. Clusters with token
auth need RAY_AUTH_TOKEN in the laptop's environment (see cluster/README.md).
"""

from __future__ import annotations

import os
import shlex
import time

import click

DEFAULT_ADDRESS = "http://127.0.0.1:8265"  # the port-forwarded dashboard
LAST_JOB_FILE = os.path.join(os.path.expanduser("~"), ".raybench_last_job")


def auth_token() -> str | None:
    """The cluster token, looked up like Ray does: RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token.

    Ray's HTTP client sends it only when RAY_AUTH_MODE=token is set in this process, but `ray start`
    enables token auth whenever a token file exists, so a bare JobSubmissionClient gets 401 from a
    default local cluster. RAY_AUTH_MODE=disabled opts out.
    """
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "disabled":
        return None
    token = os.environ.get("RAY_AUTH_TOKEN", "").strip()
    if token:
        return token
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    if os.path.isfile(path):
        with open(path) as fh:
            return fh.read().strip() or None
    return None


def _client(address: str | None):
    from ray.job_submission import JobSubmissionClient

    token = auth_token()
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return JobSubmissionClient(address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS, headers=headers)


def _remember(job_id: str) -> None:
    with open(LAST_JOB_FILE, "w") as fh:
        fh.write(job_id)


def _job_or_last(job_id: str | None) -> str:
    if job_id:
        return job_id
    if os.path.exists(LAST_JOB_FILE):
        return open(LAST_JOB_FILE).read().strip()
    raise click.UsageError("no job id given and no previous `raybench submit` recorded")


_address = click.option("--address", default=None,
                        help=f"Dashboard URL of the cluster (default: RAY_ADDRESS, else {DEFAULT_ADDRESS}).")


@click.command(context_settings={"ignore_unknown_options": True})
@_address
@click.option("--working-dir", default=".", show_default=True, help="Uploaded as the job's working_dir.")
@click.option("--pip", "pip_pkgs", multiple=True, help="Extra pip packages for the job's runtime_env.")
@click.option("--num-cpus", type=float, default=1.0, show_default=True, help="Entrypoint CPUs (the driver).")
@click.option("--num-gpus", type=float, default=0.0, show_default=True, help="Entrypoint GPUs (the driver).")
@click.option("--no-wait", is_flag=True, help="Return after submitting instead of following the logs.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(address: str | None, working_dir: str, pip_pkgs: tuple[str, ...], num_cpus: float, num_gpus: float,
           no_wait: bool, args: tuple[str, ...]) -> None:
    """Run `raybench ARGS` as a Ray job on a cluster, e.g. `raybench submit -- grid --config run.yaml`."""
    client = _client(address)
    runtime_env: dict = {"working_dir": working_dir,
                         "excludes": ["runs/", ".git/", "**/__pycache__/", "*.egg-info/"]}
    if pip_pkgs:
        runtime_env["pip"] = list(pip_pkgs)
    entrypoint = "python -m raybench.cli " + " ".join(shlex.quote(a) for a in args)
    job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                               entrypoint_num_cpus=num_cpus, entrypoint_num_gpus=num_gpus or None)
    _remember(job_id)
    click.echo(f"submitted {job_id}: {entrypoint}")
    if not no_wait:
        _follow(client, job_id)


@click.command()
@_address
@click.argument("job_id", required=False)
def status(address: str | None, job_id: str | None) -> None:
    """Show a job's status (default: the last submitted job)."""
    client = _client(address)
    job_id = _job_or_last(job_id)
    info = client.get_job_info(job_id)
    click.echo(f"{job_id}: {info.status}" + (f" ({info.message})" if info.message else ""))


@click.command()
@_address
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends.")
@click.argument("job_id", required=False)
def logs(address: str | None, follow: bool, job_id: str | None) -> None:
    """Print a job's logs (default: the last submitted job)."""
    client = _client(address)
    job_id = _job_or_last(job_id)
    if follow:
        _follow(client, job_id)
    else:
        click.echo(client.get_job_logs(job_id), nl=False)


@click.command()
@_address
@click.argument("job_id", required=False)
def stop(address: str | None, job_id: str | None) -> None:
    """Stop a running job (default: the last submitted job)."""
    client = _client(address)
    job_id = _job_or_last(job_id)
    click.echo(f"{job_id}: {'stop requested' if client.stop_job(job_id) else 'not running'}")


def _follow(client, job_id: str, poll_s: float = 1.0) -> None:
    """Stream logs by polling (works through any HTTP proxy), then report the final status."""
    from ray.job_submission import JobStatus

    printed = 0
    while True:
        text = client.get_job_logs(job_id)
        if len(text) > printed:
            click.echo(text[printed:], nl=False)
            printed = len(text)
        state = client.get_job_status(job_id)
        if state in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
            text = client.get_job_logs(job_id)
            click.echo(text[printed:], nl=False)
            click.echo(f"{job_id}: {state}")
            if state != JobStatus.SUCCEEDED:
                raise SystemExit(1)
            return
        time.sleep(poll_s)
