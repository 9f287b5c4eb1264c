"""Where a config file may send the data and the driver: a remote `run_dir` or a non-local `resources.address`
only when the user says so.

A config YAML is easy to receive from someone else (a shared recipe, a colleague's run). One that sets
`run_dir: s3://<their bucket>` would upload the cohort and the manifests (record ids) there with the user's own
credentials; one that sets `resources.address: ray://<their host>` would connect the driver, and ship the data, to
their cluster. So a destination outside this machine that comes from a config FILE needs an explicit confirmation
flag (`--trust-config-destinations`), and for a credentialed cohort it is refused even then: its destinations
must be typed on the command line (`--run-dir`, `--address`), where the user sees them.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from raybench.core.config import RunConfig
from raybench.core.errors import RaybenchError
from raybench.core.privacy import is_credentialed
from raybench.core.redaction import redact_uri

TRUST_FLAG = "--trust-config-destinations"
LOCAL_ADDRESSES = ("", "local", "auto")  # a new local instance, or the one this machine already runs


class DestinationError(RaybenchError):
    """A config file sends the run's data or driver off this machine without the user's confirmation."""


def is_remote_dir(run_dir: str) -> bool:
    """A run folder on object storage or another host (any scheme but file://)."""
    return "://" in run_dir and not run_dir.startswith("file://")


def is_local_address(address: str | None) -> bool:
    """None, `local`, `auto`, or a literal loopback host (127.0.0.0/8, ::1, localhost) in any Ray address form."""
    if address is None or address.strip().lower() in LOCAL_ADDRESSES:
        return True
    host = urlsplit(address if "://" in address else f"ray://{address}").hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def config_redirects(cfg: RunConfig, run_dir_given: bool, address_given: bool) -> list[str]:
    """The destinations off this machine that come from the config file (not from the command line)."""
    found = []
    if not run_dir_given and is_remote_dir(cfg.run_dir):
        found.append(f"run_dir: {redact_uri(cfg.run_dir)}")
    if not address_given and not is_local_address(cfg.resources.address):
        found.append(f"resources.address: {redact_uri(str(cfg.resources.address))}")
    return found


def check_destinations(cfg: RunConfig, source: str, *, run_dir_given: bool, address_given: bool,
                       trusted: bool) -> None:
    """Refuse a remote run_dir / non-local address read from the config file `source` unless `trusted` (the
    confirmation flag); for a credentialed cohort refuse it regardless (give it on the command line)."""
    found = config_redirects(cfg, run_dir_given, address_given)
    if not found:
        return
    what = "; ".join(found)
    if is_credentialed(cfg):
        raise DestinationError(
            f"{source} sends this credentialed cohort's run off this machine ({what}); a config file may not choose "
            "where credentialed data goes. Give the destination on the command line (--run-dir / --address) if you "
            "mean it, or remove it from the file")
    if not trusted:
        raise DestinationError(
            f"{source} sends the run off this machine ({what}): the cohort, its record ids and the driver would go "
            f"there with your credentials. If you wrote this config or trust it, pass {TRUST_FLAG}; or give the "
            "destination on the command line (--run-dir / --address)")
