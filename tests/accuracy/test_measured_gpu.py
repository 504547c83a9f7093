"""The estimator against the committed measured-gpu rows (results/raw/gpu-validate.jsonl: real GRPO steps on one
H100 80GB, torch 2.11, TRL 1.16). The observed numbers come from torch's counters and NVML on that GPU, not from
the estimator, so these tests fail if an estimator change moves a prediction below what the GPU measured."""

from __future__ import annotations

import pytest
from measured_rows import assert_allocated_covered, ok_rows, row_id

from estimator.settings.config import RunConfig
from estimator.step.estimate import estimate
from sweeps.runner.predict import arch_for


def test_rows_are_real_gpu_measurements():
    rows = ok_rows()
    assert len(rows) >= 12
    for r in rows:
        assert r["source"] == "measured-gpu" and r["device"]["type"] == "cuda"
        assert "H100" in r["device"]["name"]
        assert r["observed"]["probes"]["torch_cuda"]["available"]


@pytest.mark.parametrize("row", ok_rows(), ids=row_id)
def test_estimate_with_band_covers_measured_allocated(row):
    cfg = RunConfig.from_dict(row["config"])
    assert_allocated_covered(estimate(cfg, arch_for(cfg)), row["observed"]["peak_bytes"])


@pytest.mark.parametrize("row", ok_rows(), ids=row_id)
def test_device_estimate_covers_nvml_process_peak(row):
    # what the card must hold (nvidia-smi level) is at or above the process's NVML peak on that H100
    cfg = RunConfig.from_dict(row["config"])
    est = estimate(cfg, arch_for(cfg))
    nvml = row["observed"]["probes"]["nvml"]["peak_process_bytes"]
    assert est.peak_device_bytes >= nvml
