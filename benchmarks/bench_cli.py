"""Wall time of `vram-estimate --model 7B --lora --gens 8` as a subprocess (median of N; target < 0.3 s)."""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ARGS = ["--model", "7B", "--lora", "--gens", "8"]
TARGET_S = 0.3


def command() -> list[str]:
    """The installed console script if present, else `python -m estimator.interface.cli`."""
    exe = shutil.which("vram-estimate", path=str(Path(sys.executable).parent))
    return [exe, *ARGS] if exe else [sys.executable, "-m", "estimator.interface.cli", *ARGS]


def time_once(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("-n", type=int, default=15, help="runs (default 15, after 1 warm-up)")
    n = p.parse_args().n
    cmd = command()
    time_once(cmd)
    times = sorted(time_once(cmd) for _ in range(n))
    med = statistics.median(times)
    print(f"command: {' '.join(cmd)}")
    print(
        f"runs: {n}  median {med * 1000:.1f} ms  min {times[0] * 1000:.1f} ms  max {times[-1] * 1000:.1f} ms"
    )
    print(f"target < {TARGET_S * 1000:.0f} ms: {'met' if med < TARGET_S else 'MISSED'}")
    return 0 if med < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
