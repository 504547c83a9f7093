"""`make allocator-check`: replay recorded allocation streams on a real GPU through torch's own caching allocator
and compare `torch.cuda.max_memory_reserved()` with the simulation (`estimator.hardware.allocator`).

    python -m sweeps.report.allocator_check [--streams results/streams] [--conf "expandable_segments:True"]

Each stream replays in a fresh subprocess (PYTORCH_CUDA_ALLOC_CONF must be set before CUDA initialises): every
`a ID SIZE` becomes `torch.empty(SIZE, dtype=torch.uint8, device="cuda")` (exactly SIZE bytes requested), every
`f ID` drops it, `e` calls `torch.cuda.empty_cache()`. Rows print measured-gpu vs simulated peaks. Where there is
no CUDA device it prints that the check was skipped and why, and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from sweeps.oneline import OneLineParser

REPO = Path(__file__).resolve().parents[2]
STREAMS = REPO / "results" / "streams"
SKIP_PREFIX = "allocator-check: skipped:"


def cuda_missing_reason() -> str | None:
    """Why the check cannot run here (None when a CUDA device is usable)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None


def replay_on_gpu(path: Path) -> dict:
    """Replay one stream with the real allocator (in this process); peaks as torch reports them."""
    import torch

    from estimator.hardware.allocator import ALLOC, EMPTY_CACHE, FREE, load_stream

    live: dict[int, torch.Tensor] = {}
    torch.cuda.init()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_reserved()
    oom = None
    for n, ev in enumerate(load_stream(path), 1):
        if ev[0] == ALLOC:
            try:
                live[ev[1]] = torch.empty(ev[2], dtype=torch.uint8, device="cuda")
            except torch.OutOfMemoryError:
                oom = n
                break
        elif ev[0] == FREE:
            live.pop(ev[1], None)
        elif ev[0] == EMPTY_CACHE:
            torch.cuda.empty_cache()
    return {
        "max_memory_reserved": torch.cuda.max_memory_reserved() - base,
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "oom_event": oom,
        "device": torch.cuda.get_device_name(),
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
    }


def check(streams: Path, conf: str) -> list[dict]:
    """Replay every stream of `streams/index.jsonl` in a subprocess and pair it with its simulation."""
    from estimator.hardware.allocator import AllocatorSettings, load_stream, simulate

    rows = []
    for line in (streams / "index.jsonl").read_text().splitlines():
        idx = json.loads(line)
        path = streams / idx["stream"]
        env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": conf, "PYTHONPATH": str(REPO)}
        proc = subprocess.run(
            [sys.executable, "-m", "sweeps.report.allocator_check", "--one", str(path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        if proc.returncode != 0:
            rows.append({"stream": path.name, "error": proc.stderr.strip().splitlines()[-1:]})
            continue
        gpu = json.loads(proc.stdout.strip().splitlines()[-1])
        sim = simulate(load_stream(path), AllocatorSettings.from_conf(conf) if conf else AllocatorSettings())
        rows.append({"stream": path.name, "conf": conf, "measured-gpu": gpu, "simulated": sim.to_dict()})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=Path, default=STREAMS)
    ap.add_argument("--conf", default="", help="PYTORCH_CUDA_ALLOC_CONF for the replay and the simulation")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # subprocess: replay one stream, print JSON
    a = ap.parse_args(argv)
    reason = cuda_missing_reason()
    if reason is not None:
        print(f"{SKIP_PREFIX} {reason}; the simulation is unchecked on this machine.")
        return 0
    if a.one is not None:
        print(json.dumps(replay_on_gpu(a.one)))
        return 0
    if not (a.streams / "index.jsonl").exists():
        print(
            f"no recorded streams in {a.streams} (python -m sweeps.trace.streams records them)",
            file=sys.stderr,
        )
        return 2
    worst = 0.0
    for r in check(a.streams, a.conf):
        if "error" in r:
            print(f"{r['stream']}: replay failed: {r['error']}")
            continue
        g, s = r["measured-gpu"], r["simulated"]
        err = (s["peak_reserved"] - g["max_memory_reserved"]) / g["max_memory_reserved"]
        worst = max(worst, abs(err))
        print(
            f"{r['stream']}: reserved measured-gpu {g['max_memory_reserved'] / 2**30:.3f} GiB, simulated "
            f"{s['peak_reserved'] / 2**30:.3f} GiB ({100 * err:+.2f}%); allocated measured-gpu "
            f"{g['max_memory_allocated'] / 2**30:.3f}, simulated {s['peak_allocated'] / 2**30:.3f} GiB"
            + (f"; OOM at event {g['oom_event']} on {g['device']}" if g["oom_event"] else "")
        )
    print(f"worst |simulated - measured-gpu| / measured-gpu reserved: {100 * worst:.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
