"""A CPU rehearsal of the DeepSpeed ZeRO runner path: tiny-2M under ZeRO-2 + optimizer offload and ZeRO-3 +
optimizer and parameter offload, through DeepSpeed's CPU accelerator (`DS_ACCELERATOR=cpu`, gloo without oneCCL),
each run in its own child (`run_one`, as a sweep runs it) with the tensors and host probes, rows measured-cpu.

The sweep refuses ZeRO on CPU (the estimator sizes a CPU run as one unsharded process), so the jobs are built
here rather than from the Hydra config; everything after (child, DeepSpeed config, distributed variables, phase
labels, row) is the path a GPU lease takes. Needs deepspeed installed (`.venvs/ds`, see `make zero-cpu`).

    python -m sweeps.runner.zero_rehearsal [--out results/raw/zero-cpu.jsonl]
"""

from __future__ import annotations

import sys
from pathlib import Path

from estimator.settings.config import RunConfig
from sweeps.oneline import OneLineParser
from sweeps.runner import deepspeed_config, tiny
from sweeps.runner.job import Job, deepspeed_variant

SHAPE = dict(
    model="tiny-2M",
    device="cpu",
    bf16=False,
    per_device_train_batch_size=4,
    num_generations=4,
    max_prompt_length=32,
    max_completion_length=32,
)
CASES = (
    {"sharding": "zero2", "offload_optimizer": True},
    {"sharding": "zero3", "offload_optimizer": True, "offload_param": True},
)


def jobs(results_path: Path, timeout_s: float = 900.0) -> list[Job]:
    """One Job per rehearsed case, with the variant `job.to_job` gives a ZeRO run."""
    out = []
    for case in CASES:
        cfg = RunConfig(**SHAPE, **case)
        variant = {"steps": 2, "tiny_model": tiny.spec_dict(cfg.model)}
        deepspeed_variant(cfg, variant)
        out.append(
            Job(
                config=cfg,
                variant=variant,
                probes=["tensors", "host"],
                inject_failure=None,
                sweep=results_path.stem,
                results_path=results_path,
                timeout_s=timeout_s,
                gpus=None,
                keep_workdir=False,
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m sweeps.runner.zero_rehearsal", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/raw/zero-cpu.jsonl"))
    args = parser.parse_args(argv)
    if not deepspeed_config.deepspeed_installed():
        print("zero_rehearsal: deepspeed is not installed here (pip install deepspeed)", file=sys.stderr)
        return 2
    from sweeps.runner import measure

    measure.check_writable(args.out)
    rows = [measure.run_job(j) for j in jobs(args.out)]
    return 0 if all(r is None or r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
