"""pyproject.toml: dependency floors that security fixes depend on."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _requirement(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [r for r in map(Requirement, deps) if r.name.lower() == name]
    assert len(found) == 1, f"expected exactly one {name} requirement in pyproject.toml, got {found}"
    return found[0]


def test_torch_floor_excludes_the_weights_only_bypasses():
    """A crafted checkpoint runs code through torch.load(weights_only=True) in torch < 2.6 (CVE-2025-32434) and
    < 2.10 (CVE-2026-24747); raybench's refusal of foreign checkpoints rests on that loader."""
    spec = _requirement("torch").specifier
    floors = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=", "===")]
    floors += [Version(s.version) for s in spec if s.operator == ">"]
    assert floors, f"torch requirement {spec} has no lower bound"
    assert max(floors) >= Version("2.10"), f"torch requirement {spec} admits versions below 2.10"
    for bad in ("2.4.0", "2.5.1", "2.6.0", "2.9.1", "2.10.0rc1"):
        assert not spec.contains(bad, prereleases=True), f"torch requirement {spec} admits {bad}"
    assert spec.contains("2.10.0") and spec.contains("2.13.0")


def _requirements(where: str) -> list[Requirement]:
    """The requirement strings under one pyproject.toml key path, e.g. `project.optional-dependencies.test`."""
    node = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for key in where.split("."):
        node = node[key]
    return [Requirement(r) for r in node]


@pytest.mark.parametrize(("where", "name", "floor", "bad"), [
    ("project.dependencies", "transformers", "4.53", "4.52.4"),
    ("project.optional-dependencies.test", "mlflow-skinny", "3.1", "3.0.1"),
    ("project.optional-dependencies.tracking", "mlflow-skinny", "3.1", "3.0.1"),
    ("build-system.requires", "setuptools", "78.1.1", "78.1.0"),  # CVE-2025-47273 (path traversal)
])
def test_floors_exclude_versions_with_known_security_fixes_missing(where, name, floor, bad):
    """Each floor sits at the first release with the security fixes the issue names; anything older is refused."""
    found = [r for r in _requirements(where) if r.name.lower() == name]
    assert len(found) == 1, f"expected exactly one {name} requirement in {where}, got {found}"
    spec = found[0].specifier
    assert not spec.contains(bad, prereleases=True), f"{name} requirement in {where} ({spec}) admits {bad}"
    assert spec.contains(floor), f"{name} requirement in {where} ({spec}) refuses {floor} itself"
