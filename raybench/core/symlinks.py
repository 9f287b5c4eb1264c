"""No writing through symbolic links planted in a run folder.

A run folder can come from someone else (a shared copy, a folder on a shared disk). A symlink planted at its
`figures/` (or `tables/`, `report.html`, `compare/<run>`) would make `raybench analyze`, `report` or `compare`
write, and replace files, wherever the link points: another user's run, or any folder the user can write. So the
output paths of those commands, and everything below them, are refused when any part is a link. The run folder
itself may be a link (the user named it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from raybench.core.errors import RaybenchError

ANALYSIS_OUTPUTS = ("tables", "figures", "randomness", "secondary", "report.html")
"""What the analyze stage and `raybench report` write, relative to the run folder (docs/architecture.md §2)."""


class SymlinkError(RaybenchError):
    """A run's output path is a symbolic link."""


def _refuse(path: Path) -> SymlinkError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return SymlinkError(f"{path} is a symbolic link (to {target}): raybench does not write through links in a run "
                        f"folder, which could replace files elsewhere. Remove the link (`rm {path}`) and run again")


def refuse_symlinks(root: str | Path, outputs: Iterable[str]) -> None:
    """Raise SymlinkError when a part of `root/<output>` below `root`, or anything inside an output folder, is a
    symbolic link. Outputs that do not exist yet are fine."""
    root = Path(root)
    for rel in outputs:
        path = root
        for part in Path(rel).parts:
            path = path / part
            if path.is_symlink():
                raise _refuse(path)
        if path.is_dir():
            for folder, dirs, files in os.walk(path):  # does not descend into linked folders: they are refused
                for name in sorted(dirs + files):
                    if (Path(folder) / name).is_symlink():
                        raise _refuse(Path(folder) / name)
