"""The train stage's live progress: a Tune callback in the driver that turns trial events into the grid's cell
counts on the run's display (raybench.infra.progress): cells done/total, failed and retrying trials, cells/min, ETA
and the slowest running trial. Trials report `cells_done` after each stack they save (raybench.sae.trial)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ray.tune import Callback

from raybench.core.privacy import failure_text
from raybench.infra import progress
from raybench.sae.cells import CellSpec

KEY = "train"


@dataclass
class TrialCount:
    """One trial (a unit of stacks) as the display sees it."""

    label: str
    n_cells: int
    done: int
    started: float | None = None
    state: str = "pending"  # pending, running, retrying, ok, failed


@dataclass
class GridProgress:
    """Cells done over the whole grid: the cells outside the pending trials count as done from the start."""

    total: int
    outside_done: int
    trials: dict[str, TrialCount] = field(default_factory=dict)
    clock: Callable[[], float] = time.monotonic
    stack_trial: dict[str, str] = field(default_factory=dict)
    """stack id -> trial key: a trial is found by any of its stacks (a retry may drop failed ones)."""
    credentialed: bool = False
    """Show only an error's type, never its message (which may name records of a credentialed cohort)."""

    @classmethod
    def of(cls, n_cells: int, pending: dict[str, list[list[CellSpec]]], done_in: Callable[[CellSpec], bool],
           clock: Callable[[], float] = time.monotonic, credentialed: bool = False) -> GridProgress:
        trials = {key: TrialCount(key, sum(len(s) for s in stacks), sum(done_in(c) for s in stacks for c in s))
                  for key, stacks in pending.items()}
        stack_trial = {s[0].stack_id: key for key, stacks in pending.items() for s in stacks}
        return cls(n_cells, n_cells - sum(t.n_cells for t in trials.values()), trials, clock, stack_trial,
                   credentialed)

    def find(self, stacks: list[list[dict]]) -> TrialCount | None:
        """The trial whose config holds `stacks` (cell dicts, as in the Tune param space)."""
        for stack in stacks:
            key = self.stack_trial.get(CellSpec(**stack[0]).stack_id) if stack else None
            if key is not None:
                return self.trials[key]
        return None

    def done(self) -> int:
        return self.outside_done + sum(t.done for t in self.trials.values())

    def info(self) -> str:
        states = [t.state for t in self.trials.values()]
        failed = sum(t.n_cells - t.done for t in self.trials.values() if t.state == "failed")
        parts = [f"{failed} cells failed" if failed else "",
                 f"{states.count('retrying')} retrying" if "retrying" in states else "",
                 f"{states.count('running')} trials running" if "running" in states else ""]
        running = [t for t in self.trials.values() if t.state == "running" and t.started is not None]
        if running:
            slow = min(running, key=lambda t: t.started)
            parts.append(f"slowest trial {slow.label}: running {progress.fmt_seconds(self.clock() - slow.started)}, "
                         f"{slow.done} of its {slow.n_cells} cells saved")
        return ", ".join(p for p in parts if p)


def progress_callback(grid: GridProgress) -> CellProgress:
    """A Tune Callback feeding `grid`'s counts to the current display (one `train` task)."""
    return CellProgress(grid)


class CellProgress(Callback):
    """The callback's hooks. Tune pickles its callbacks with the experiment state: a pickled (restored) one
    keeps no display and does nothing."""

    def __init__(self, grid: GridProgress | None):
        self.grid = grid
        self.display = progress.current()
        if grid is not None:
            self.display.start(KEY, "train cells", grid.total, "cells")
            self._show()

    def __reduce__(self):
        return (CellProgress, (None,))

    def _trial(self, trial) -> TrialCount | None:
        return self.grid.find(trial.config.get("stacks") or []) if self.grid is not None else None

    def _show(self) -> None:
        self.display.update(KEY, done=self.grid.done(), info=self.grid.info())

    def on_trial_start(self, iteration, trials, trial, **info):
        t = self._trial(trial)
        if t is not None:
            t.state, t.started = "running", self.grid.clock()
            self._show()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        t = self._trial(trial)
        if t is not None and "cells_done" in result:
            t.done = max(t.done, int(result["cells_done"]))
            self._show()

    def on_trial_recover(self, iteration, trials, trial, **info):
        t = self._trial(trial)
        if t is not None:
            t.state = "retrying"
            self.display.error(f"train trial {t.label} failed (its cells {t.done}/{t.n_cells} saved), retrying: "
                               f"{_first_line(trial, self.grid.credentialed)}")
            self._show()

    def on_trial_restore(self, iteration, trials, trial, **info):
        t = self._trial(trial)
        if t is not None:
            t.state = "running"
            self._show()

    def on_trial_complete(self, iteration, trials, trial, **info):
        t = self._trial(trial)
        if t is not None:
            t.state, t.done = "ok", t.n_cells
            self._show()

    def on_trial_error(self, iteration, trials, trial, **info):
        t = self._trial(trial)
        if t is not None:
            t.state = "failed"
            self.display.error(f"train trial {t.label} failed for good ({t.n_cells - t.done} cells not trained): "
                               f"{_first_line(trial, self.grid.credentialed)}")
            self._show()


def finish(grid: GridProgress, n_ok: int) -> None:
    """Close the display's `train` task with the table's own count of ok cells."""
    display = progress.current()
    display.update(KEY, done=n_ok, info="")
    display.finish(KEY, f"{grid.total - n_ok} not ok" if n_ok < grid.total else None)


def _first_line(trial, credentialed: bool = False) -> str:
    """The failure's last `Type: message` line (Tune keeps the whole traceback in the trial's error file); only
    the type for a credentialed cohort (raybench.core.privacy)."""
    path = getattr(trial, "error_file", None) or ""
    try:
        with open(path) as fh:
            lines = [ln.strip() for ln in fh if ln.strip()]
    except OSError:
        return "see the trial's error.txt under tune/"
    hits = [ln for ln in lines
            if ": " in ln and ln.split(":", 1)[0].rsplit(".", 1)[-1].endswith(("Error", "Exception"))]
    line = (hits[-1] if hits else lines[-1] if lines else "no message")[:300]
    return failure_text(line, True) if credentialed else line  # never the line's first token: it may be an id
