"""Laptop -> cluster: `raybench submit/status/logs/stop`, thin wrappers over Ray Jobs.

The job's entrypoint is `raybench ...` run on the cluster, where `raybench grid` attaches to the
cluster (RAY_ADDRESS is set by Ray Jobs) instead of starting a local instance. Clusters with token
auth need RAY_AUTH_TOKEN in the laptop's environment (see cluster/README.md).

Two things never leave the laptop by accident:
- the token: it is sent only over https or to a literal loopback address (the port-forwarded dashboard); plain
  http to any other host is refused unless --allow-insecure-http (or RAYBENCH_ALLOW_INSECURE_HTTP=1) says
  the network is trusted;
- files: the job's working_dir is a staged copy of an allow-list (pyproject.toml, README.md, raybench/,
  the config files named by --config, and --include paths), never the whole current folder (run folders,
  data, credentials, .git).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import shlex
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import click

from raybench.core.errors import RaybenchError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"  # the port-forwarded dashboard
LAST_JOB_FILE = os.path.join(os.path.expanduser("~"), ".raybench_last_job")
INSECURE_ENV = "RAYBENCH_ALLOW_INSECURE_HTTP"
PROJECT_FILES = ("pyproject.toml", "README.md")  # uploaded with raybench/ when the working dir is a checkout
PACKAGE_DIR = "raybench"
CONFIG_OPTIONS = ("--config",)
STAGED_CONFIGS = "_configs"  # config files from outside the working dir land here (the argument is rewritten)


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


def _is_loopback_ip(text: str) -> bool:
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def _is_loopback(host: str) -> bool:
    """A literal loopback address (127.0.0.0/8, ::1), or exactly `localhost` while this machine resolves it to
    loopback only (its hosts file). Not `*.localhost` or `localhost.`: most resolvers ask DNS for those."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.lower() != "localhost":
        return _is_loopback_ip(host)
    try:
        answers = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(answers) and all(_is_loopback_ip(str(a[4][0]).split("%", 1)[0]) for a in answers)


def client_target(address: str) -> tuple[str, str]:
    """(scheme, host) the job client really connects to for `address`: Ray's client prefixes http:// to an address
    without a scheme, drops trailing slashes and appends the endpoint, and `requests` (urllib3) parses the result;
    so is it parsed here. `urllib.parse` would read `http://HOST:PORT\\@127.0.0.1:8265` as 127.0.0.1, where the
    client connects to HOST:PORT. ("", "") when the client could not parse it either."""
    import requests
    from urllib3.util import parse_url

    url = (address if "://" in address else f"http://{address}").rstrip("/")
    try:
        parts = parse_url(requests.Request("GET", f"{url}/api/version").prepare().url)
    except (requests.exceptions.RequestException, ValueError):
        return "", ""
    return (parts.scheme or "").lower(), parts.host or ""


def check_transport(address: str, token: str | None, allow_insecure: bool = False) -> None:
    """Refuse to send `token` in clear text: only https, or plain http to a literal loopback address (a
    port-forward). An address without a scheme (host:port) is reached over http too; `auto`/`local` are
    refused too (where they lead is read from files at connect time), so name the dashboard's address. The
    address is judged as the HTTP client parses it (`client_target`), and must read the same way to urllib."""
    if not token or allow_insecure:
        return
    parts = urlsplit(address if "://" in address else f"http://{address}")
    scheme, host = client_target(address)
    same = scheme == (parts.scheme or "").lower() and host.strip("[]") == (parts.hostname or "").strip("[]").lower()
    if address not in ("auto", "local") and same and (scheme == "https" or _is_loopback(host)):
        return
    raise click.UsageError(
        f"refusing to send the cluster token over plain {scheme or parts.scheme}:// to {host or address}: anyone on "
        "the network path could read it and run code on the cluster (only https:// or a literal loopback address "
        "such as 127.0.0.1 or [::1] is trusted). Use an https:// address, or forward the "
        f"dashboard and use {DEFAULT_ADDRESS} (cluster/README.md); if this network is trusted, pass "
        f"--allow-insecure-http (or set {INSECURE_ENV}=1). The token came from RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH "
        "or ~/.ray/auth_token; RAY_AUTH_MODE=disabled sends none.")


class JobsError(RaybenchError, RuntimeError):
    """No Ray Jobs server answers, or it refused the request (an unknown job id)."""


def _address_of(address: str | None) -> str:
    return address or os.environ.get("RAY_ADDRESS") or DEFAULT_ADDRESS


@contextlib.contextmanager
def _reaching(address: str | None, command: str) -> Iterator[None]:
    """Ray Jobs' connection and request failures as one JobsError line (the CLI prints it, exit 2)."""
    where = _address_of(address)
    try:
        yield
    except ConnectionError:
        raise JobsError(f"no Ray cluster answers at {where}: start one (`ray start --head`, or port-forward a "
                        "cluster's dashboard) or pass its dashboard URL with --address / RAY_ADDRESS; "
                        f"`raybench {command}` talks to Ray Jobs on a cluster (a run folder's state is in its "
                        "report.html)") from None
    except RuntimeError as err:
        if isinstance(err, RaybenchError):
            raise
        raise JobsError(f"Ray Jobs at {where} refused `raybench {command}`: {' '.join(str(err).split())[:300]}") \
            from err


def _insecure_opt_in(flag: bool) -> bool:
    return flag or os.environ.get(INSECURE_ENV, "").strip().lower() in ("1", "true", "yes")


def _client(address: str | None, allow_insecure: bool = False):
    address = _address_of(address)
    token = auth_token()
    check_transport(address, token, _insecure_opt_in(allow_insecure))
    from ray.job_submission import JobSubmissionClient

    headers = {"Authorization": f"Bearer {token}"} if token else None
    return JobSubmissionClient(address, headers=headers)


def stage_working_dir(source: str | Path, args: tuple[str, ...] | list[str], dest: str | Path,
                      include: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Copy the job's allow-list from `source` into `dest`; return (args with staged config paths, files copied).

    Uploaded: pyproject.toml, README.md and raybench/ (when `source` is a raybench checkout; caches left out),
    each file named by --config (relative paths are taken from `source`, as the job will read them, then from
    the current folder; a file outside `source` goes to _configs/ and the argument is rewritten), and every
    `include` path inside `source`. A --config path that exists on neither side is left as a cluster path.
    """
    source, dest = Path(source).resolve(), Path(dest)
    copied: list[str] = []

    def put(path: Path, rel: str) -> None:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            shutil.copytree(path, target, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", ".*"))
            copied.extend(sorted(p.relative_to(dest).as_posix() for p in target.rglob("*") if p.is_file()))
        else:
            shutil.copy2(path, target)
            copied.append(rel)

    if (source / PACKAGE_DIR / "__init__.py").is_file():
        for name in PROJECT_FILES:
            if (source / name).is_file():
                put(source / name, name)
        put(source / PACKAGE_DIR, PACKAGE_DIR)
    for item in include:
        path = (source / item).resolve()
        if not path.exists() or source not in (path, *path.parents):
            raise click.UsageError(f"--include {item}: not a path inside the working dir {source}")
        put(path, path.relative_to(source).as_posix())

    out = list(args)
    staged: dict[str, Path] = {}  # config rel path -> the file it holds
    i = 0
    while i < len(out):
        arg, value, joined = out[i], None, False
        if arg in CONFIG_OPTIONS and i + 1 < len(out):
            value = out[i + 1]
        elif arg.startswith("--config="):
            value, joined = arg.split("=", 1)[1], True
        if value is not None:
            given = Path(value).expanduser()
            candidates = (given,) if given.is_absolute() else (source / given, Path.cwd() / given)
            found = next((p.resolve() for p in candidates if p.is_file()), None)
            if found is not None:
                rel = found.relative_to(source).as_posix() if source in found.parents \
                    else _staged_name(found, staged, copied)
                if rel not in copied:
                    put(found, rel)
                staged[rel] = found
                if joined:
                    out[i] = f"--config={rel}"
                else:
                    out[i + 1] = rel
        i += 1 if joined or value is None else 2
    return out, copied


def _staged_name(found: Path, staged: dict[str, Path], copied: list[str]) -> str:
    """Where a config from outside the working dir lands: _configs/<name>, or _configs/<n>/<name> when another
    file already holds that name (two `run.yaml` from different folders must not share one copy)."""
    for n in itertools.count(1):
        rel = f"{STAGED_CONFIGS}/{found.name}" if n == 1 else f"{STAGED_CONFIGS}/{n}/{found.name}"
        if staged.get(rel) == found or (rel not in staged and rel not in copied):
            return rel
    raise AssertionError("unreachable")


@contextlib.contextmanager
def staged_working_dir(source: str | Path, args: tuple[str, ...], include: tuple[str, ...] = ()
                       ) -> Iterator[tuple[str, list[str], list[str]]]:
    """A temporary folder holding the allow-list; yields (folder, rewritten args, files). Removed on exit."""
    with tempfile.TemporaryDirectory(prefix="raybench-job-") as tmp:
        out, files = stage_working_dir(source, args, tmp, include)
        yield tmp, out, files


def _remember(job_id: str) -> None:
    with open(LAST_JOB_FILE, "w") as fh:
        fh.write(job_id)


def _job_or_last(job_id: str | None) -> str:
    if job_id:
        return job_id
    if os.path.exists(LAST_JOB_FILE):
        return open(LAST_JOB_FILE).read().strip()
    raise click.UsageError("no job id given and no previous `raybench submit` recorded")


def _address(fn):
    fn = click.option("--allow-insecure-http", "allow_insecure", is_flag=True,
                      help=f"Send the cluster token over plain http to a non-loopback address (trusted networks "
                           f"only; also {INSECURE_ENV}=1).")(fn)
    return click.option("--address", default=None,
                        help=f"Dashboard URL of the cluster (default: RAY_ADDRESS, else {DEFAULT_ADDRESS}).")(fn)


@click.command(context_settings={"ignore_unknown_options": True})
@_address
@click.option("--working-dir", default=".", show_default=True,
              help="Project folder the job's files come from: pyproject.toml, README.md, raybench/ and the "
                   "--config file(s) are uploaded, nothing else.")
@click.option("--include", multiple=True, help="Also upload this path (inside --working-dir); repeatable.")
@click.option("--pip", "pip_pkgs", multiple=True, help="Extra pip packages for the job's runtime_env.")
@click.option("--num-cpus", type=float, default=0.0, show_default=True,
              help="Entrypoint CPUs (the driver). 0 runs it on the head, as the launchers' CPU-0 head intends; a "
                   "number puts it on a node with that many free CPUs (a worker held up for the whole run).")
@click.option("--num-gpus", type=float, default=0.0, show_default=True, help="Entrypoint GPUs (the driver).")
@click.option("--no-wait", is_flag=True, help="Return after submitting instead of following the logs.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED, required=True)
def submit(address: str | None, allow_insecure: bool, working_dir: str, include: tuple[str, ...],
           pip_pkgs: tuple[str, ...], num_cpus: float, num_gpus: float, no_wait: bool, args: tuple[str, ...]) -> None:
    """Run `raybench ARGS` as a Ray job on a cluster, e.g. `raybench submit -- grid --config run.yaml`."""
    with _reaching(address, "submit"):
        _submit(_client(address, allow_insecure), working_dir, include, pip_pkgs, num_cpus, num_gpus, no_wait, args)


def _submit(client, working_dir: str, include: tuple[str, ...], pip_pkgs: tuple[str, ...], num_cpus: float,
            num_gpus: float, no_wait: bool, args: tuple[str, ...]) -> None:
    with staged_working_dir(working_dir, args, include) as (staged, args, files):
        shown = sorted({f.split("/", 1)[0] + ("/" if "/" in f else "") for f in files})
        click.echo(f"uploading {len(files)} files: {', '.join(shown) or '(none)'}")
        runtime_env: dict = {"working_dir": staged}
        if pip_pkgs:
            runtime_env["pip"] = list(pip_pkgs)
        entrypoint = "python -m raybench.app.cli " + " ".join(shlex.quote(a) for a in args)
        job_id = client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                                   entrypoint_num_cpus=num_cpus or None, entrypoint_num_gpus=num_gpus or None)
    _remember(job_id)
    click.echo(f"submitted {job_id}: {entrypoint}")
    if not no_wait:
        _follow(client, job_id)


@click.command()
@_address
@click.argument("job_id", required=False)
def status(address: str | None, allow_insecure: bool, job_id: str | None) -> None:
    """Show the state of a Ray Jobs job sent by `raybench submit` (default: the last one); not a run folder's."""
    with _reaching(address, "status"):
        client = _client(address, allow_insecure)
        job_id = _job_or_last(job_id)
        info = client.get_job_info(job_id)
    click.echo(f"{job_id}: {info.status}" + (f" ({info.message})" if info.message else ""))


@click.command()
@_address
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the job ends.")
@click.argument("job_id", required=False)
def logs(address: str | None, allow_insecure: bool, follow: bool, job_id: str | None) -> None:
    """Print the logs of a Ray Jobs job sent by `raybench submit` (default: the last one)."""
    with _reaching(address, "logs"):
        client = _client(address, allow_insecure)
        job_id = _job_or_last(job_id)
        if follow:
            _follow(client, job_id)
        else:
            click.echo(client.get_job_logs(job_id), nl=False)


@click.command()
@_address
@click.argument("job_id", required=False)
def stop(address: str | None, allow_insecure: bool, job_id: str | None) -> None:
    """Stop a running Ray Jobs job sent by `raybench submit` (default: the last one)."""
    with _reaching(address, "stop"):
        client = _client(address, allow_insecure)
        job_id = _job_or_last(job_id)
        stopped = client.stop_job(job_id)
    click.echo(f"{job_id}: {'stop requested' if stopped else 'not running'}")


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
