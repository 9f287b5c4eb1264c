"""The live progress display of `raybench grid`: one line per long-running piece of work (an encoder's records,
the grid's cells, the bootstrap chunks), drawn with `rich` in a terminal and as plain periodic lines otherwise.

Why here: the stages run for minutes, and the user (or a CI / Ray Jobs log) should see what they are doing
without Ray's own chatter. Stages never draw anything: they call `current()` and report counts through a small
API (`start`, `update`, `advance`, `note`, `error`); the pipeline decides where that goes. Outside a display
(`raybench encode`, tests) `current()` is a silent `Reporter`, so the hooks cost nothing there.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO


@dataclass
class Task:
    """One counted piece of work: `done` of `total` `unit`s since `started`; `info` is free text (e.g. the
    slowest running trial)."""

    label: str
    total: int
    unit: str
    started: float
    done: int = 0
    info: str = ""
    finished: bool = False
    history: list[tuple[float, int]] = field(default_factory=list)
    per: str | None = None  # the rate's time unit ("s" or "min"), fixed at the first rate shown

    def rate(self, now: float) -> float:
        """Units per second since the task's first progress (start-up latency is not work), up to its last
        progress once all units are done (so a complete task's rate stays put instead of falling with time)."""
        if self.done <= 0 or not self.history:
            return 0.0
        t0, d0 = self.history[0]
        end = self.history[-1][0] if self.total and self.done >= self.total else now
        return (self.done - d0) / (end - t0) if end > t0 and self.done > d0 else 0.0

    def rate_text(self, now: float) -> str:
        """The rate in one time unit for the task's whole life: per second if the first rate shown was at least 1
        a second, else per minute (a line never switches between the two)."""
        r = self.rate(now)
        if r > 0 and self.per is None:
            self.per = "s" if r >= 1 else "min"
        return fmt_rate(r, self.unit, self.per)

    def eta(self, now: float) -> float | None:
        r = self.rate(now)
        return (self.total - self.done) / r if r > 0 and self.total > self.done else None


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "--"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def fmt_rate(per_s: float, unit: str, per: str | None = None) -> str:
    """`per_s` units a second as text, per `per` ("s" or "min"; None: whichever reads better)."""
    per = per or ("s" if per_s >= 1 or per_s <= 0 else "min")
    if per_s <= 0:
        return f"-- {unit}/{per}"
    if per == "s":
        return f"{per_s:.1f} {unit}/s" if per_s >= 1 else f"{per_s:.2f} {unit}/s"
    return f"{per_s * 60:.1f} {unit}/min"


def task_line(task: Task, now: float) -> str:
    """`label: done/total unit, rate, ETA m:ss[, info]` (the plain-line form of a task)."""
    text = f"{task.label}: {task.done}/{task.total} {task.unit}"
    if task.finished:
        text += f" in {fmt_seconds(now - task.started)}"
    else:
        text += f", {task.rate_text(now)}, ETA {fmt_seconds(task.eta(now))}"
    return text + (f", {task.info}" if task.info else "")


class Reporter:
    """The hook API stages call; this base class keeps the counts and draws nothing (used outside a display)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.tasks: dict[str, Task] = {}
        self.lock = threading.RLock()

    def start(self, key: str, label: str, total: int, unit: str = "items") -> None:
        """Open (or reopen with a new total) the task `key`."""
        with self.lock:
            self.tasks[key] = Task(label, int(total), unit, self.clock())
            self._changed(key)

    def update(self, key: str, done: int | None = None, info: str | None = None, total: int | None = None) -> None:
        with self.lock:
            task = self.tasks.get(key)
            if task is None:
                return
            if total is not None:
                task.total = int(total)
            if done is not None and done != task.done:
                task.done = int(done)
                if not task.history:
                    task.history.append((self.clock(), task.done))
                task.history.append((self.clock(), task.done))
            if info is not None:
                task.info = info
            self._changed(key)

    def advance(self, key: str, n: int = 1) -> None:
        with self.lock:
            task = self.tasks.get(key)
            if task is not None:
                self.update(key, done=task.done + n)

    def add_total(self, key: str, label: str, n: int, unit: str = "items") -> None:
        """Grow the total of `key` by n (opening it at 0 if needed): work discovered piece by piece. Work added
        after all of the task's earlier work is done starts a new line (the done one is closed first), so one
        line's total does not jump from one batch of work to the next (36 -> 246 bootstrap tasks)."""
        with self.lock:
            task = self.tasks.get(key)
            if task is not None and not task.finished and task.total and task.done >= task.total:
                self.finish(key)
            if key not in self.tasks or self.tasks[key].finished:
                self.start(key, label, 0, unit)
            self.update(key, total=self.tasks[key].total + n)

    def finish(self, key: str, info: str | None = None) -> None:
        with self.lock:
            task = self.tasks.get(key)
            if task is not None:
                task.finished = True
                if info is not None:
                    task.info = info
                self._finished(key)

    def note(self, text: str) -> None:
        """A line worth keeping (a stage summary, a warning the user must act on)."""

    def error(self, text: str) -> None:
        """An error line; always shown, whatever the verbosity."""
        print(text, file=sys.stderr, flush=True)

    def _changed(self, key: str) -> None:
        pass

    def _finished(self, key: str) -> None:
        pass

    def close(self) -> None:
        pass


class PlainReporter(Reporter):
    """Plain lines for logs (CI, Ray Jobs): every `interval_s` the unfinished tasks' lines, plus one line when a
    task finishes and every note; nothing is redrawn."""

    def __init__(self, echo: Callable[[str], None], interval_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic, timer: bool = True):
        super().__init__(clock)
        self.echo = echo
        self.interval_s = interval_s
        self._printed: dict[str, str] = {}  # each task's last periodic line
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick_loop, daemon=True) if timer else None
        if self._thread is not None:
            self._thread.start()

    def _tick_loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()

    def tick(self) -> None:
        """Print the state of every unfinished task (called by the timer thread), leaving out a line that would
        repeat the one printed last for that task (nothing started yet, or all done and waiting to be closed)."""
        with self.lock:
            now = self.clock()
            for key, task in self.tasks.items():
                if task.finished:
                    continue
                line = f"  {task_line(task, now)}"
                if self._printed.get(key) != line:
                    self._printed[key] = line
                    self.echo(line)

    def note(self, text: str) -> None:
        with self.lock:
            self.echo(text)

    def error(self, text: str) -> None:
        with self.lock:
            self.echo(f"ERROR {text}")

    def _finished(self, key: str) -> None:
        self.echo(f"  {task_line(self.tasks[key], self.clock())}")

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)


class RichReporter(Reporter):
    """A live `rich` display in a terminal: one bar per task with done/total, rate, ETA and its info; notes and
    errors print above it and stay."""

    def __init__(self, stream: IO[str] | None = None, clock: Callable[[], float] = time.monotonic):
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

        super().__init__(clock)
        self.console = Console(file=stream or sys.stdout, force_terminal=True, highlight=False)
        self.bars = Progress(TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
                             TextColumn("{task.fields[unit]}  {task.fields[stats]}"),
                             console=self.console, refresh_per_second=4, transient=False)
        self.ids: dict[str, int] = {}
        self.bars.start()

    def _changed(self, key: str) -> None:
        task, now = self.tasks[key], self.clock()
        stats = f"{task.rate_text(now)}  ETA {fmt_seconds(task.eta(now))}"
        if task.info:
            stats += f"  {task.info}"
        fields = {"description": task.label, "total": max(task.total, 1), "completed": task.done,
                  "unit": task.unit, "stats": stats}
        if key not in self.ids:
            self.ids[key] = self.bars.add_task(**fields)
        else:
            self.bars.update(self.ids[key], **fields)

    def _finished(self, key: str) -> None:
        task = self.tasks[key]
        self.bars.update(self.ids[key], completed=task.done,
                         stats=f"in {fmt_seconds(self.clock() - task.started)}" + (f"  {task.info}" if task.info
                                                                                   else ""))

    def note(self, text: str) -> None:
        self.bars.console.print(text, markup=False, highlight=False)

    def error(self, text: str) -> None:
        self.bars.console.print(f"ERROR {text}", markup=False, highlight=False, style="bold red")

    def close(self) -> None:
        self.bars.stop()


_CURRENT: Reporter = Reporter()


def current() -> Reporter:
    """The reporter stages send their counts to (a silent one outside `raybench grid`)."""
    return _CURRENT


INTERVAL_ENV = "RAYBENCH_PROGRESS_INTERVAL_S"
"""Seconds between plain progress lines (default 10), e.g. longer for a quiet CI log."""


def make_reporter(echo: Callable[[str], None] | None = None, stream: IO[str] | None = None,
                  live: bool | None = None, interval_s: float | None = None) -> Reporter:
    """A live rich display when `stream` (default stdout) is a terminal, else plain lines through `echo`
    (default: print to `stream`) every `interval_s` (default: $RAYBENCH_PROGRESS_INTERVAL_S, else 10)."""
    import os

    stream = stream or sys.stdout
    interval_s = interval_s if interval_s is not None else float(os.environ.get(INTERVAL_ENV, "10"))
    if live is None:
        live = bool(getattr(stream, "isatty", lambda: False)())
    if live:
        return RichReporter(stream)
    return PlainReporter(echo or (lambda text: print(text, file=stream, flush=True)), interval_s)


@contextlib.contextmanager
def active(reporter: Reporter) -> Iterator[Reporter]:
    """Make `reporter` the one `current()` returns for the block; closed on exit."""
    global _CURRENT
    previous, _CURRENT = _CURRENT, reporter
    try:
        yield reporter
    finally:
        _CURRENT = previous
        reporter.close()
