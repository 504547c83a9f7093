"""One tiny GRPO step through the sweep's child process with every probe: on the GPU when CUDA is present, and the
same code path with the device switched to the CPU (which must run and label every phase too)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps.probes.phases import PHASES

REPO = Path(__file__).resolve().parents[2]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _run_one(tmp_path: Path, device: str) -> dict:
    """`python -m sweeps.runner.run_one` on tiny-2M (2 steps, every probe) in its own process; its result."""
    spec = {
        "config": {
            "model": "tiny-2M",
            "device": device,
            "dtype": "bfloat16" if device == "cuda" else "float32",
            "bf16": device == "cuda",
            "per_device_train_batch_size": 4,
            "num_generations": 4,
            "max_prompt_length": 8,
            "max_completion_length": 8,
            "beta": 0.04,  # a reference pass, so the score phase holds real work
        },
        "variant": {"steps": 2},
        "probes": ["tensors", "torch_cuda", "nvml"],
        "result_path": str(tmp_path / "result.json"),
        "workdir": str(tmp_path / "work"),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "sweeps.runner.run_one", str(tmp_path / "spec.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok", result.get("error")
    return result


@pytest.mark.slow
def test_cpu_path_runs_and_labels_every_phase(tmp_path):
    obs = _run_one(tmp_path, "cpu")["observed"]
    assert set(PHASES) <= set(obs["phases_seen"])
    tensors = obs["probes"]["tensors"]["phases"]
    assert all(tensors[p] > 0 for p in PHASES)
    # the GPU probes are present and say why they measured nothing; no context is measured on the CPU
    for name in ("torch_cuda", "nvml"):
        assert obs["probes"][name]["available"] is False and obs["probes"][name]["reason"]
    assert obs["cuda_context"] is None and obs["after_build"] is None


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
def test_gpu_step_every_probe_orders_nvml_reserved_allocated(tmp_path):
    obs = _run_one(tmp_path, "cuda")["observed"]
    assert obs["source"] == "measured-gpu"
    assert set(PHASES) <= set(obs["phases_seen"])
    tc, nv = obs["probes"]["torch_cuda"], obs["probes"]["nvml"]
    assert tc["available"] and nv["available"], nv.get("reason")
    for p in PHASES:
        alloc, reserved = tc["phases"][p], tc["reserved_phases"][p]
        device = nv["phases"][p]
        process = nv["process_phases"].get(
            p
        )  # None where NVML cannot see this process (container PID namespace)
        assert alloc > 0, p
        assert reserved >= alloc, p
        # no empty_cache() in these steps: reserved never shrinks, so the boundary sample sees the phase's peak
        assert (process if process is not None else device) >= reserved, p
        assert device >= (process or 0), p
    ctx = obs["cuda_context"]
    assert ctx["available"] and ctx["torch_allocated_bytes"] == 0
    built = obs["after_build"]
    assert (
        built["available"]
        and 0 < built["allocated_bytes"] <= built["reserved_bytes"] <= built["max_reserved_bytes"]
    )
    assert ctx["context_bytes"] is None or ctx["context_bytes"] > 0
    assert ctx["mem_get_info_total_bytes"] >= nv["peak_device_bytes"] > 0
