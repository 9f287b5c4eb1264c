"""Every launcher installs the raybench of this checkout, never a package a registry serves under that name.

`raybench cluster wheel` writes the wheel, SHA256SUMS and requirements.txt; cluster/aws.yaml and gcp.yaml mount
that folder on every node and cluster/kuberay/Dockerfile copies it into the KubeRay image. The slow test runs
each launcher's own install commands against a freshly built folder, in a clean virtualenv with the package
index switched off (PIP_NO_INDEX=1, no pip config): raybench must then import from that virtualenv, not from
this editable checkout.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from raybench import __version__
from raybench.app.cli import main
from raybench.app.cluster_cli import REQUIREMENTS, SUMS, WHEEL_DIR, find_checkout, runtime_requirements
from raybench.core.errors import USER_EXIT_CODE
from tests.fake_index import fake_sha256
from tests.fake_index import start as start_fake_index
from tests.venvs import clean_env, make_venv, venv_site_packages

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ROOT / "cluster"
CLOUD = [CLUSTER / "aws.yaml", CLUSTER / "gcp.yaml"]
LAUNCHERS = [*CLOUD, CLUSTER / "onprem.yaml"]  # onprem's set-up runs for real in tests/app/test_cluster_onprem.py
DOCKERFILE = CLUSTER / "kuberay" / "Dockerfile"
MOUNT = "~/raybench_wheel"  # where aws.yaml / gcp.yaml mount cluster/wheel on every node
SETUP_KEYS = ("setup_commands", "head_setup_commands", "worker_setup_commands")


# ---------------------------------------------------------------- reading the launchers' install commands


def _launcher_commands(path: Path) -> list[str]:
    cfg = yaml.safe_load(path.read_text())
    return [c for key in SETUP_KEYS for c in cfg.get(key) or []]


def _dockerfile() -> tuple[str, list[str]]:
    """(the COPY destination of the wheel folder, the RUN commands), continuation lines joined."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    copies = [shlex.split(ln)[-1].rstrip("/") for ln in lines if ln.startswith("COPY ")]
    runs = [ln[len("RUN "):] for ln in lines if ln.startswith("RUN ")]
    assert len(copies) == 1 and runs, "the Dockerfile copies the wheel folder once and installs it"
    return copies[0], runs


def _strings(obj) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def _every_command() -> dict[str, list[str]]:
    """Every string of every launcher and manifest (commands, entrypoints, runtime_env) and the Dockerfile's RUNs."""
    found = {p.relative_to(ROOT).as_posix(): _strings(yaml.safe_load(p.read_text()))
             for p in sorted(CLUSTER.rglob("*.yaml"))}
    found[DOCKERFILE.relative_to(ROOT).as_posix()] = _dockerfile()[1] if DOCKERFILE.exists() else []
    return found


def _pip_installs(command: str) -> list[list[str]]:
    """The arguments of each `pip install` in a shell command."""
    out = []
    for segment in re.split(r"&&|\|\||;|\n", command):
        try:
            words = shlex.split(segment)
        except ValueError:
            words = segment.split()
        for i, word in enumerate(words[:-1]):
            if re.fullmatch(r"(\S*/)?(pip3?|uv)", word) or (word == "-m" and words[i + 1] in ("pip", "pip3")):
                rest = words[i + 1:] if word != "-m" else words[i + 2:]
                if rest and rest[0] == "pip":  # uv pip install
                    rest = rest[1:]
                if rest and rest[0] == "install":
                    out.append(rest[1:])
                break
    return out


def _names_raybench(arg: str) -> bool:
    """A requirement spec for the name raybench (any version, extras, URL form), not a path to a wheel file."""
    return bool(re.match(r"raybench\s*(\[|[=<>!~@;]|$)", arg.strip().lower()))


def _runtime_env_pips(text: str) -> list[str]:
    try:
        env = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    if not isinstance(env, dict):
        return []
    specs = []
    for key in ("pip", "uv", "conda"):
        value = env.get(key)
        specs += _strings(value.get("packages", []) if isinstance(value, dict) else value or [])
    return specs


# ---------------------------------------------------------------- nothing installs raybench by name


def test_no_launcher_installs_raybench_by_name_from_a_registry():
    """Whoever registers the name `raybench` on a package index would run code on every node."""
    offenders = []
    for name, commands in _every_command().items():
        for command in commands:
            for args in _pip_installs(command):
                offenders += [f"{name}: pip install {a}" for a in args if _names_raybench(a)]
            offenders += [f"{name}: runtime_env {s}" for s in _runtime_env_pips(command) if _names_raybench(s)]
            if "git+" in command and "raybench" in command:
                offenders.append(f"{name}: {command}")
    assert not offenders, "raybench must come only from the wheel of `raybench cluster wheel`: " + "; ".join(offenders)


@pytest.mark.parametrize("name", [*(p.name for p in LAUNCHERS), "Dockerfile"])
def test_launchers_install_raybench_only_from_the_checked_wheel(name):
    commands = _dockerfile()[1] if name == "Dockerfile" else _launcher_commands(CLUSTER / name)
    wheel_installs = [(c, args) for c in commands for args in _pip_installs(c)
                      if any("whl" in a for a in args)]
    assert len(wheel_installs) == 1, f"{name}: one pip install of the shipped wheel, got {wheel_installs}"
    command, args = wheel_installs[0]
    assert {"--no-index", "--no-deps"} <= set(args), f"{name}: the wheel is installed with --no-index --no-deps"
    assert command.index(f"sha256sum -c {SUMS}") < command.index("--no-index"), f"{name}: sums checked first"
    assert f"-r {REQUIREMENTS}" in command, f"{name}: the dependencies come from the shipped {REQUIREMENTS}"
    assert f"--require-hashes -r {REQUIREMENTS}" in command, f"{name}: the dependencies are installed hash-checked"
    assert not any(re.match(r"(-i|--index-url|--extra-index-url|--find-links|-f)\b", a) for a in args)


@pytest.mark.parametrize("path", LAUNCHERS, ids=lambda p: p.name)
def test_launcher_mounts_the_folder_raybench_cluster_wheel_writes(path):
    cfg = yaml.safe_load(path.read_text())
    local = (cfg.get("file_mounts") or {}).get(MOUNT)
    assert local, f"{path.name}: file_mounts must ship the wheel folder to {MOUNT} on every node"
    assert Path(local) == WHEEL_DIR, f"{path.name}: {MOUNT} is {local}; `raybench cluster wheel` writes {WHEEL_DIR}"
    assert all(MOUNT in c for c in _launcher_commands(path) if "pip install" in c)
    assert find_checkout(None) == ROOT, "the default --out is this checkout's cluster/wheel"


def test_kuberay_runs_the_image_built_from_the_dockerfile():
    """The manifests run the image of cluster/kuberay/Dockerfile (Ray's image + the wheel), never Ray's bare image,
    whose `raybench grid` entrypoint would not exist, and no runtime_env installs raybench on top."""
    base = re.search(r"^FROM\s+(\S+)", DOCKERFILE.read_text(), re.M).group(1)
    assert base.startswith("rayproject/ray:")
    tag = base.split(":", 1)[1]
    for path in sorted((CLUSTER / "kuberay").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
        groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
        images = {c["image"] for g in groups for c in g["template"]["spec"]["containers"]}
        assert len(images) == 1, f"{path.name}: head and workers run one image, got {images}"
        image = images.pop()
        assert not image.startswith("rayproject/"), f"{path.name}: {image} lacks raybench"
        assert image.endswith(f"raybench-ray:{tag}"), f"{path.name}: {image} is not built FROM {base}"
        assert "runtimeEnvYAML" not in doc["spec"] or "raybench" not in doc["spec"]["runtimeEnvYAML"]


def test_readme_walks_through_the_commands_the_launchers_run():
    """cluster/README.md shows the node's install steps, the image build and the manifests' placeholder as they are."""
    readme = (CLUSTER / "README.md").read_text()
    for path in CLOUD:
        for command in _launcher_commands(path):
            steps = [s.strip() for s in command.split("&&") if not s.strip().startswith("cd ")]
            missing = [s for s in steps if s not in readme]
            assert not missing, f"cluster/README.md lacks {path.name}'s set-up steps {missing}"
        assert f"ray up cluster/{path.name}" in readme
    build = 'docker build -f cluster/kuberay/Dockerfile -t "$IMAGE" cluster/wheel'
    assert build in readme and build in DOCKERFILE.read_text()
    for path in sorted((CLUSTER / "kuberay").glob("*.yaml")):
        image = re.search(r"image:\s*(\S+)", path.read_text()).group(1)
        assert f'sed "s#{image}#$IMAGE#" cluster/kuberay/{path.name} | kubectl apply -f -' in readme, path.name
    assert "raybench cluster wheel" in readme and "tests/app/test_cluster_launchers.py" in readme


# ---------------------------------------------------------------- `raybench cluster wheel`


@pytest.fixture(scope="module")
def fake_index() -> str:
    """A package index on loopback (tests/fake_index.py): `raybench cluster wheel` pins the hashes it serves."""
    server, url = start_fake_index()
    yield url
    server.shutdown()


@pytest.fixture(scope="module")
def wheel_dir(tmp_path_factory, fake_index) -> Path:
    """A fresh `raybench cluster wheel` folder, built by the command line users run (hashes from fake_index)."""
    out = tmp_path_factory.mktemp("wheel") / "wheel"
    proc = subprocess.run([sys.executable, "-m", "raybench.app.cli", "cluster", "wheel", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_INDEX_URL": fake_index})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (out.parent / "stdout.txt").write_text(proc.stdout)
    return out


def test_cluster_wheel_writes_a_checked_wheel_and_its_dependencies(wheel_dir):
    import tomllib
    import zipfile

    wheels = sorted(wheel_dir.glob("raybench-*.whl"))
    assert [p.name for p in wheels] == [f"raybench-{__version__}-py3-none-any.whl"]
    assert sorted(p.name for p in wheel_dir.iterdir()) == sorted([wheels[0].name, SUMS, REQUIREMENTS])
    check = subprocess.run(["sha256sum", "-c", SUMS], cwd=wheel_dir, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.count(": OK") == 2, check.stdout + check.stderr
    names = zipfile.ZipFile(wheels[0]).namelist()
    assert "raybench/app/cluster_cli.py" in names and not any("__pycache__" in n for n in names)
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    reqs = runtime_requirements(wheels[0])
    assert [_norm(r) for r in reqs] == [_norm(d.split("#")[0]) for d in deps]
    tracking = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["tracking"]
    with_tracking = runtime_requirements(wheels[0], ("tracking",))
    assert [_norm(r) for r in with_tracking[len(reqs):]] == [_norm(d.split("#")[0]) for d in tracking]


def test_every_requirement_of_the_nodes_is_pinned_with_the_hashes_of_its_files(wheel_dir):
    """Floors let each node resolve its own versions: every dependency (and theirs) is pinned to this machine's
    version with the index's sha256 of its files, so `pip install --require-hashes` installs those or nothing."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    lines = [ln for ln in (wheel_dir / REQUIREMENTS).read_text().splitlines() if ln and not ln.startswith("#")]
    pinned = {}
    for line in lines:
        spec, *hashes = line.split(" --hash=sha256:")
        req = Requirement(spec)
        (version,) = [s.version for s in req.specifier if s.operator == "=="]
        assert hashes == [fake_sha256(req.name, version)], line  # the index's file of that version, no other
        pinned[req.name] = version
    assert not any(_names_raybench(r) for r in lines)
    for dep in tomllib_deps():
        req = Requirement(dep)
        assert req.name in pinned and req.specifier.contains(pinned[req.name], prereleases=True), (dep, pinned)
    assert pinned["torch"] == Version(importlib.metadata.version("torch")).public  # a local label (+cpu) dropped
    assert {"numpy", "packaging", "pyarrow"} <= set(pinned), "dependencies of dependencies are pinned too"
    wheel = next(wheel_dir.glob("*.whl"))
    from raybench.core.atomic import file_sha256

    printed = (wheel_dir.parent / "stdout.txt").read_text()
    assert f"wheel sha256: {file_sha256(wheel)}  {wheel.name}" in printed


def tomllib_deps() -> list[str]:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [d.split("#")[0].strip() for d in deps]


def test_a_dependency_the_index_does_not_offer_in_this_version_is_refused():
    from packaging.version import Version

    from raybench.app.cluster_lock import file_hashes
    from raybench.core.errors import RaybenchError

    page = {"files": [{"filename": "numpy-1.0.0-py3-none-any.whl", "hashes": {"sha256": "a" * 64}}]}
    assert file_hashes("http://index", "numpy", Version("1.0.0"), lambda url: page) == ["a" * 64]
    with pytest.raises(RaybenchError, match=r"offers no file of numpy==2\.0\.0"):
        file_hashes("http://index", "numpy", Version("2.0.0"), lambda url: page)


def _norm(req: str) -> str:
    from packaging.requirements import Requirement

    r = Requirement(req)
    return f"{r.name.lower()}{sorted(r.extras)}{r.specifier}"


def test_cluster_wheel_refuses_a_folder_it_did_not_write(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(main, ["cluster", "wheel", "--out", str(tmp_path)])
    assert result.exit_code == USER_EXIT_CODE, result.output
    assert "refusing to replace" in result.output and "notes.txt" in result.output
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_cluster_wheel_names_an_unknown_extra(wheel_dir):
    from raybench.core.errors import RaybenchError

    wheel = next(wheel_dir.glob("*.whl"))
    with pytest.raises(RaybenchError, match="no such extra"):
        runtime_requirements(wheel, ("nonesuch",))


# ---------------------------------------------------------------- running the launchers' own commands


def _venv(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clean virtualenv over the running interpreter's packages (torch, ray are there; tests/venvs.py: from a
    virtualenv as from the system python), and an environment without any package index."""
    venv = tmp_path / "venv"
    make_venv(venv)
    return venv, clean_env(venv)


def test_a_test_venv_sees_the_packages_of_a_virtualenv_running_the_suite(tmp_path):
    """README command 2 run inside a fresh `python3 -m venv`: the venv of the tests below must see the packages of
    the venv running the suite, which its base interpreter lacks (a nested `venv --system-site-packages` saw only
    the base's: no ray, so requirements.txt failed without an index). The running venv here is a stand-in
    holding one package of its own; from the system python `running_site_dirs` covers the base itself."""
    outer, inner = tmp_path / "outer", tmp_path / "inner"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(outer)], check=True)
    package = venv_site_packages(outer) / "only_in_the_running_venv"
    package.mkdir()
    (package / "__init__.py").write_text("")
    build = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; "
             f"from tests.venvs import make_venv; make_venv(Path({str(inner)!r}))")
    made = subprocess.run([str(outer / "bin" / "python"), "-c", build], env=clean_env(outer), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    probe = "import only_in_the_running_venv, sys; print(sys.prefix)"
    seen = subprocess.run([str(inner / "bin" / "python"), "-c", probe], env=clean_env(inner), cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert seen.returncode == 0, f"the nested venv lost the running venv's packages: {seen.stderr[-1000:]}"
    assert Path(seen.stdout.strip()) == inner


def _install_commands(name: str, mounted: Path) -> list[str]:
    """The launcher's install commands, its node-side wheel folder replaced by `mounted`."""
    if name == "Dockerfile":
        dest, runs = _dockerfile()
    else:
        dest, runs = MOUNT, _launcher_commands(CLUSTER / name)
    assert runs and all(dest in c for c in runs if "pip install" in c), f"{name}: installs from {dest}"
    return [c.replace(dest, str(mounted)) for c in runs]


def _run(commands: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    script = "set -euo pipefail\n" + "\n".join(commands)
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)


@pytest.mark.slow
@pytest.mark.parametrize("name", [*(p.name for p in CLOUD), "Dockerfile"])
def test_launcher_setup_installs_the_shipped_wheel_without_a_registry(name, wheel_dir, tmp_path):
    mounted = tmp_path / "mounted"
    shutil.copytree(wheel_dir, mounted)
    venv, env = _venv(tmp_path)
    proc = _run(_install_commands(name, mounted), env, tmp_path)
    assert proc.returncode == 0, f"{name} setup failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"

    version = subprocess.run([str(venv / "bin" / "raybench"), "--version"], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and __version__ in version.stdout, version.stdout + version.stderr
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import raybench; print(raybench.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    module = Path(where.stdout.strip())
    assert module.is_relative_to(venv) and "site-packages" in module.parts, \
        f"{name}: raybench imports from {module}, not from the wheel installed into {venv}"


def test_a_tampered_wheel_stops_the_node_setup(wheel_dir, tmp_path):
    """sha256sum -c runs before pip: a wheel changed on its way to the node is never installed."""
    mounted = tmp_path / "mounted"
    shutil.copytree(wheel_dir, mounted)
    wheel = next(mounted.glob("*.whl"))
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    venv, env = _venv(tmp_path)
    proc = _run(_install_commands("aws.yaml", mounted), env, tmp_path)
    assert proc.returncode != 0 and "FAILED" in proc.stdout + proc.stderr
    assert not (venv / "bin" / "raybench").exists()
