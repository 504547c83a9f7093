"""Synthetic result rows and a toy estimator for the table / plot / fit tests (no real estimator numbers)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from estimator.model.catalog import resolve_model
from estimator.settings.config import RunConfig
from estimator.step.estimate import Estimate
from estimator.units import MIB

CONTEXT = 500 * MIB
RESERVE = 0.05


def toy_estimate(cfg: RunConfig) -> Estimate:
    """A simple, fast stand-in for estimate(): weights, grads, optimizer, activations, KV cache."""
    arch = resolve_model(cfg.model)
    p = arch.total_params
    wb = 2 if cfg.dtype != "float32" else 4
    weights = p // 2 if cfg.load_in_4bit else p * wb
    trainable = p // 100 if cfg.use_peft else p
    grads = trainable * (4 if cfg.use_peft else wb)
    optim = trainable * (2 if "8bit" in cfg.optim else 2 * (4 if cfg.use_peft else wb))
    tokens = cfg.per_device_train_batch_size * cfg.sequence_length
    acts = tokens * arch.hidden_size * arch.num_layers * (4 if cfg.gradient_checkpointing else 24)
    kv = (
        cfg.generation_sequences
        * cfg.sequence_length
        * arch.num_layers
        * 4
        * arch.num_kv_heads
        * arch.head_dim
    )
    phases = {
        "generate": {"weights": weights, "optimizer_state": optim, "kv_cache": kv},
        "score": {"weights": weights, "optimizer_state": optim},
        "train": {"weights": weights, "optimizer_state": optim, "gradients": grads, "activations": acts},
        "optimizer": {
            "weights": weights,
            "optimizer_state": optim,
            "gradients": grads,
            "optimizer_temp": grads,
        },
    }
    alloc = max(sum(c.values()) for c in phases.values())
    return Estimate(cfg, arch, phases, CONTEXT, int(alloc * RESERVE), trainable_params=trainable)


def row(
    cfg: RunConfig,
    source: str,
    peak: int | None,
    *,
    status: str = "ok",
    key: str | None = None,
    sweep: str = "synthetic",
    probes: dict | None = None,
    device: dict | None = None,
    phase: str = "train",
) -> dict:
    """A result row in the SCHEMA.md shape with the given observed peak."""
    cfgd = cfg.to_dict()
    return {
        "schema": 1,
        "key": key
        or f"{source}-" + hashlib.sha256(json.dumps(cfgd, sort_keys=True).encode()).hexdigest()[:12],
        "source": source,
        "status": status,
        "error": None if status == "ok" else "CUDA out of memory",
        "sweep": sweep,
        "variant": {"steps": 2},
        "config": cfgd,
        "model": {"name": cfg.model, "params": 1, "trainable_params": 1},
        "observed": None
        if peak is None
        else {
            "source": source,
            "peak_bytes": peak,
            "peak_phase": phase,
            "phases": {phase: peak},
            "probes": probes or {},
        },
        "prediction": None,
        "step_seconds": [1.0, 1.0],
        "versions": {"python": "3.11.2", "torch": "2.13.0", "trl": "1.16.0", "cuda": None, "driver": None},
        "device": device or {"type": "cuda", "name": "fake", "total_bytes": None},
        "git_commit": "0123456789abcdef",
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write rows one per line (sorted keys)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    return path
