"""The probe's allocation stream (sweeps/probes/tensors.py, record_events) and its replay through the allocator model."""

from __future__ import annotations

import torch

from estimator.hardware.allocator import simulate
from sweeps.probes.tensors import LiveStorageMode


def test_probe_records_allocs_frees_and_phases_in_order():
    # 1000 float32 = 4000 B, 300 int64 = 2400 B; del frees the first storage; resize_ allocates the new size
    # then frees the old block (as the storage is reallocated).
    probe = LiveStorageMode(record_events=True)
    with probe:
        probe.set_phase("p")
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.empty(300, dtype=torch.int64)
        del a
        b.resize_(600)
    ev = [e for e in probe.events if e[0] != "m" or e[1] == "p"]
    assert ev[:5] == [("m", "p"), ("a", 1, 4000, 0), ("a", 2, 2400, 0), ("f", 1), ("a", 3, 4800, 0)]
    assert ev[5] == ("f", 2)


def test_replayed_stream_allocates_at_least_the_rounded_peak():
    # allocated_bytes counts whole blocks (>= the request rounded to 512 B), so the simulated peak allocated
    # is at least the probe's 512-rounded peak: 4000 -> 4096 and 2400 -> 2560 live together = 6656 B.
    probe = LiveStorageMode(round_to=512, record_events=True)
    with probe:
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.empty(300, dtype=torch.int64)
        del a, b
    r = simulate(probe.events)
    assert probe.peak_bytes == 6656
    assert r.peak_allocated >= 6656
    assert r.peak_reserved == 2 * 1024**2  # both in one 2 MiB small-pool segment


def test_allocator_check_skips_without_cuda(capsys):
    # make allocator-check on a machine without CUDA: one clear line saying it was skipped and why, exit 0.
    import pytest

    from sweeps.report import allocator_check

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the check runs instead of skipping")
    assert allocator_check.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("allocator-check: skipped: no CUDA device")
