"""A stand-in for `sweeps.runner.run_one` in CPU tests of grpo-vram-mincard (`--child-module`): it reads the same
spec and writes a result shaped like a GPU run's, without building a model. The run "needs" the spec's
`simulated_need_bytes` (the test double of sweeps/runner/memory_limit.py, whose rule it applies); a pass reports a
stream whose peak allocated is 80 % and peak reserved 105 % of that need, or the spec variant's
`fake_reserved_ratio` (a stream that reserved less than it needs: a non-deterministic run); a `history` probe
asked for is reported, unavailable, as on a machine without CUDA."""

import json
import sys
from pathlib import Path

from sweeps import records
from sweeps.runner.memory_limit import SIMULATED_KEY, SPEC_KEY, simulated_fails


def main() -> int:
    spec = json.loads(Path(sys.argv[1]).read_text())
    limit, need = spec.get(SPEC_KEY), spec.get(SIMULATED_KEY)
    if simulated_fails(limit, need):
        result = {"status": "oom", "error": "OutOfMemoryError: CUDA out of memory (simulated)"}
    else:
        ratio = float(spec.get("variant", {}).get("fake_reserved_ratio", 1.05))
        allocated, reserved = int(need * 0.8), int(need * ratio)
        torch_cuda = {"available": True, "peak_allocated_bytes": allocated, "peak_reserved_bytes": reserved}
        asked = {"history": {"available": False, "reason": "the stand-in records no stream"}}
        result = {
            "status": "ok",
            "error": None,
            "model": {"name": spec["config"]["model"], "params": 2_002_048, "trainable_params": 2_002_048},
            "observed": {
                "source": "measured-cpu",
                "peak_bytes": allocated,
                "peak_phase": "train",
                "phases": {"train": allocated},
                "probes": {
                    "torch_cuda": torch_cuda,
                    "nvml": {"available": True, "peak_process_bytes": reserved},
                    **{k: v for k, v in asked.items() if k in spec.get("probes", ())},
                },
                "cuda_context": {"context_bytes": 1000},
            },
            "step_seconds": [0.1, 0.1],
            "versions": {**records.package_versions(), "cuda": None, "driver": None},
            "device": {"type": "cpu", "name": "fake", "total_bytes": 8 << 30},
        }
    Path(spec["result_path"]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
