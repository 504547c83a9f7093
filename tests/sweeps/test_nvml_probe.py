"""NVML sampler logic with an injected fake device (no GPU needed)."""

import os
import shutil
import sys
import time
import types

import pytest

from estimator.units import MIB
from sweeps.probes.nvml import NvmlProbe, make_probe


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


class _NVMLError(Exception):
    pass


class _NVMLError_LibraryNotFound(_NVMLError):  # noqa: N801 (pynvml's own class name)
    pass


def _fake_pynvml(used: int, procs: list[tuple[int, int]], missing_library: bool = False):
    """A stand-in for the `pynvml` module: the functions NvmlDevice calls, with scripted readings."""

    def nvml_init():
        if missing_library:
            raise _NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    return types.SimpleNamespace(
        NVMLError=_NVMLError,
        nvmlInit=nvml_init,
        nvmlDeviceGetHandleByIndex=lambda i: ("handle", i),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=used, total=80 * 1024 * MIB),
        nvmlDeviceGetComputeRunningProcesses=lambda h: [
            types.SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in procs
        ],
    )


def test_make_probe_without_the_nvml_library_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(0, [], missing_library=True))
    r = make_probe().result()
    assert r == {"available": False, "reason": "_NVMLError_LibraryNotFound: NVML Shared Library Not Found"}


def test_make_probe_reads_device_and_own_process_through_pynvml(monkeypatch):
    me = os.getpid()
    fake = _fake_pynvml(3 * MIB, [(me + 1, 2 * MIB), (me, 1 * MIB)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    probe = make_probe(interval=0.001)
    with probe:
        probe.set_phase("train")
    r = probe.result()
    assert r["available"] is True
    assert (r["baseline_device_bytes"], r["peak_device_bytes"]) == (3 * MIB, 3 * MIB)
    assert r["peak_process_bytes"] == 1 * MIB  # this pid's entry, not the other process's 2 MiB
    assert r["phases"]["train"] == 3 * MIB


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="an NVIDIA driver is installed here")
def test_make_probe_on_a_machine_without_nvidia_driver_is_unavailable():
    r = make_probe().result()
    assert r["available"] is False
    assert r["reason"].split(":")[0] in {"ImportError", "ModuleNotFoundError"} or "NVML" in r["reason"]


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
