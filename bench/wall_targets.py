"""The wall-clock targets a user waits on: the demo end to end, its rerun with nothing to do, the test suite.

    python bench/wall_targets.py                 # demo (fresh folder) + rerun, then the test suite
    python bench/wall_targets.py --skip-suite    # the demo only (~4-5 minutes on 2 cores)

Runs the commands a user runs (`raybench grid` on its embedded default; the README's test command, read from
.ci/run) and prints each wall time against its target with the demo's per-stage times. Run it on an idle
machine: everything here is CPU-bound, and the figures move with whatever else runs (and with the VM's day).
The SAE-step and bootstrap targets are printed by bench/sae_train.py and bench/bootstrap.py.
"""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMO_TARGET_S = 240.0
RERUN_TARGET_S = 3.0
SUITE_TARGET_S = 600.0
STAGE_DONE = re.compile(r"^\[\d+/\d+\] (\w+)\s+done in\s+([\d.]+) s")
STAGE_SKIPPED = re.compile(r"^\[\d+/\d+\] (\w+)\s+complete, skipped")


def suite_command(ci_script: Path = ROOT / ".ci" / "run") -> list[str]:
    """The pytest command .ci/run ends with (the README's test command), as an argument list."""
    for line in reversed(ci_script.read_text().splitlines()):
        if "-m pytest" in line:
            return shlex.split(line[line.index("python3 -m pytest"):])
    raise SystemExit(f"no `python3 -m pytest` command in {ci_script}")


def timed(cmd: list[str], cwd: Path = ROOT) -> tuple[float, str]:
    """(wall seconds, stdout + stderr) of cmd; exits naming the command when it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{shlex.join(cmd)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return wall, proc.stdout + proc.stderr


def stage_times(out: str) -> dict[str, float]:
    """stage -> seconds from `raybench grid`'s `[i/n] stage done in X s` lines."""
    return {m[1]: float(m[2]) for m in map(STAGE_DONE.match, out.splitlines()) if m}


def skipped_stages(out: str) -> list[str]:
    return [m[1] for m in map(STAGE_SKIPPED.match, out.splitlines()) if m]


def verdict(wall: float, target: float) -> str:
    return f"{wall:.1f} s (target <= {target:g} s): {'met' if wall <= target else 'MISSED'}"


def demo(grid: list[str], workdir: Path) -> None:
    run_dir = workdir / "demo"
    shutil.rmtree(run_dir, ignore_errors=True)
    wall, out = timed([*grid, "--run-dir", str(run_dir)])
    stages = stage_times(out)
    if not stages:
        raise SystemExit(f"no stage timings in the output of {shlex.join(grid)}:\n{out[-2000:]}")
    print(f"demo end to end (fresh folder): {verdict(wall, DEMO_TARGET_S)}")
    print("  stages: " + ", ".join(f"{name} {s:.1f}" for name, s in stages.items())
          + f"; outside the stages {wall - sum(stages.values()):.1f}")
    wall, out = timed([*grid, "--run-dir", str(run_dir)])
    skipped = skipped_stages(out)
    print(f"demo rerun, nothing to do: {verdict(wall, RERUN_TARGET_S)} ({len(skipped)} stages skipped"
          f"{', ' + ', '.join(stage_times(out)) + ' ran again' if stage_times(out) else ''})")


def suite(cmd: list[str]) -> None:
    wall, out = timed(cmd)
    summary = next((ln.strip("= ") for ln in reversed(out.splitlines()) if " passed" in ln), "no summary line")
    print(f"test suite ({shlex.join(cmd)}): {verdict(wall, SUITE_TARGET_S)}; {summary}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-demo", action="store_true")
    ap.add_argument("--skip-suite", action="store_true")
    ap.add_argument("--workdir", default=None, help="the demo's run folder goes here (default: a temp dir)")
    ap.add_argument("--grid", default=f"{shlex.quote(sys.executable)} -m raybench.app.cli grid",
                    help="the command that runs the demo (default: `raybench grid` on its embedded default)")
    ap.add_argument("--suite", default=None, help="the test command (default: the one .ci/run runs)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="raybench-wall-") as tmp:
        if not args.skip_demo:
            demo(shlex.split(args.grid), Path(args.workdir or tmp))
        if not args.skip_suite:
            suite(shlex.split(args.suite) if args.suite else suite_command())


if __name__ == "__main__":
    main()
