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


def _doc_tree() -> set[str]:
    """Paths of the source tree in docs/architecture.md §3 (indentation: two spaces a level)."""
    import re

    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc[doc.index("## 3. Source tree"):doc.index("## 4. ")]
    paths: set[str] = set()
    stack: list[str] = []
    for line in section.splitlines():
        m = re.match(r"^    ( *)(\S+)", line)
        if not m or not (m.group(2).endswith("/") or m.group(2).endswith(".py")):
            continue
        level = len(m.group(1)) // 2
        stack = stack[:level]
        if m.group(2).endswith("/"):
            stack.append(m.group(2).rstrip("/"))
        else:
            paths.add("/".join([*stack, m.group(2)]))
    return paths


def test_architecture_names_every_module():
    """docs/architecture.md's source tree is where a newcomer looks a module up: it lists every module where it
    lives, and nothing that is gone."""
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "raybench").rglob("*.py")}
    listed = {p for p in _doc_tree() if p.startswith("raybench/")}
    assert sorted(modules - listed) == [] and sorted(listed - modules) == []


MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted((ROOT / "raybench").rglob("*.py")):
        parts = p.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def test_no_module_is_over_400_lines():
    """Short modules: one over MAX_LINES is split by what it does (docs/architecture.md §3)."""
    long = {name: n for name, p in _modules().items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """raybench modules `path` imports anywhere (top level or inside a function), resolved to modules."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raybench"):
            names = [f"{node.module}.{a.name}" for a in node.names]
            found.update(n for n in names if n in modules)
            if not any(n in modules for n in names):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("raybench"))
    return {m for m in found if m in modules}


def test_no_import_cycle_between_modules():
    """Module-level import graph (lazy imports inside functions count too) has no cycle; import-linter
    (.importlinter, run by .ci/run) holds the same between sibling packages and the layers."""
    import graphlib

    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_cycle_check_finds_a_cycle(tmp_path):
    """The check above is not vacuous: a two-module cycle is reported."""
    import graphlib

    import pytest

    with pytest.raises(graphlib.CycleError):
        graphlib.TopologicalSorter({"a": {"b"}, "b": {"a"}}).prepare()
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from raybench.b import x\n")
    b.write_text("def f():\n    from raybench.a import y\n")
    mods = {"raybench.a": a, "raybench.b": b}
    assert _imports(a, mods) == {"raybench.b"} and _imports(b, mods) == {"raybench.a"}


def test_no_late_registration_imports():
    """Nothing registers itself by an import at the bottom of a module (E402): analyses are listed in
    raybench.analysis.registry, models in raybench.core.models, commands in raybench.app.cli."""
    late = [str(p.relative_to(ROOT)) for p in _modules().values() if "E402" in p.read_text()]
    assert late == []
    assert "E402" not in (ROOT / "pyproject.toml").read_text(), "ruff must keep checking E402"


def test_import_contracts_hold():
    """The layers and the acyclic-siblings contract of .importlinter (the same check .ci/run runs)."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                          "lint_imports_command()"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "2 kept, 0 broken" in res.stdout
