"""Atomic folder replacement: a failure or a kill between its steps never loses both the old and the new folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raybench.core import atomic
from raybench.core.atomic import atomic_dir


def _folder(path: Path, text: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "data.txt").write_text(text)


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_failure_moving_the_new_folder_in_keeps_the_old_one(tmp_path, monkeypatch):
    """The step after the old folder is set aside fails: the old folder is put back, nothing is lost."""
    target = tmp_path / "out"
    _folder(target, "old")
    real = os.replace
    calls = []

    def failing(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if Path(dst) == target and Path(src).name.endswith(".tmp"):
            raise OSError("injected failure while moving the new folder in")
        return real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", failing)
    with pytest.raises(OSError, match="injected"), atomic_dir(target) as tmp:
        (tmp / "data.txt").write_text("new")
    assert (target / "data.txt").read_text() == "old"
    assert _leftovers(tmp_path) == []


def test_a_failure_deleting_the_old_folder_keeps_the_new_one_and_a_later_call_cleans_up(tmp_path, monkeypatch):
    target = tmp_path / "out"
    _folder(target, "old")
    real_rmtree = atomic.shutil.rmtree

    def failing(path, *args, **kwargs):
        if ".old-" in Path(path).name:
            raise OSError("injected failure while deleting the old folder")
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(atomic.shutil, "rmtree", failing)
    with atomic_dir(target) as tmp:  # the replacement itself succeeded: no error for a leftover aside
        (tmp / "data.txt").write_text("new")
    assert (target / "data.txt").read_text() == "new"
    assert [n for n in _leftovers(tmp_path) if ".old-" in n]
    monkeypatch.setattr(atomic.shutil, "rmtree", real_rmtree)
    with atomic_dir(target) as tmp:
        (tmp / "data.txt").write_text("newer")
    assert (target / "data.txt").read_text() == "newer" and _leftovers(tmp_path) == []


KILLED = """
import os, sys
from pathlib import Path
from raybench.core import atomic

target = Path(sys.argv[1])
real = os.replace

def replace(src, dst):
    real(src, dst)
    if Path(dst).name.startswith(f".{target.name}.old-"):
        os._exit(9)  # killed right after the old folder was set aside, before the new one moved in

atomic.os.replace = replace
with atomic.atomic_dir(target) as tmp:
    (tmp / "data.txt").write_text("new")
"""


def test_a_kill_between_the_renames_leaves_the_old_folder_recoverable_and_a_later_call_recovers_it(tmp_path):
    target = tmp_path / "out"
    _folder(target, "old")
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED))
    proc = subprocess.run([sys.executable, str(script), str(target)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 9, proc.stderr
    assert not target.exists()
    asides = [p for p in tmp_path.iterdir() if ".old-" in p.name]
    assert len(asides) == 1 and (asides[0] / "data.txt").read_text() == "old"  # the old folder is intact

    assert atomic.recover_dir(target) is True  # what a reader (or the next writer) does first
    assert (target / "data.txt").read_text() == "old"
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name]

    subprocess.run([sys.executable, str(script), str(target)], capture_output=True, timeout=120)
    with atomic_dir(target) as tmp:  # the next replacement recovers the aside before replacing
        (tmp / "data.txt").write_text("newer")
    assert (target / "data.txt").read_text() == "newer"
    assert not [p for p in tmp_path.iterdir() if ".old-" in p.name]


def test_an_aside_of_a_live_replacement_is_left_alone(tmp_path):
    """Another process still between its renames: its aside is not touched (its pid is alive)."""
    target = tmp_path / "out"
    aside = tmp_path / f".out.old-{os.getppid()}-abc"
    _folder(aside, "old")
    assert atomic.recover_dir(target) is False
    assert aside.exists() and not target.exists()
