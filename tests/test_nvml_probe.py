"""NVML sampler logic with an injected fake device (no GPU needed)."""

import time

from sweeps.probes.nvml import NvmlProbe, make_probe

MIB = 2**20


class FakeDevice:
    """Replays a script of (device used, process used) readings; the last reading repeats."""

    def __init__(self, readings, pid):
        self.readings = list(readings)
        self.pid = pid
        self.i = 0
        self.queried = []

    def _next(self):
        r = self.readings[min(self.i, len(self.readings) - 1)]
        self.i += 1
        return r

    def used_bytes(self):
        self.current = self._next()
        return self.current[0]

    def process_bytes(self, pid):
        self.queried.append(pid)
        return self.current[1] if pid == self.pid else None


def test_sample_folds_peaks_per_phase():
    dev = FakeDevice([(100, 10), (500, 50), (300, 30), (900, 70), (200, 20)], pid=42)
    probe = NvmlProbe(device=dev, pid=42)
    probe.phase = "generate"
    probe.sample()
    probe.sample()
    probe.phase = "train"
    probe.sample()
    probe.sample()
    probe.phase = "optimizer"
    probe.sample()
    r = probe.result()
    assert r["available"] is True
    assert r["samples"] == 5
    assert r["peak_device_bytes"] == 900
    assert r["peak_process_bytes"] == 70
    assert r["phases"] == {"generate": 500, "train": 900, "optimizer": 200}
    assert r["process_phases"] == {"generate": 50, "train": 70, "optimizer": 20}
    assert set(dev.queried) == {42}


def test_thread_samples_and_boundary_sample_labels_short_phases():
    dev = FakeDevice([(1 * MIB, None)] * 3 + [(7 * MIB, None)] * 1000, pid=1)
    probe = NvmlProbe(device=dev, interval=0.001, pid=1)
    with probe:
        probe.set_phase("generate")
        time.sleep(0.05)
        probe.set_phase("train")
        time.sleep(0.05)
    r = probe.result()
    assert r["baseline_device_bytes"] == 1 * MIB
    assert r["samples"] > 10
    assert r["peak_device_bytes"] == 7 * MIB
    assert r["phases"]["train"] == 7 * MIB
    assert r["peak_process_bytes"] is None  # this pid never listed by NVML


def test_unavailable_probe_says_why():
    probe = NvmlProbe(device=None, reason="NVMLError_LibraryNotFound: no library")
    with probe:
        probe.set_phase("train")
    assert probe.result() == {"available": False, "reason": "NVMLError_LibraryNotFound: no library"}


def test_make_probe_on_this_machine_reports_or_explains():
    r = make_probe().result()
    assert r["available"] in (True, False)
    if not r["available"]:
        assert r["reason"]


def test_torch_cuda_probe_folds_peaks_at_phase_boundaries(monkeypatch):
    """torch_cuda probe logic with torch.cuda's counters scripted (no GPU needed)."""
    import torch

    from sweeps.probes.torch_cuda import TorchCudaProbe

    peaks = iter([(10, 20), (50, 64), (30, 64), (70, 96)])  # (allocated, reserved) at each boundary
    current = {}
    resets = []

    def read(kind):
        def f(device=None):
            if not current:
                current.update(zip(("a", "r"), next(peaks), strict=True))
            return current[kind]

        return f

    def reset(device=None):
        resets.append(device)
        current.clear()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", read("a"))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", read("r"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", reset)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda device=None: {"num_alloc_retries": 2})
    probe = TorchCudaProbe().start()
    probe.set_phase("generate")  # closes "other" with (10, 20)
    probe.set_phase("train")  # closes generate with (50, 64)
    probe.set_phase("generate")  # closes train with (30, 64)
    probe.stop()  # closes generate with (70, 96)
    r = probe.result()
    assert r["phases"] == {"other": 10, "generate": 70, "train": 30}
    assert (r["peak_allocated_bytes"], r["peak_reserved_bytes"]) == (70, 96)
    assert r["reserved_phases"]["train"] == 64 and r["num_alloc_retries"] == 2
    assert len(resets) == 5  # start + every boundary
