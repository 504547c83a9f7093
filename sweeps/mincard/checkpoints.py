"""Random-weight checkpoints (`run.weights=random`) built once, one at a time, before any limit run starts.

`tiny.save_random` is safe to race (temp folder, then rename) but each racer builds the whole model, and on CUDA it
initialises it on the GPU: a limit run that built it would do so under its own limit and fail for that reason.
So the sweep builds each one first, in a child process of its own (`python -m sweeps.mincard.checkpoints MODEL SEED
DEVICE`), with the card otherwise idle.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable

from sweeps.runner import tiny
from sweeps.runner.job import Job
from sweeps.runner.measure import PACKAGE_ROOT


def needed(jobs: Iterable[Job]) -> list[tuple[str, int, str]]:
    """(model, seed, device) of every random-weight checkpoint the jobs load, each once, in order."""
    out: dict[tuple[str, int, str], None] = {}
    for job in jobs:
        if job.variant.get("weights") == "random" and not tiny.is_tiny(job.config.model):
            out.setdefault((job.config.model, int(job.variant.get("seed", 0)), job.config.device), None)
    return list(out)


def build(model: str, seed: int, device: str, timeout_s: float = 900.0) -> str | None:
    """Build one checkpoint in a child process; None when it is there, else a one-line reason."""
    import os

    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    cmd = [sys.executable, "-m", "sweeps.mincard.checkpoints", model, str(seed), device]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"building the random weights of {model} took over {timeout_s:g} s"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        return f"building the random weights of {model} failed: {last[:200]}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Child entry: save_random(model, seed, device)."""
    model, seed, device = sys.argv[1:] if argv is None else argv
    print(tiny.save_random(model, seed=int(seed), device=device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
