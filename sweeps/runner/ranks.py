"""One run over several processes (DDP over `trainer.num_gpus`): how the child is launched, where each rank
writes its result, and the one result the row gets.

The sweep starts `python -m torch.distributed.run --standalone --nproc-per-node N -m sweeps.runner.run_one
spec.json`; torch's launcher sets RANK, LOCAL_RANK and WORLD_SIZE in each rank, accelerate (inside TRL's trainer)
reads them and wraps the policy in DistributedDataParallel. Each rank writes `result.json.rank<R>`; the row
holds the rank whose peak is largest (what the card must hold) and every rank's peak beside it.

On CUDA each rank sees its own GPU only, as device 0 (CUDA_VISIBLE_DEVICES narrowed to the LOCAL_RANK-th of the
GPUs the sweep claimed, LOCAL_RANK then 0): the probes, the memory limit and accelerate all use device 0, and
NCCL reaches the peers across processes as it does under a scheduler that binds one GPU per task.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

LAUNCHER = "torch.distributed.run"


def world_size(environ: Mapping[str, str] = os.environ) -> int:
    """How many ranks this process belongs to (1 outside torch's launcher)."""
    try:
        return max(1, int(environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1


def launch_argv(module: str, spec_path: Path, nproc: int) -> list[str]:
    """The child's command: `module` itself for one process, under torch's launcher for several."""
    if nproc <= 1:
        return [sys.executable, "-m", module, str(spec_path)]
    return [
        sys.executable,
        "-m",
        LAUNCHER,
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        str(spec_path),
    ]


def result_path(path: str | os.PathLike, environ: Mapping[str, str] = os.environ) -> Path:
    """Where this rank writes its result: `path` itself in a single process, `path.rank<RANK>` in several."""
    path = Path(path)
    if world_size(environ) == 1:
        return path
    return path.with_name(f"{path.name}.rank{environ.get('RANK', '0')}")


def rank_results(path: str | os.PathLike) -> dict[int, Path]:
    """The per-rank result files written beside `path`, by rank."""
    path = Path(path)
    out = {}
    for p in path.parent.glob(f"{path.name}.rank*"):
        suffix = p.name[len(path.name) + len(".rank") :]
        if suffix.isdigit():
            out[int(suffix)] = p
    return dict(sorted(out.items()))


def narrow_to_local_rank(environ: MutableMapping[str, str], device: str) -> None:
    """On CUDA under torch's launcher: this rank sees only its own GPU, as device 0 (call before torch is imported).
    A no-op on CPU and in a single process."""
    if device != "cuda" or world_size(environ) == 1 or "LOCAL_RANK" not in environ:
        return
    local = int(environ["LOCAL_RANK"])
    visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    environ["CUDA_VISIBLE_DEVICES"] = visible[local] if local < len(visible) else str(local)
    environ["LOCAL_RANK"] = "0"


def merge(results: Mapping[int, dict], nproc: int) -> dict:
    """The run's one result from its ranks' (rank -> result): ok when every rank finished ok, then the largest
    peak's rank with `observed.ranks` (each rank's peak and phase); else the first rank's failure, an OOM before
    any other error."""
    missing = [r for r in range(nproc) if r not in results]
    failed = [(r, res) for r, res in sorted(results.items()) if res.get("status") != "ok"]
    if failed:
        rank, res = next(((r, x) for r, x in failed if x.get("status") == "oom"), failed[0])
        return {**res, "error": f"rank {rank}: {res.get('error')}"}
    if missing:
        return {"status": "error", "error": f"rank {missing[0]} of {nproc} wrote no result"}
    peaks = {r: (res.get("observed") or {}).get("peak_bytes") or 0 for r, res in results.items()}
    top = max(peaks, key=lambda r: (peaks[r], -r))
    merged = dict(results[top])
    merged["observed"] = {
        **(merged.get("observed") or {}),
        "rank": top,
        "ranks": [
            {
                "rank": r,
                "peak_bytes": peaks[r],
                "peak_phase": (results[r].get("observed") or {}).get("peak_phase"),
            }
            for r in sorted(results)
        ],
    }
    return merged
