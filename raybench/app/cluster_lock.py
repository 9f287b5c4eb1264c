"""requirements.txt for the cluster nodes: every runtime dependency pinned, with hashes (pip --require-hashes).

SHA256SUMS beside the wheel catches a corrupted copy, not a tampered one (whoever can change the wheel can change
the sums), and floors alone (`torch>=2.10`) let each node resolve its own versions, whatever the index serves that
day. So `raybench cluster wheel` pins the whole dependency closure to the versions of this environment (the ones
the suite ran with; a local label such as `+cpu` dropped, so a GPU node gets its own build of that release) and
lists, for each, the sha256 of every file the package index offers for that version (every platform's wheel),
read from the index's JSON simple API (PEP 691): a node then installs exactly those files or nothing. The wheel's
own sha256 is printed for a check out of band.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterable

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from raybench.core.errors import RaybenchError

SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
Fetch = Callable[[str], dict]


def _applies(marker: Marker | None, extras: Iterable[str]) -> bool:
    if marker is None:
        return True
    return any(marker.evaluate({"extra": e}) for e in (*extras, "")) if extras else marker.evaluate({"extra": ""})


def closure(requirements: Iterable[str], skip: str = "raybench") -> dict[str, Version]:
    """Every distribution the requirements pull in here (markers evaluated for this interpreter, extras followed):
    canonical name -> installed version. Refuses a requirement that is not installed in this environment."""
    todo = [(Requirement(r), ()) for r in requirements]
    found: dict[str, Version] = {}
    extras_seen: set[tuple[str, str]] = set()
    while todo:
        req, parent_extras = todo.pop()
        name = canonicalize_name(req.name)
        if name == skip or not _applies(req.marker, parent_extras):
            continue
        new_extras = {e for e in req.extras if (name, e) not in extras_seen}
        if name in found and not new_extras:
            continue
        try:
            dist = importlib.metadata.distribution(req.name)
        except importlib.metadata.PackageNotFoundError:
            raise RaybenchError(f"{req} is not installed in this environment ({sys.executable}), so its version "
                                "cannot be pinned for the nodes: install raybench's dependencies here "
                                "(`python3 -m pip install -e .`) and run `raybench cluster wheel` again") from None
        found[name] = Version(dist.version)
        extras_seen |= {(name, e) for e in req.extras}
        todo += [(Requirement(r), tuple(req.extras)) for r in dist.requires or []]
    return dict(sorted(found.items()))


def index_url() -> str:
    """The package index pip installs from here: PIP_INDEX_URL, else pip's configuration, else pip's default."""
    url = os.environ.get("PIP_INDEX_URL", "").strip()
    if not url:
        proc = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                              capture_output=True, text=True)
        url = proc.stdout.strip() if proc.returncode == 0 else ""
    if not url:
        from pip._internal.models.index import PyPI

        url = PyPI.simple_url
    return url.rstrip("/")


def _fetch_json(url: str) -> dict:
    request = urllib.request.Request(url, headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def _file_version(filename: str) -> Version | None:
    try:
        if filename.endswith(".whl"):
            return parse_wheel_filename(filename)[1]
        return parse_sdist_filename(filename)[1]
    except (ValueError, InvalidVersion):
        return None


def file_hashes(index: str, name: str, version: Version, fetch: Fetch = _fetch_json) -> list[str]:
    """The sha256 of every file the index offers for name==version (sorted, unique)."""
    try:
        page = fetch(f"{index}/{name}/")
    except Exception as err:
        raise RaybenchError(f"cannot read {name}'s files from the package index {index} ({type(err).__name__}: "
                            f"{err}); set PIP_INDEX_URL to an index this machine reaches and run `raybench cluster "
                            "wheel` again") from None
    hashes = {f["hashes"]["sha256"] for f in page.get("files", [])
              if isinstance(f, dict) and _file_version(str(f.get("filename", ""))) == version
              and isinstance(f.get("hashes"), dict) and f["hashes"].get("sha256")}
    if not hashes:
        raise RaybenchError(f"the package index {index} offers no file of {name}=={version} (the version installed "
                            "here), so it cannot be pinned with hashes: install a released version of it and run "
                            "`raybench cluster wheel` again")
    return sorted(hashes)


def pinned_requirements(requirements: Iterable[str], index: str | None = None, fetch: Fetch = _fetch_json
                        ) -> list[str]:
    """requirements.txt lines: `name==version --hash=sha256:... ...` for the whole closure of `requirements`."""
    index = index or index_url()
    lines = []
    for name, version in closure(requirements).items():
        public = Version(version.public)
        hashes = " ".join(f"--hash=sha256:{h}" for h in file_hashes(index, name, public, fetch))
        lines.append(f"{name}=={public} {hashes}")
    return lines
