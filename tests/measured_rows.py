"""The committed measured-gpu rows (results/raw/*.jsonl) the accuracy tests read, a short id for each in a test's
name, and the one check every measured tensor peak is held to."""

from __future__ import annotations

import json
from pathlib import Path

RAW = Path(__file__).resolve().parents[1] / "results" / "raw"
ROWS = RAW / "gpu-validate.jsonl"


def rows_of(name: str) -> list[dict]:
    """Every row of results/raw/<name>.jsonl whose run finished ([] before a lease has written the file)."""
    path = RAW / f"{name}.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if r.get("status") == "ok"]


def ok_rows() -> list[dict]:
    """Every `make gpu-validate` row whose run finished."""
    return rows_of("gpu-validate")


def method_of(config: dict) -> str:
    """qlora, lora or full."""
    return "qlora" if config.get("load_in_4bit") else "lora" if config.get("use_peft") else "full"


def row_id(r: dict) -> str:
    """`model-method-gcN-optim-bBETA`."""
    c = r["config"]
    return f"{c['model'].split('/')[-1]}-{method_of(c)}-gc{int(c['gradient_checkpointing'])}-{c['optim']}-b{c['beta']}"


def assert_allocated_covered(est, observed: int) -> None:
    """torch.cuda.max_memory_allocated counts the tensors, the cuBLAS / cuBLASLt workspaces allocated through the
    caching allocator (the estimate's in_reserved items), and whole blocks where a remainder of 1 MiB or less is not
    split off. The tensor estimate plus the workspaces and the band every fit verdict adds covers it; and the
    estimate is not loose: the tensors and the workspaces within 3 % of the measurement."""
    allocated = est.peak_allocated_bytes + est.in_reserved_bytes
    assert allocated + est.band_bytes >= observed
    assert abs(allocated - observed) / observed < 0.03
