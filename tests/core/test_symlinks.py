"""raybench/core/symlinks.py: `analyze`, `report` and `compare` never write through a link planted in a run."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from raybench.app.cli import main
from raybench.core.symlinks import ANALYSIS_OUTPUTS, SymlinkError, refuse_symlinks


def test_a_link_at_or_below_an_output_path_is_refused_and_the_run_folder_itself_may_be_one(tmp_path):
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    (run / "tables").mkdir(parents=True)
    elsewhere.mkdir()
    refuse_symlinks(run, ANALYSIS_OUTPUTS)  # nothing linked; missing outputs are fine
    (run / "tables" / "profiles.csv").symlink_to(elsewhere / "victim.csv")
    with pytest.raises(SymlinkError, match=r"tables/profiles\.csv is a symbolic link \(to .*victim\.csv\)"):
        refuse_symlinks(run, ANALYSIS_OUTPUTS)
    (run / "tables" / "profiles.csv").unlink()
    (run / "figures").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(SymlinkError, match=r"run/figures is a symbolic link"):
        refuse_symlinks(run, ANALYSIS_OUTPUTS)
    (run / "figures").unlink()
    (tmp_path / "linked").symlink_to(run, target_is_directory=True)
    refuse_symlinks(tmp_path / "linked", ANALYSIS_OUTPUTS)
    (run / "compare").symlink_to(elsewhere, target_is_directory=True)
    refuse_symlinks(run, ANALYSIS_OUTPUTS)  # not an output of analyze
    with pytest.raises(SymlinkError, match=r"run/compare is a symbolic link"):
        refuse_symlinks(run, ["compare/other"])


@pytest.mark.parametrize(("command", "planted"), [("report", "figures"), ("analyze", "tables"),
                                                  ("compare", "compare")])
def test_report_analyze_and_compare_refuse_a_symlinked_output_folder(tmp_path, command, planted):
    from fake_run import small_protocol, write_fake_run

    run, other, victim = tmp_path / "run", tmp_path / "other", tmp_path / "someone-elses-run"
    write_fake_run(run, small_protocol(), tables=("cells", "profiles"))
    other.mkdir()
    victim.mkdir()
    if (run / planted).exists():
        import shutil

        shutil.rmtree(run / planted)
    (run / planted).symlink_to(victim, target_is_directory=True)
    args = {"report": ["report", "--run-dir", str(run)], "analyze": ["analyze", "--run-dir", str(run)],
            "compare": ["compare", str(run), str(other)]}[command]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2 and f"{run / planted} is a symbolic link" in res.output, res.output
    assert list(victim.iterdir()) == [], "nothing written through the link"
