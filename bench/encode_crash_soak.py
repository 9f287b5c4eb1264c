"""The encode crash tests, N times in a row, while other processes keep every core busy.

The failed-pipeline leak (an encoder actor outliving its pipeline, so that a rerun starved) showed only on a
loaded machine; this repeats the tests that guard it under load and prints how many runs passed.

    python3 bench/encode_crash_soak.py --runs 20

Ray runs its worker processes at niceness 15. Busy processes at niceness 0 leave them almost no CPU (a run then
takes many minutes: it measures the kernel's scheduler, not raybench), so the burners run at `--nice` (default
15, Ray's workers' own), as a second test worker's Ray processes would.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = "crash or holds_them"  # the crash-then-rerun tests; cannot_get_its_resources / starts_after: add with -k


def burn(stop_at: float, nice: int) -> None:
    """Keep one core busy until `stop_at`."""
    os.nice(nice)
    x = 0
    while time.time() < stop_at:
        x = (x * 1103515245 + 12345) % 2**31


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--burners", type=int, default=os.cpu_count() or 2, help="busy processes (default: cores)")
    parser.add_argument("--nice", type=int, default=15, help="the busy processes' niceness (Ray's workers: 15)")
    parser.add_argument("-k", default=TESTS, help="which tests of tests/encoders/test_extract.py")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {args.burners} busy processes at niceness {args.nice}; "
          f"tests: {args.k}", flush=True)
    burners = [mp.Process(target=burn, args=(time.time() + 24 * 3600, args.nice), daemon=True)
               for _ in range(args.burners)]
    for p in burners:
        p.start()
    passed = 0
    try:
        for i in range(args.runs):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "tests/encoders/test_extract.py", "-k", args.k], cwd=ROOT, capture_output=True,
                                 text=True)
            last = (out.stdout.strip().splitlines() or ["(no output)"])[-1]
            ok = out.returncode == 0
            passed += ok
            print(f"run {i + 1}/{args.runs}: {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s: {last}",
                  flush=True)
            if not ok:
                print(out.stdout[-4000:], flush=True)
                break
    finally:
        for p in burners:
            p.terminate()
    print(f"{passed} of {args.runs} runs passed in a row under load")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
