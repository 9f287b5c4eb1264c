"""pyproject.toml: dependency floors that security fixes depend on."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _requirement(name: str) -> Requirement:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    found = [r for r in map(Requirement, deps) if r.name.lower() == name]
    assert len(found) == 1, f"expected exactly one {name} requirement in pyproject.toml, got {found}"
    return found[0]


def test_torch_floor_excludes_the_weights_only_bypass():
    """torch < 2.6 lets a crafted checkpoint run code even with torch.load(weights_only=True) (CVE-2025-32434)."""
    spec = _requirement("torch").specifier
    floors = [Version(s.version) for s in spec if s.operator in (">=", "==", "~=", "===")]
    floors += [Version(s.version) for s in spec if s.operator == ">"]
    assert floors, f"torch requirement {spec} has no lower bound"
    assert max(floors) >= Version("2.6"), f"torch requirement {spec} admits versions below 2.6"
    for bad in ("2.4.0", "2.5.1"):
        assert not spec.contains(bad, prereleases=True), f"torch requirement {spec} admits {bad}"
    assert spec.contains("2.6.0")
