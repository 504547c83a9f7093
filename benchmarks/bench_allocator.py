"""Replay time of the caching-allocator model (estimator/hardware/allocator.py) on a recorded 7B GRPO stream, per step.

    python benchmarks/bench_allocator.py [--stream results/streams/KEY.txt.gz] [-n 5]

Default stream: the largest-model stream in results/streams/index.jsonl (7B LoRA with checkpointing when
recorded). Times `simulate()` only (the stream is loaded once); per step = total / the stream's steps.
Target: under 1 s per 7B step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from estimator.hardware.allocator import AllocatorSettings, load_stream, simulate  # noqa: E402

STREAMS = REPO / "results" / "streams"
TARGET_S = 1.0


def default_stream() -> tuple[Path, int, str]:
    """(path, steps, description) of the 7B stream, else the stream with the most events."""
    rows = [json.loads(line) for line in (STREAMS / "index.jsonl").read_text().splitlines()]
    seven = [r for r in rows if r["config"]["model"] == "7B"]
    r = max(seven or rows, key=lambda r: r["events"])
    c = r["config"]
    desc = f"{c['model']} peft={c['use_peft']} 4bit={c['load_in_4bit']} gc={c['gradient_checkpointing']}"
    return STREAMS / r["stream"], r["steps"], desc


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stream", type=Path)
    p.add_argument("--steps", type=int, default=3, help="steps in --stream (default 3)")
    p.add_argument("-n", type=int, default=5, help="runs (default 5, after 1 warm-up)")
    a = p.parse_args()
    path, steps, desc = (a.stream, a.steps, a.stream.name) if a.stream else default_stream()
    events = load_stream(path)
    for name, settings in (
        ("default", AllocatorSettings()),
        ("expandable", AllocatorSettings(expandable_segments=True)),
    ):
        simulate(events, settings)
        times = []
        for _ in range(a.n):
            t0 = time.perf_counter()
            simulate(events, settings)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times) / steps
        print(
            f"{desc} ({path.name}, {len(events)} events, {steps} steps), allocator {name}: "
            f"{med * 1000:.0f} ms per step (median of {a.n}; target < {TARGET_S * 1000:.0f} ms)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
