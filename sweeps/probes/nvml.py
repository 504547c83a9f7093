"""NVML probe: a thread sampling device used memory and this process's used memory, with phase labels."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field

from sweeps.probes.sampling import SamplingThread


@dataclass
class NvmlDevice:
    """Reads one GPU through pynvml; tests inject any object with the same two methods."""

    index: int = 0
    _handle: object = None

    def __post_init__(self):
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)

    def used_bytes(self) -> int:
        """Device memory in use by everything (nvidia-smi's 'used')."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)

    def total_bytes(self) -> int:
        """The card's memory (nvidia-smi's 'total'), read without creating a CUDA context."""
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).total)

    def process_bytes(self, pid: int) -> int | None:
        """Device memory used by process `pid` (None if NVML does not list it)."""
        try:
            procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except self._nvml.NVMLError:
            return None
        for p in procs:
            if p.pid == pid and p.usedGpuMemory is not None:
                return int(p.usedGpuMemory)
        return None


def open_device(index: int = 0):
    """(device, None) or (None, reason) when NVML or the GPU is not there."""
    try:
        return NvmlDevice(index), None
    except Exception as exc:  # pynvml raises NVMLError_LibraryNotFound etc.; ImportError where not installed
        return None, f"{type(exc).__name__}: {exc}".strip()


def nvml_index(cuda_index: int = 0) -> int:
    """NVML's index of torch's CUDA device `cuda_index`, matched by UUID.

    NVML numbers every GPU in PCI order and ignores CUDA_VISIBLE_DEVICES; torch numbers the visible ones (by
    default fastest first). With CUDA_VISIBLE_DEVICES=3, torch's device 0 is NVML's 3. Falls back to
    `cuda_index` when torch or NVML cannot tell (no CUDA, an old driver).
    """
    try:
        import pynvml
        import torch

        uuid = str(torch.cuda.get_device_properties(cuda_index).uuid)
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
        return int(pynvml.nvmlDeviceGetIndex(handle))
    except Exception:
        return cuda_index


def open_cuda_device(cuda_index: int = 0):
    """open_device for torch's CUDA device `cuda_index` (see nvml_index)."""
    return open_device(nvml_index(cuda_index))


@dataclass
class NvmlProbe(SamplingThread):
    """Samples `device` every `interval` seconds on a thread; peaks overall and per phase."""

    thread_name = "nvml-probe"

    device: object | None
    interval: float = 0.01
    pid: int = field(default_factory=os.getpid)
    reason: str | None = None
    phase: str = "other"
    baseline_bytes: int | None = None
    peak_device_bytes: int = 0
    peak_process_bytes: int | None = None
    phase_device_peaks: dict[str, int] = field(default_factory=dict)
    phase_process_peaks: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def available(self) -> bool:
        return self.device is not None

    def sample(self) -> None:
        """Take one reading and fold it into the peaks under the current phase."""
        used = self.device.used_bytes()
        proc = self.device.process_bytes(self.pid)
        with self._lock:
            phase = self.phase
            self.samples += 1
            self.peak_device_bytes = max(self.peak_device_bytes, used)
            self.phase_device_peaks[phase] = max(self.phase_device_peaks.get(phase, 0), used)
            if proc is not None:
                self.peak_process_bytes = max(self.peak_process_bytes or 0, proc)
                self.phase_process_peaks[phase] = max(self.phase_process_peaks.get(phase, 0), proc)

    def read_baseline(self) -> int:
        return self.device.used_bytes()

    def result(self) -> dict:
        """{"available": False, "reason"} or the peaks (bytes) overall and per phase."""
        if not self.available:
            return {"available": False, "reason": self.reason or "no NVML device"}
        with self._lock:
            return {
                "available": True,
                "interval_s": self.interval,
                "samples": self.samples,
                "baseline_device_bytes": self.baseline_bytes,
                "peak_device_bytes": self.peak_device_bytes,
                "peak_process_bytes": self.peak_process_bytes,
                "phases": dict(self.phase_device_peaks),
                "process_phases": dict(self.phase_process_peaks),
            }


def make_probe(index: int | None = None, interval: float = 0.01) -> NvmlProbe:
    """An NvmlProbe on NVML GPU `index` (None = torch's CUDA device 0), or an unavailable one that says why."""
    device, reason = open_cuda_device(0) if index is None else open_device(index)
    return NvmlProbe(device=device, interval=interval, reason=reason)


if __name__ == "__main__":  # manual check: python -m sweeps.probes.nvml
    probe = make_probe()
    with probe:
        time.sleep(0.1)
    print(probe.result())
