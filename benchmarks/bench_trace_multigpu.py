"""Time a traced 4-rank FSDP2 GRPO step of 7B (rank 0 on a fake process group); prints seconds, RSS, CPU time.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_trace_multigpu.py [--model 7B --gpus 4 --steps 2]

Target: a 4-rank trace of a 7B step in under 2 minutes on 2 cores. Wall time on a shared machine
depends on the load; the CPU seconds of the process are printed beside it (user + system, from getrusage).
"""

from __future__ import annotations

import argparse
import resource
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="7B")
    p.add_argument("--gpus", type=int, default=4)
    p.add_argument("--steps", type=int, default=2, help="GRPO steps traced (the grid traces 2)")
    p.add_argument("--strategy", default="FULL_SHARD", choices=["FULL_SHARD", "SHARD_GRAD_OP"])
    a = p.parse_args()
    t_import = time.perf_counter()
    from sweeps.trace import distributed
    from sweeps.trace.grids import config as _config

    imports = time.perf_counter() - t_import
    cfg = _config(model=a.model, dtype="bfloat16").with_(
        num_gpus=a.gpus, sharding="fsdp", fsdp_sharding_strategy=a.strategy
    )
    t0 = time.perf_counter()
    res = distributed.run(cfg, distributed.Layout(a.gpus, a.strategy), steps=a.steps)
    total = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    print(
        f"{a.model} x{a.gpus} {a.strategy}: imports {imports:.1f} s, setup {res.setup_seconds:.1f} s, "
        f"steps {[round(s, 1) for s in res.step_seconds]} s, total {total:.1f} s wall (without imports), "
        f"cpu {ru.ru_utime + ru.ru_stime:.1f} s, max RSS {ru.ru_maxrss / 1024:.0f} MB, "
        f"traced rank-0 peak {res.observed['peak_bytes'] / 2**30:.2f} GiB"
    )


if __name__ == "__main__":
    main()
