"""The source and test trees keep the rules other code relies on."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_test_module_basenames_are_unique():
    """conftest.py puts every test folder on sys.path and imports test modules by basename: two test files with one
    name make pytest refuse to collect the second ("import file mismatch")."""
    names = Counter(p.name for p in (ROOT / "tests").rglob("test_*.py"))
    assert [n for n, c in names.items() if c > 1] == []


def test_architecture_names_every_module():
    """docs/architecture.md's source tree is where a newcomer looks a module up: every module is in it."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    missing = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "raybench").rglob("*.py"))
               if p.name != "__init__.py" and p.name not in doc]
    assert missing == []
