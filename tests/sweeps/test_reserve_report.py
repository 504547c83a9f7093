"""reserve: the estimator's reserved and nvidia-smi layers against the torch_cuda and nvml probes of GPU rows."""

import json
from pathlib import Path

from estimator.units import MIB
from sweeps.report import reserve


def _gpu_row(key, allocated, reserved, nvml, source="measured-gpu"):
    return {
        "schema": 1,
        "key": key,
        "source": source,
        "status": "ok",
        "sweep": "t",
        "config": {"model": "m", "per_device_train_batch_size": 4, "num_generations": 4},
        "model": {"name": "m"},
        "observed": {
            "peak_bytes": allocated,
            "peak_phase": "train",
            "probes": {
                "torch_cuda": {
                    "available": True,
                    "peak_allocated_bytes": allocated,
                    "peak_reserved_bytes": reserved,
                },
                "nvml": {"available": True, "peak_process_bytes": nvml},
            },
        },
    }


def fixed(config, hf, tensors="real"):
    """Predicts 100 MiB allocated, 120 MiB reserved, 160 MiB at nvidia-smi for every config."""
    return {
        "peak_allocated_bytes": 100 * MIB,
        "peak_reserved_bytes": 120 * MIB,
        "peak_device_bytes": 160 * MIB,
    }, None


def test_layers_errors_by_hand():
    rows = [
        _gpu_row("a", 100 * MIB, 150 * MIB, 200 * MIB),  # reserved 120 vs 150: -20 %; smi 160 vs 200: -20 %
        _gpu_row("b", 90 * MIB, 100 * MIB, 128 * MIB),  # +20 %; +25 %
        _gpu_row("c", 95 * MIB, 120 * MIB, 160 * MIB),  # 0 %; 0 %
        _gpu_row("d", 95 * MIB, 10 * MIB, 10 * MIB, source="measured-cpu"),  # not a GPU row: left out
    ]
    frame = reserve.reserve_frame(rows, predictor=fixed).set_index("key")
    assert list(frame.index) == ["a", "b", "c"]
    assert abs(frame.loc["a", "reserved_rel_error"] + 0.2) < 1e-12
    assert abs(frame.loc["b", "nvml_rel_error"] - 0.25) < 1e-12
    lines = reserve.reserve_lines(frame.reset_index())
    assert lines == [
        "reserve[measured-gpu, reserved]: 3 configs, median |error| 20.0%, worst signed -20.0%, "
        "1 under-predicted by > 2%",
        "reserve[measured-gpu, nvidia-smi]: 3 configs, median |error| 20.0%, worst signed +25.0%, "
        "1 under-predicted by > 2%",
    ]


def test_row_without_probes_has_no_layer_error():
    row = _gpu_row("a", 100 * MIB, 150 * MIB, 200 * MIB)
    row["observed"]["probes"] = {"torch_cuda": {"available": False}}
    frame = reserve.reserve_frame([row], predictor=fixed)
    assert frame["reserved_rel_error"].isna().all() and frame["nvml_rel_error"].isna().all()
    assert all("no rows" in line for line in reserve.reserve_lines(frame))


def test_committed_gpu_rows_each_have_both_layers():
    """Every committed measured-gpu row carries torch's reserved peak and NVML's process peak, so the reserve
    lines cover all of them (the real estimator, recomputed)."""
    path = Path(__file__).resolve().parents[2] / "results" / "raw" / "gpu-validate.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    frame = reserve.reserve_frame(rows)
    assert len(frame) == len([r for r in rows if r["status"] == "ok"]) > 0
    assert frame["reserved_rel_error"].notna().all() and frame["nvml_rel_error"].notna().all()
    # the reserve never sits below the tensors it holds
    assert (frame["reserved_bytes"] >= frame["allocated_bytes"]).all()
