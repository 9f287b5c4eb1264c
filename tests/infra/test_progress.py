"""The live progress display (raybench.infra.progress): counts, rates and ETAs, the rich display in a terminal and
plain lines otherwise, and `raybench grid` under a pseudo-terminal and a pipe."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raybench.infra import progress

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_task_rate_and_eta_count_from_the_first_progress():
    clock = Clock()
    rep = progress.Reporter(clock)
    rep.start("enc", "encode csfm", 100, "records")
    clock.t += 30.0  # start-up: no records yet, so no rate either
    assert rep.tasks["enc"].rate(clock()) == 0.0 and rep.tasks["enc"].eta(clock()) is None
    rep.update("enc", done=10)
    clock.t += 9.0
    rep.update("enc", done=40)  # 30 records in 9 s after the first batch
    task = rep.tasks["enc"]
    assert task.rate(clock()) == pytest.approx(30 / 9)
    assert task.eta(clock()) == pytest.approx(60 / (30 / 9))
    assert progress.task_line(task, clock()) == "encode csfm: 40/100 records, 3.3 records/s, ETA 0:18"


def test_slow_rates_read_per_minute_and_long_etas_in_hours():
    assert progress.fmt_rate(0.5, "cells") == "30.0 cells/min"
    assert progress.fmt_rate(0.0, "cells") == "-- cells/s"
    assert progress.fmt_seconds(3725) == "1:02:05" and progress.fmt_seconds(None) == "--"


def test_plain_reporter_prints_unfinished_tasks_per_tick_and_each_finish_once():
    clock, lines = Clock(), []
    rep = progress.PlainReporter(lines.append, clock=clock, timer=False)
    rep.add_total("boot", "bootstrap tasks", 4, "tasks")
    rep.add_total("boot", "bootstrap tasks", 4, "tasks")  # work found piece by piece
    rep.advance("boot", 3)
    rep.note("[4/5] train     running ...")
    rep.tick()
    assert lines == ["[4/5] train     running ...", "  bootstrap tasks: 3/8 tasks, -- tasks/s, ETA --"]
    clock.t += 2.0
    rep.advance("boot", 5)
    rep.finish("boot")
    rep.tick()  # nothing unfinished: no line
    rep.error("train trial csfm/main failed for good")
    assert lines[2:] == ["  bootstrap tasks: 8/8 tasks in 0:02", "ERROR train trial csfm/main failed for good"]


def test_updates_to_unknown_tasks_are_ignored_and_the_default_reporter_is_silent(capsys):
    rep = progress.current()
    assert type(rep) is progress.Reporter
    rep.update("nothing", done=3)
    rep.advance("nothing")
    rep.finish("nothing")
    rep.note("not shown")
    assert capsys.readouterr().out == ""


def test_active_swaps_the_current_reporter_and_closes_it():
    closed = []

    class Probe(progress.Reporter):
        def close(self) -> None:
            closed.append(1)

    probe = Probe()
    with progress.active(probe):
        assert progress.current() is probe
    assert progress.current() is not probe and closed == [1]


def test_make_reporter_is_live_in_a_terminal_and_plain_in_a_pipe():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    live = progress.make_reporter(stream=tty)
    assert isinstance(live, progress.RichReporter)
    live.start("enc", "encode csfm", 10, "records")
    live.update("enc", done=4, info="2 actors")
    live.note("[3/5] encode    running ...")
    live.close()
    out = tty.getvalue()
    assert "encode csfm" in out and "4/10" in out and "2 actors" in out and "[3/5] encode" in out
    assert "\x1b[" in out  # drawn with terminal control sequences
    plain = progress.make_reporter(stream=io.StringIO(), interval_s=60)
    assert isinstance(plain, progress.PlainReporter)
    plain.close()


# ---------------------------------------------------------------- `raybench grid` in a terminal and in a pipe

DRIVER = textwrap.dedent("""
    import sys, time
    import raybench.app.pipeline as pl
    from raybench.infra import progress
    from raybench.app.cli import main
    from raybench.infra.stage import Stage

    def work(cfg, remote):
        shown = progress.current()
        shown.start("fake", "encode fake", 5, "records")
        for i in range(5):
            time.sleep(0.2)
            shown.update("fake", done=i + 1)
        shown.finish("fake")
        return "5 records"

    started = []
    pl.STAGES = [Stage("cohort", (), lambda cfg: True, work), Stage("encode", (), lambda cfg: False, work)]
    pl.RAY_FREE = ("cohort", "encode")  # nothing here needs Ray
    main(sys.argv[1:], prog_name="raybench")
""")


def _grid(tmp_path: Path, terminal: bool, *extra: str) -> str:
    env = {**os.environ, progress.INTERVAL_ENV: "0.05", "PYTHONPATH": str(ROOT), "COLUMNS": "160"}
    args = [sys.executable, "-c", DRIVER, *extra, "grid", "--run-dir", str(tmp_path / "run")]
    if not terminal:
        res = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout + res.stderr
    main_fd, child_fd = pty.openpty()
    proc = subprocess.Popen(args, env=env, stdin=child_fd, stdout=child_fd, stderr=child_fd, cwd=ROOT)
    os.close(child_fd)
    chunks = []
    while True:
        try:
            data = os.read(main_fd, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main_fd)
    assert proc.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_grid_draws_a_live_display_in_a_terminal(tmp_path):
    out = _grid(tmp_path, terminal=True)
    assert "\x1b[" in out and "encode fake" in out and "5/5" in out
    assert "[1/2] cohort    complete, skipped" in out and "[2/2] encode    done in" in out


def test_grid_prints_plain_periodic_lines_in_a_pipe(tmp_path):
    out = _grid(tmp_path, terminal=False)
    lines = out.splitlines()
    assert "\x1b[" not in out
    assert "[2/2] encode    running ..." in lines and any(ln.startswith("[2/2] encode    done in") for ln in lines)
    periodic = [ln for ln in lines if ln.startswith("  encode fake: ") and "ETA" in ln]
    assert periodic, out  # the timer's lines while the stage ran
    assert any(ln.startswith("  encode fake: 5/5 records in ") for ln in lines)


REAL = textwrap.dedent("""
    import sys
    import raybench.app.pipeline as pl
    from raybench.app.cli import main

    pl.STAGES = pl.STAGES[:3]  # cohort, manifest, encode: real Ray, Ray Data and its encoder actors
    main(sys.argv[1:], prog_name="raybench")
""")

RAY_CHATTER = (" INFO ", " WARNING ", "core_worker", "streaming_executor", "Started a local Ray instance",
               "Connected to Ray cluster")


RAY_STAGE = textwrap.dedent("""
    import sys
    import ray
    import raybench.app.pipeline as pl
    from raybench.app.cli import main
    from raybench.infra.stage import Stage

    def work(cfg, remote):  # Ray is started for this stage (it is not in pipeline.RAY_FREE)
        return ray.get(ray.remote(lambda: "a Ray task ran").remote())

    pl.STAGES = [Stage("encode", (), lambda cfg: False, work)]
    main(sys.argv[1:], prog_name="raybench")
""")


@pytest.mark.slow
def test_grid_keeps_rays_own_lines_out_unless_verbose(tmp_path, ray_address):
    """A real run of the first three stages (Ray start, Ray Data, encoder actor pool): by default the output is
    raybench's lines only; `--verbose` lets Ray's own through (shown on a one-task stage that attaches to the
    session's Ray through RAY_ADDRESS: Ray's connect lines are enough, and a second encode or Ray start would
    add to the test's time)."""
    from dataclasses import replace

    from raybench.core.config import dump_run_config
    from tests.small_run import small_config

    cfg = small_config(tmp_path / "run", models=("csfm",))
    cfg = replace(cfg, cohort=replace(cfg.cohort, records=24, patients=12),
                  resources=replace(cfg.resources, num_cpus=2))
    path = tmp_path / "cfg.yaml"
    path.write_text(dump_run_config(cfg))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)  # the quiet driver starts its own local Ray (its start-up lines stay out)
    attach = {**env, "RAY_ADDRESS": ray_address}
    procs = {}  # the two drivers side by side: the test waits on the longer one only
    for driver, flags, driver_env in ((REAL, (), env), (RAY_STAGE, ("--verbose",), attach)):
        run_dir = tmp_path / f"run{len(flags)}"
        procs[flags] = subprocess.Popen([sys.executable, "-c", driver, *flags, "grid", "--config", str(path),
                                         "--run-dir", str(run_dir)], env=driver_env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, cwd=ROOT)
    outs = {}
    try:
        for flags, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=600)
            assert proc.returncode == 0, stdout + stderr
            outs[flags] = stdout + stderr
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    quiet, verbose = outs[()], outs[("--verbose",)]
    assert "[3/3] encode    done in" in quiet and "encode csfm: 24/24 records in" in quiet, quiet
    assert [ln for ln in quiet.splitlines() if any(c in ln for c in RAY_CHATTER)] == [], quiet
    assert "[1/1] encode    done in" in verbose and "a Ray task ran" in verbose, verbose
    assert any(c in verbose for c in RAY_CHATTER), verbose


# ---------------------------------------------------------------- issue 39: lines a reader can follow

def test_a_task_keeps_one_rate_unit_and_a_done_task_keeps_its_rate():
    clock, lines = Clock(), []
    rep = progress.PlainReporter(lines.append, clock=clock, timer=False)
    rep.start("cells", "train cells", 100, "cells")
    rep.update("cells", done=1)
    clock.t += 1.0
    rep.update("cells", done=3)  # 2 cells/s: per second from now on
    rep.tick()
    clock.t += 60.0
    rep.update("cells", done=4)  # 3 cells in 61 s: 0.05 cells/s, still said per second
    rep.tick()
    assert [ln.split(", ")[1] for ln in lines] == ["2.0 cells/s", "0.05 cells/s"]
    rep.update("cells", done=100)
    done_rate = rep.tasks["cells"].rate(clock())
    clock.t += 600.0  # all done, waiting to be closed: the rate does not fall with the wait
    assert rep.tasks["cells"].rate(clock()) == done_rate


def test_ticks_do_not_repeat_an_unchanged_line():
    clock, lines = Clock(), []
    rep = progress.PlainReporter(lines.append, clock=clock, timer=False)
    rep.start("enc", "encode 6 encoders in one pass", 1500, "records")
    rep.tick()
    clock.t += 10.0
    rep.tick()  # still nothing encoded: the 0/1500 line is not printed again
    rep.update("enc", done=1500)
    clock.t += 10.0
    rep.tick()
    clock.t += 10.0
    rep.tick()  # all done, not yet closed: printed once
    assert lines == ["  encode 6 encoders in one pass: 0/1500 records, -- records/s, ETA --",
                     "  encode 6 encoders in one pass: 1500/1500 records, -- records/s, ETA --"]


def test_one_pipeline_of_several_encoders_is_one_progress_line():
    import numpy as np

    from raybench.encoders.sink import Sink, consume

    class Batches:
        def iter_batches(self, **kw):
            for lo in (0, 3):
                ids = np.arange(lo, lo + 3)
                yield {"ecg_id": ids, "split": np.array(["train"] * 3),
                       **{f"{i}:{k}": v for i in (0, 1) for k, v in (
                           ("ok", np.ones(3, bool)), ("states", np.zeros((3, 0, 2))),
                           ("notes", np.array(["[]"] * 3)), ("device", np.array(["cpu"] * 3)))}}

    clock, lines = Clock(), []
    rep = progress.PlainReporter(lines.append, clock=clock, timer=False)
    sinks = [Sink(name, {}, [], 6, f"{i}:") for i, name in enumerate(("csfm", "ecg_fm"))]
    with progress.active(rep):
        consume(Batches(), sinks, 0.0, progress=False)
    assert lines == ["  encode 2 encoders in one pass (csfm, ecg_fm): 6/6 records in 0:00"]


def test_work_added_after_a_task_is_done_starts_a_new_line_instead_of_growing_its_total():
    clock, lines = Clock(), []
    rep = progress.PlainReporter(lines.append, clock=clock, timer=False)
    rep.add_total("boot", "bootstrap tasks", 36, "tasks")
    rep.advance("boot", 36)
    clock.t += 5.0
    rep.add_total("boot", "bootstrap tasks", 210, "tasks")  # the next analysis' bootstrap
    rep.tick()
    assert lines == ["  bootstrap tasks: 36/36 tasks in 0:05", "  bootstrap tasks: 0/210 tasks, -- tasks/s, ETA --"]
