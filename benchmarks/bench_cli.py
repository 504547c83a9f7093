"""Wall time of `vram-estimate` as a subprocess, median of N per case, against each case's target.

Cases: the README's first command (the configuration fits) and `--solve`, 0.3 s; a card the run does not fit
(the advice plan prices every change) and a long-completion run on a small card (the plan's longest search),
1 s, the README's "answers in under a second". Results: benchmarks/cli_time.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = {  # name: (arguments, target seconds)
    "fits": (["--model", "7B", "--lora", "--gens", "8"], 0.3),
    "solve": (["--model", "7B", "--lora", "--gpu", "4090", "--solve", "max_completion_length"], 0.3),
    "advice": (["--model", "7B", "--gpu", "T4"], 1.0),
    "long": (["--model", "7B", "--gpu", "T4", "--max-completion-length", "32768"], 1.0),
}


def command(args: list[str]) -> list[str]:
    """The installed console script if present, else `python -m estimator.interface.cli`."""
    exe = shutil.which("vram-estimate", path=str(Path(sys.executable).parent))
    return [exe, *args] if exe else [sys.executable, "-m", "estimator.interface.cli", *args]


def time_once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    # exit 1 is the answer "does not fit"; 2 and above are errors
    if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode > 1:
        raise SystemExit(f"bench_cli: {' '.join(cmd)} failed")
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=15, help="runs per case (default 15, after 1 warm-up)")
    p.add_argument(
        "--case", choices=sorted(CASES), action="append", help="one case (repeatable; default all)"
    )
    a = p.parse_args()
    missed = 0
    for name in a.case or list(CASES):
        args, target = CASES[name]
        cmd = command(args)
        time_once(cmd)
        times = sorted(time_once(cmd) for _ in range(a.n))
        med = statistics.median(times)
        missed += med >= target
        print(
            f"{name:7s} median {med * 1000:6.1f} ms  min {times[0] * 1000:6.1f}  max {times[-1] * 1000:6.1f}"
            f"  target < {target * 1000:.0f} ms: {'met' if med < target else 'MISSED'}  ({' '.join(args)})"
        )
    print(f"runs: {a.n} per case, after one warm-up")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
