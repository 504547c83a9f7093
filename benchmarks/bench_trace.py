"""Time traced GRPO steps (FakeTensorMode + LiveStorageMode) at real size; prints seconds and max RSS.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_trace.py [7B full bf16 | --all]

Target: a traced 7B config (two steps) < 60 s on 2 cores and < 2 GB RSS.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

CASES = {
    "7B-full-bf16": {"model": "7B", "dtype": "bfloat16"},
    "7B-full-fp32": {"model": "7B", "dtype": "float32"},
    "7B-lora-bf16": {"model": "7B", "dtype": "bfloat16", "use_peft": True},
    "7B-qlora-bf16": {"model": "7B", "dtype": "bfloat16", "use_peft": True, "load_in_4bit": True},
    "14B-full-bf16-G16": {
        "model": "14B",
        "dtype": "bfloat16",
        "num_generations": 16,
        "per_device_train_batch_size": 16,
    },
}


def one(kw: dict) -> None:
    """Trace one config in this process and print timings."""
    from estimator.settings.config import RunConfig
    from estimator.units import GIB
    from sweeps.trace import step

    t0 = time.perf_counter()
    res = step.run(RunConfig(**kw))
    total = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    peak = res.observed["peak_bytes"] / GIB
    print(
        f"setup {res.setup_seconds:.1f} s, steps {[round(s, 1) for s in res.step_seconds]} s, "
        f"total {total:.1f} s (without imports), max RSS {rss:.0f} MB, traced peak {peak:.2f} GiB"
    )


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        one(json.loads(sys.argv[2]))
        return
    names = list(CASES) if "--all" in sys.argv else ["7B-full-bf16", "7B-lora-bf16"]
    for name in names:
        t0 = time.perf_counter()
        out = subprocess.run(
            [sys.executable, __file__, "--one", json.dumps(CASES[name])], capture_output=True, text=True
        )
        wall = time.perf_counter() - t0
        last = (out.stdout.strip().splitlines() or [out.stderr.strip().splitlines()[-1]])[-1]
        print(f"{name:<20} wall {wall:5.1f} s (with imports) | {last}", flush=True)


if __name__ == "__main__":
    main()
