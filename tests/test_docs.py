"""The repository stands on its own: its text cites only documents it contains.

Rules, checked over every text file of raybench/, tests/, bench/, cluster/, notebooks/, docs/ and README.md:

1. No citation of the retired design notes (the upper-case word that named them, with or without `.md`):
   the protocol is docs/protocol.md, the architecture docs/architecture.md.
2. No path into this machine's workspace outside the checkout: `../shared`, `../scratch`, or an absolute
   `/work/...` path.
3. Python code never climbs above the repository root with `Path(__file__)...parents[k]`, with one
   exception: the lookup of the optional PTB-XL sample or validation records, which are test data, not a
   citation. It is allowed only in the files of `SAMPLE_LOOKUPS`, only as `parents[k] / "shared"`, and only
   on the way to `ptbxl-sample` or `ptbxl-validation` (in the same expression, or through a variable every
   use of which continues with `/ "ptbxl-sample"`). The tests that read them skip, or compare nothing, when
   the folder is absent.
4. Every section cited as `docs/protocol.md §X` (or `docs/architecture.md §X`, including lists such as
   `§7 and §8.1` or `§8, §9.2`) is a numbered heading of that document.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCAN_DIRS = ("raybench", "tests", "bench", "cluster", "notebooks", "docs")
SCAN_FILES = ("README.md",)
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".ipynb", ".txt", ".cfg", ".ini", ".sh", ".json", ".html"}
SKIP_PARTS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"}
SELF = Path(__file__).resolve()

# rule 1: built from pieces so this file does not cite what it forbids
RETIRED_NOTES = re.compile(r"\b" + "DESI" + r"GN\b")
# rule 2
OUTSIDE_TEXT = re.compile(r"\.\./(?:shared|scratch)\b|(?<![\w.~-])/work/")
# rule 3
CLIMB = re.compile(r"Path\(__file__\)(?:\.resolve\(\))?\.parents\[(\d+)\]")
SAMPLE_LOOKUPS = {
    "tests/conftest.py": "PTB-XL sample folder of the `ptbxl_sample` fixture (skips when absent; "
                         "RAYBENCH_PTBXL_SAMPLE overrides it)",
    "tests/cohorts/test_synth.py": "PTB-XL sample header, compared with the synthetic columns only when present",
    "tests/cohorts/test_waveform49_runner.py": "PTB-XL validation records (cardiologists' statements) for "
                                               "waveform49, skipped when absent; RAYBENCH_PTBXL_VALIDATION overrides",
}
# rule 4
CITATION = re.compile(r"docs/(protocol|architecture)\.md((?:(?:\s*,\s*|\s+and\s+|\s+)§\d+(?:\.\d+)*)+)")
SECTION = re.compile(r"§(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,6}\s+(\d+(?:\.\d+)*)\.?\s+\S", re.MULTILINE)


def _text_files() -> list[Path]:
    files = [ROOT / f for f in SCAN_FILES if (ROOT / f).is_file()]
    for d in SCAN_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            if p.is_file() and p.suffix in TEXT_SUFFIXES and not SKIP_PARTS.intersection(p.parts) \
                    and p.resolve() != SELF:
                files.append(p)
    return files


def _lines(path: Path):
    yield from enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_scan_sees_the_tree():
    rels = {_rel(p) for p in _text_files()}
    assert {"raybench/core/config.py", "tests/conftest.py", "docs/protocol.md", "README.md"} <= rels


def test_no_citation_of_the_retired_design_notes():
    hits = [f"{_rel(p)}:{n}: {line.strip()}" for p in _text_files() for n, line in _lines(p)
            if RETIRED_NOTES.search(line)]
    assert not hits, "cite docs/protocol.md §N (or docs/architecture.md §N) instead:\n" + "\n".join(hits)


def test_no_path_outside_the_repository():
    hits = [f"{_rel(p)}:{n}: {line.strip()}" for p in _text_files() for n, line in _lines(p)
            if OUTSIDE_TEXT.search(line)]
    assert not hits, "paths outside the checkout:\n" + "\n".join(hits)


def test_code_does_not_climb_above_the_repository():
    bad = []
    for p in _text_files():
        if p.suffix != ".py":
            continue
        rel = _rel(p)
        depth = len(p.relative_to(ROOT).parts)  # parents[depth - 1] is the repository root
        text = p.read_text(encoding="utf-8")
        for n, line in _lines(p):
            for m in CLIMB.finditer(line):
                k = int(m.group(1))
                if k < depth:  # at or below the repository root
                    continue
                if k > depth or rel not in SAMPLE_LOOKUPS:  # the sample sits beside the checkout, no higher
                    bad.append(f"{rel}:{n}: {line.strip()}")
                    continue
                rest = line[m.end():]
                if re.match(r'\s*/\s*"shared"\s*/\s*"ptbxl-(?:sample|validation)"', rest):
                    continue
                if not re.fullmatch(r'\s*/\s*"shared"\s*', rest):
                    bad.append(f"{rel}:{n}: {line.strip()}")
                    continue
                name = re.match(r"\s*([A-Za-z_]\w*)\s*=", line)
                uses = re.findall(rf"\b{name.group(1)}\b(.{{0,20}})", text) if name else []
                later = uses[1:]  # the first occurrence is the assignment itself
                if not name or not later or not all(re.match(r'\s*/\s*"ptbxl-sample"', u) for u in later):
                    bad.append(f"{rel}:{n}: {line.strip()} (every use must lead to ptbxl-sample)")
    assert not bad, ("code reaches outside the repository; only the PTB-XL sample lookups of "
                     "SAMPLE_LOOKUPS are allowed:\n" + "\n".join(bad))


def _sections(doc: str) -> set[str]:
    return set(HEADING.findall((ROOT / "docs" / f"{doc}.md").read_text(encoding="utf-8")))


def test_protocol_has_the_numbered_sections_code_relies_on():
    sections = _sections("protocol")
    assert {str(i) for i in range(1, 11)} <= sections
    assert {"2.2", "2.4", "3.2", "5.5", "6.5", "7.3", "7.5", "8.1", "8.3", "10.1", "10.2"} <= sections


@pytest.mark.parametrize("doc", ["protocol", "architecture"])
def test_cited_sections_exist(doc):
    sections = _sections(doc)
    cited, missing = 0, []
    for p in _text_files():
        for n, line in _lines(p):
            for m in CITATION.finditer(line):
                if m.group(1) != doc:
                    continue
                for sec in SECTION.findall(m.group(2)):
                    cited += 1
                    if sec not in sections:
                        missing.append(f"{_rel(p)}:{n}: §{sec} ({line.strip()})")
    assert cited > 0, f"no docs/{doc}.md §N citation found: the scan is broken"
    assert not missing, f"docs/{doc}.md has no such section:\n" + "\n".join(missing)
