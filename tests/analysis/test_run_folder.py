"""A damaged run folder is refused by every command that reads it, in one line naming what is missing and the
command that rebuilds it, before anything in the folder is written or deleted (raybench.analysis.run_folder)."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from raybench.app.cli import main
from raybench.core.errors import USER_EXIT_CODE
from raybench.core.paths import RunLayout
from tests.fake_run import small_protocol, write_fake_run

CELL = "ecg_fm-q050-E04-primary-s4311"


def _damage(root, how: str) -> str:
    """Damage the fake run; returns what the refusal must name."""
    layout = RunLayout.at(root)
    if how == "tables_deleted":
        shutil.rmtree(layout.tables_dir)
        return "cells.parquet is missing"
    if how == "one_cell_deleted":
        shutil.rmtree(layout.cell_dir(CELL))
        return f"cells/{CELL}/"
    if how == "cell_weights_deleted":
        (layout.cell_dir(CELL) / "sae.safetensors").unlink()
        return f"cells/{CELL}/sae.safetensors"
    if how == "profiles_deleted":
        (layout.tables_dir / "profiles.parquet").unlink()
        (layout.tables_dir / "profiles.csv").unlink(missing_ok=True)
        return "profiles"
    raise AssertionError(how)


COMMANDS = {
    "report": lambda root, out: ["report", "--run-dir", str(root)],
    "analyze": lambda root, out: ["analyze", "--run-dir", str(root)],
    "features": lambda root, out: ["features", "--run-dir", str(root), "--model", "ecg_fm", "--concept", "qt",
                                   "--out", str(out)],
    "export": lambda root, out: ["export", "--run-dir", str(root), "--to", str(out)],
    "export_saelens": lambda root, out: ["export", "--run-dir", str(root), "--to", str(out), "--format", "saelens",
                                         "--cells", "ecg_fm-*"],
}
FIX = {"cells.parquet is missing": "raybench train", "profiles": "raybench analyze"}
CASES = [  # (command, damage): every command that reads what the damage removed
    *[(cmd, "tables_deleted") for cmd in COMMANDS],
    *[(cmd, "one_cell_deleted") for cmd in COMMANDS],
    *[(cmd, "cell_weights_deleted") for cmd in ("features", "export", "export_saelens")],
    ("report", "profiles_deleted"), ("export", "profiles_deleted"),
]


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    return write_fake_run(tmp_path_factory.mktemp("fake") / "run", small_protocol(),
                          tables=("cells", "profiles", "contrasts"))


@pytest.mark.parametrize(("command", "damage"), CASES, ids=[f"{c}-{d}" for c, d in CASES])
def test_a_damaged_run_folder_is_refused_and_left_as_it_was(fake, tmp_path, command, damage):
    root = tmp_path / "run"
    shutil.copytree(fake, root)
    dash = RunLayout.at(root).dashboards_dir / "index.json"  # what `report` used to delete on the way
    dash.parent.mkdir(parents=True)
    dash.write_text("{}")
    needle = _damage(root, damage)
    before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    out = tmp_path / "out"
    res = CliRunner().invoke(main, COMMANDS[command](root, out))
    assert res.exit_code == USER_EXIT_CODE, res.output
    lines = [ln for ln in res.output.splitlines() if ln.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert needle in lines[0] and FIX.get(needle, "raybench train") in lines[0], lines[0]
    assert "--verbose" not in lines[0], "no traceback hint: the message says the fix"
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == before, "nothing written or deleted"
    assert not out.exists()


def test_a_whole_folder_passes_and_a_retried_failed_cell_needs_no_folder(tmp_path):
    from raybench.analysis.run_folder import CELL_FILES, EXPORT, RunFolderError, check_run_folder
    from tests.fake_run import PLACEHOLDER_FILES

    assert set(PLACEHOLDER_FILES) == set(CELL_FILES)
    root = write_fake_run(tmp_path / "run", small_protocol(), tables=("cells", "profiles"),
                          fail={("ecg_fm", 0.5, 4, 4311, "primary"): "NaN loss"})
    assert check_run_folder(root, "export", EXPORT) == root
    assert not RunLayout.at(root).cell_dir(CELL).exists()
    with pytest.raises(RunFolderError, match="is not a folder"):
        check_run_folder(tmp_path / "nope", "report", EXPORT)
