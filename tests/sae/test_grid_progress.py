"""The train stage's live counts (raybench.sae.grid_progress): cells done over the grid, failed and retrying
trials, the slowest running trial, fed by Tune callback events."""

from __future__ import annotations

import pickle
import re
from types import SimpleNamespace

import pytest
from ray.tune import Callback

from raybench.infra import progress
from raybench.sae.cells import CellSpec
from raybench.sae.grid_progress import GridProgress, finish, progress_callback


def _cell(model: str, e: int, seed: int) -> CellSpec:
    return CellSpec(model=model, q=1.0, layer=3, n_layers=4, d=8, arm="primary", expansion=e, n_latents=8 * e,
                    k=1, seed=seed)


def _stack(model: str, e: int) -> list[CellSpec]:
    return [_cell(model, e, s) for s in (1, 2)]


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def grid():
    """12 cells: `a` (4 cells, 1 already done) and `b` (4 cells) pending; 4 cells of `c` done before the run."""
    pending = {"a": [_stack("a", 1), _stack("a", 2)], "b": [_stack("b", 1), _stack("b", 2)]}
    done_before = {_cell("a", 1, 1).cell_id}
    return GridProgress.of(12, pending, lambda c: c.cell_id in done_before, clock=Clock())


def _trial(stacks: list[list[CellSpec]], error_file: str = "") -> SimpleNamespace:
    return SimpleNamespace(config={"stacks": [[c.to_dict() for c in s] for s in stacks]}, error_file=error_file)


def test_cells_outside_pending_trials_and_done_cells_count_from_the_start(grid):
    assert (grid.total, grid.outside_done, grid.done()) == (12, 4, 5)
    assert grid.find([[c.to_dict() for c in _stack("b", 2)]]).label == "b"  # any stack finds its trial
    assert grid.find([[c.to_dict() for c in _stack("z", 1)]]) is None


def test_tune_events_drive_the_display(grid, tmp_path):
    clock = grid.clock
    rep = progress.Reporter(clock)
    with progress.active(rep):
        cb = progress_callback(grid)
        a, b = _trial([_stack("a", 1), _stack("a", 2)]), _trial([_stack("b", 1), _stack("b", 2)])
        cb.on_trial_start(0, [], a)
        clock.t = 5.0
        cb.on_trial_start(0, [], b)
        cb.on_trial_result(0, [], a, {"cells_done": 3})
        cb.on_trial_result(0, [], a, {"step": 20})  # a checkpoint or tracking report: no count
        clock.t = 65.0
        assert rep.tasks["train"].done == 7
        assert grid.info() == "2 trials running, slowest trial a: running 1:05, 3 of its 4 cells saved"
        err = tmp_path / "error.txt"
        err.write_text("Traceback (most recent call last):\n  ...\nRuntimeError: boom on record 17\n")
        b.error_file = str(err)
        cb.on_trial_recover(0, [], b)
        assert "1 retrying" in grid.info()
        cb.on_trial_complete(0, [], a)
        cb.on_trial_error(0, [], b)
        assert rep.tasks["train"].done == 8 and grid.info() == "4 cells failed"
        finish(grid, n_ok=8)
        assert rep.tasks["train"].finished and rep.tasks["train"].info == "4 not ok"
        restored = pickle.loads(pickle.dumps(cb))  # Tune pickles its callbacks with the experiment state
        assert isinstance(restored, Callback) and restored.grid is None
        restored.on_trial_result(0, [], a, {"cells_done": 4})
        restored.on_trial_error(0, [], a)


def test_error_lines_name_the_trial_and_keep_record_ids_back_for_credentialed_cohorts(grid, tmp_path):
    lines: list[str] = []
    err = tmp_path / "error.txt"
    err.write_text("ValueError: record 4711 is empty\n")
    for credentialed in (False, True):
        grid.credentialed = credentialed
        with progress.active(progress.PlainReporter(lines.append, timer=False)):
            progress_callback(grid).on_trial_error(0, [], _trial([_stack("a", 1)], str(err)))
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    assert "train trial a failed" in errors[0] and "record 4711 is empty" in errors[0]
    assert "ValueError" in errors[1] and "4711" not in errors[1]


@pytest.mark.parametrize("text", ["Failure # 1 (occurred at 2026-01-01_10-00-00)\ns40689238: header missing\n",
                                  "Traceback (most recent call last):\n"
                                  "  File \"/data/p1000/p10001217/s40689238/x.py\"\n",
                                  "ray.exceptions.RayTaskError(KeyError): ray::train() (pid=4711)\n"
                                  "KeyError: '[40689238, 40689239] not in index'\n"])
def test_credentialed_error_lines_hold_no_record_id_whatever_the_error_file_says(grid, tmp_path, text):
    """No `Type:` line to pick, or an id where the type should be: the display still names no record."""
    lines: list[str] = []
    err = tmp_path / "error.txt"
    err.write_text(text)
    grid.credentialed = True
    with progress.active(progress.PlainReporter(lines.append, timer=False)):
        cb = progress_callback(grid)
        cb.on_trial_recover(0, [], _trial([_stack("a", 1)], str(err)))
        cb.on_trial_error(0, [], _trial([_stack("a", 1)], str(err)))
    errors = [ln for ln in lines if ln.startswith("ERROR")]
    assert len(errors) == 2 and all("withheld" in ln for ln in errors), errors
    assert not any(re.search(r"\d{4}", ln) for ln in errors), errors
