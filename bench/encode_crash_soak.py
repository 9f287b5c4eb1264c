"""The encode crash tests, N times in a row, while other processes keep every core busy.

The failed-pipeline leak (an encoder actor outliving its pipeline, so that a rerun starved) showed only on a
loaded machine; this repeats the tests that guard it under load and prints how many runs passed.

    python3 bench/encode_crash_soak.py --runs 20
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
TESTS = "crash or holds_them or cannot_get_its_resources or starts_after"


def burn(stop_at: float) -> None:
    """Keep one core busy until `stop_at`."""
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
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; {args.burners} busy processes", flush=True)
    burners = [mp.Process(target=burn, args=(time.time() + 24 * 3600,), daemon=True) for _ in range(args.burners)]
    for p in burners:
        p.start()
    passed = 0
    try:
        for i in range(args.runs):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "tests/encoders/test_extract.py", "-k", TESTS], cwd=ROOT, capture_output=True,
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
