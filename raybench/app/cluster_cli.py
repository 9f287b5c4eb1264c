"""`raybench cluster wheel`: package the raybench checkout on this machine for cluster nodes.

Nodes never ask a package registry for raybench (whoever registers that name would run code on every node
that holds ECGs and cloud credentials). The launchers (cluster/aws.yaml, gcp.yaml) mount the folder this
writes and the KubeRay image (cluster/kuberay/Dockerfile) copies it: `sha256sum -c SHA256SUMS`, then the
dependencies from requirements.txt, each pinned with the hashes of its files (`--require-hashes`,
raybench.app.cluster_lock), then raybench itself only from the wheel (`--no-index --no-deps`). The wheel's sha256 is
printed, to compare out of band with the one a node sees.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

import click

from raybench.core.atomic import atomic_dir, file_sha256
from raybench.core.errors import RaybenchError

WHEEL_DIR = Path("cluster") / "wheel"  # under the checkout; cluster/*.yaml's file_mounts name it (gitignored)
SUMS = "SHA256SUMS"
REQUIREMENTS = "requirements.txt"
# What a wheel build needs from a checkout; build/ and egg-info are left behind (a stale build/lib leaks
# deleted modules into the wheel).
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "MANIFEST.in", "setup.cfg", "setup.py")
PACKAGE = "raybench"
_OWN_NAME = re.compile(rf"{PACKAGE}-[^/]+\.whl|{SUMS}|{re.escape(REQUIREMENTS)}")
_EXTRA_MARKER = re.compile(r"""^extra\s*==\s*["']([^"']+)["']$""")


@click.group()
def cluster() -> None:
    """Ship this machine's raybench to cluster nodes (see cluster/README.md)."""


@cluster.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help=f"Folder to write (default: <checkout>/{WHEEL_DIR}, the folder cluster/*.yaml mount).")
@click.option("--source", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="The raybench checkout to build (default: the one this raybench runs from).")
@click.option("--extra", "extras", multiple=True,
              help="Also list an optional dependency group in requirements.txt (e.g. tracking); repeatable.")
def wheel(out: Path | None, source: Path | None, extras: tuple[str, ...]) -> None:
    """Build a wheel of the checkout, with SHA256SUMS and requirements.txt beside it, for `ray up` / docker build."""
    src = find_checkout(source)
    out = out if out is not None else src / WHEEL_DIR
    built = build_wheel_dir(src, out, extras)
    click.echo(f"wrote {built} (+ {SUMS}, {REQUIREMENTS}: every dependency pinned with hashes) from {src}")
    click.echo(f"wheel sha256: {file_sha256(built)}  {built.name}")
    click.echo(f"nodes check it with `cd <mounted folder> && sha256sum -c {SUMS}`; compare the sha256 above with "
               f"`sha256sum {built.name}` on a node, over another channel; see cluster/README.md")


def is_checkout(path: Path) -> bool:
    """A folder holding raybench's pyproject.toml and package (not an installed copy, which has neither)."""
    pyproject = path / "pyproject.toml"
    if not (pyproject.is_file() and (path / PACKAGE / "__init__.py").is_file()):
        return False
    try:
        return tomllib.loads(pyproject.read_text()).get("project", {}).get("name") == PACKAGE
    except tomllib.TOMLDecodeError:
        return False


def find_checkout(source: Path | None) -> Path:
    """The checkout to build: `--source`, else the one this raybench is imported from, else the current folder."""
    import raybench

    own = Path(raybench.__file__).resolve().parents[1]
    candidates = [source] if source is not None else [own, Path.cwd()]
    for path in candidates:
        if is_checkout(path):
            return path.resolve()
    raise RaybenchError(f"no raybench checkout at {' or '.join(map(str, candidates))} (a folder with raybench's "
                        "pyproject.toml and raybench/): clone the repository and run `raybench cluster wheel` "
                        "there, or pass --source CHECKOUT")


def build_wheel_dir(src: Path, out: Path, extras: tuple[str, ...] = ()) -> Path:
    """Write exactly one wheel, its requirements and SHA256SUMS to `out` (replaced atomically); return the wheel."""
    _refuse_foreign_folder(out)
    with tempfile.TemporaryDirectory(prefix="raybench-wheel-") as tmp:
        built = _pip_wheel(_copy_source(src, Path(tmp) / "src"), Path(tmp) / "dist")
        from raybench.app.cluster_lock import pinned_requirements

        requirements = pinned_requirements(runtime_requirements(built, extras))
        with atomic_dir(out) as stage:
            shutil.copy2(built, stage / built.name)
            (stage / REQUIREMENTS).write_text(
                f"# runtime dependencies of {built.name} and theirs, pinned to the versions of the machine that built "
                f"it,\n# each with the sha256 of its files on the package index: `pip install --require-hashes -r "
                f"{REQUIREMENTS}`;\n# {PACKAGE} itself is installed only from the wheel beside this file (--no-index "
                "--no-deps)\n" + "".join(f"{r}\n" for r in requirements))
            names = sorted([built.name, REQUIREMENTS])
            (stage / SUMS).write_text("".join(f"{file_sha256(stage / n)}  {n}\n" for n in names))
            stage.chmod(0o755)  # mkdtemp's 0700 would travel to the nodes; nothing here is secret
    return out / built.name


def _refuse_foreign_folder(out: Path) -> None:
    """`out` is replaced whole: refuse a folder holding anything this command did not write."""
    if not out.exists():
        return
    if not out.is_dir():
        raise RaybenchError(f"--out {out} is a file: pass a folder (default {WHEEL_DIR})")
    foreign = sorted(p.name for p in out.iterdir() if not (p.is_file() and _OWN_NAME.fullmatch(p.name)))
    if foreign:
        raise RaybenchError(f"refusing to replace {out}: it holds files `raybench cluster wheel` did not write "
                            f"({', '.join(foreign[:5])}); pass a new or empty folder with --out")


def _copy_source(src: Path, dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in SOURCE_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dest / name)
    shutil.copytree(src / PACKAGE, dest / PACKAGE, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def _pip_wheel(src: Path, dist: Path) -> Path:
    """pip builds with this environment's setuptools (no build isolation), so the build needs no package index."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "-q", "-w", str(dist), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dist.glob(f"{PACKAGE}-*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        tail = " ".join((proc.stderr or proc.stdout).split()[-60:])
        raise RaybenchError(f"building the wheel of {src.name} failed ({tail}); the build uses this environment's "
                            "setuptools: `python3 -m pip install 'setuptools>=78.1.1'` and retry")
    return wheels[0]


def runtime_requirements(wheel_path: Path, extras: tuple[str, ...] = ()) -> list[str]:
    """Requires-Dist of the wheel: the base ones, plus those of the named extras (their marker dropped)."""
    with zipfile.ZipFile(wheel_path) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    known = set(meta.get_all("Provides-Extra") or [])
    unknown = sorted(set(extras) - known)
    if unknown:
        raise RaybenchError(f"--extra {', '.join(unknown)}: {PACKAGE} has no such extra (it has {sorted(known)})")
    out = []
    for line in meta.get_all("Requires-Dist") or []:
        spec, _, marker = (part.strip() for part in line.partition(";"))
        extra = _EXTRA_MARKER.match(marker)
        if not marker or (not extra and "extra" not in marker):
            out.append(line.strip())
        elif extra and extra.group(1) in extras:
            out.append(spec)
    return list(dict.fromkeys(out))
