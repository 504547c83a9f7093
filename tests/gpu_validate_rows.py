"""The committed measured-gpu rows of `make gpu-validate` (results/raw/gpu-validate.jsonl) that ran, and a short id
for each in a test's name."""

from __future__ import annotations

import json
from pathlib import Path

ROWS = Path(__file__).resolve().parents[1] / "results" / "raw" / "gpu-validate.jsonl"


def ok_rows() -> list[dict]:
    """Every row whose run finished."""
    rows = [json.loads(line) for line in ROWS.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["status"] == "ok"]


def row_id(r: dict) -> str:
    """`model-method-gcN-optim-bBETA`."""
    c = r["config"]
    method = "qlora" if c["load_in_4bit"] else "lora" if c["use_peft"] else "full"
    return (
        f"{c['model'].split('/')[-1]}-{method}-gc{int(c['gradient_checkpointing'])}-{c['optim']}-b{c['beta']}"
    )
