"""Host-memory probe: this process's resident set (RSS), sampled by a thread with phase labels, its kernel-kept high
water mark, and torch's pinned host allocator when CUDA is up.

What it reads (Linux): `/proc/self/status` `VmRSS` (resident now) and `VmHWM` (resident peak, kept by the kernel, so
a spike between two samples is still seen overall), and `resource.getrusage(RUSAGE_SELF).ru_maxrss` (the same peak,
in KiB on Linux). Children are not counted (`RUSAGE_CHILDREN` is left out): the run's host state (DeepSpeed's
offloaded partitions, CPU Adam state, pinned buffers, the model while loading) lives in this process; its only
children are short-lived tools such as the compiler of DeepSpeed's `cpu_adam` JIT build, whose memory is not the
run's and would only blur the figure. Pinned bytes come from `torch.cuda.host_memory_stats()` (torch's
CachingHostAllocator, which `Tensor.pin_memory()` and DeepSpeed's CUDA accelerator `pin_memory` go through);
unavailable before CUDA is initialised or on a CPU-only build. Where `/proc` is missing (not Linux) the probe
reports why and never fails the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sweeps.probes.sampling import SamplingThread

STATUS = Path("/proc/self/status")
KIB = 1024


def read_status(path: Path = STATUS) -> dict[str, int]:
    """`VmRSS` and `VmHWM` (bytes) from a /proc status file; missing fields are left out."""
    out: dict[str, int] = {}
    for line in path.read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[name] = int(parts[0]) * (KIB if parts[1:] == ["kB"] else 1)
    return out


def rss_reader(path: Path = STATUS) -> tuple[Callable[[], int] | None, str | None]:
    """(a function returning VmRSS in bytes, None), or (None, reason) where it cannot be read."""
    try:
        if "VmRSS" not in read_status(path):
            return None, f"{path} has no VmRSS line"
    except OSError as exc:
        return None, f"{path} cannot be read ({type(exc).__name__}): host RSS is read from Linux /proc only"
    return (lambda: read_status(path)["VmRSS"]), None


def max_rss_bytes() -> int | None:
    """getrusage(RUSAGE_SELF).ru_maxrss in bytes (KiB on Linux), or None where `resource` is missing."""
    try:
        import resource
    except ImportError:
        return None
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * KIB


def pinned_stats() -> dict:
    """Peak and current bytes of torch's pinned host allocator, or {"available": False, "reason"}."""
    try:
        import torch

        stats_fn = getattr(torch.cuda, "host_memory_stats", None)
        if stats_fn is None:
            return {
                "available": False,
                "reason": f"torch {torch.__version__} has no torch.cuda.host_memory_stats",
            }
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"available": False, "reason": "CUDA is not initialised in this process"}
        stats = stats_fn()
    except Exception as exc:  # a driver or build that cannot answer: the RSS figures still stand
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}".strip()[:300]}
    keep = {k: int(v) for k, v in stats.items() if "bytes" in k and isinstance(v, (int, float))}
    return {"available": True, **keep}


@dataclass
class HostProbe(SamplingThread):
    """Samples this process's RSS every `interval` seconds on a thread; peaks overall and per phase."""

    thread_name = "host-probe"

    reader: Callable[[], int] | None
    source: str = "measured-cpu"
    interval: float = 0.01
    reason: str | None = None
    phase: str = "other"
    baseline_bytes: int | None = None
    peak_rss_bytes: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    samples: int = 0
    hwm: Callable[[], int | None] | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def available(self) -> bool:
        return self.reader is not None

    def sample(self) -> None:
        """Take one reading and fold it into the peaks under the current phase."""
        rss = int(self.reader())
        with self._lock:
            self.samples += 1
            self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
            self.phases[self.phase] = max(self.phases.get(self.phase, 0), rss)

    def read_baseline(self) -> int:
        return int(self.reader())

    def result(self) -> dict:
        """{"available": False, "reason"} or the sampled peaks (bytes) overall and per phase, the kernel's high
        water mark (the process's whole life, loading included) and the pinned allocator's figures."""
        if not self.available:
            return {"available": False, "source": self.source, "reason": self.reason or "no /proc"}
        hwm = self.hwm() if self.hwm is not None else None
        with self._lock:
            return {
                "available": True,
                "source": self.source,
                "interval_s": self.interval,
                "samples": self.samples,
                "baseline_rss_bytes": self.baseline_bytes,
                "peak_rss_bytes": self.peak_rss_bytes,
                "hwm_bytes": hwm,
                "max_rss_bytes": max_rss_bytes(),
                "phases": dict(self.phases),
                "pinned": pinned_stats(),
            }


def _hwm() -> int | None:
    try:
        return read_status().get("VmHWM")
    except OSError:
        return None


def make_probe(device: str, interval: float = 0.01) -> HostProbe:
    """A HostProbe of this process, labelled measured-gpu on CUDA runs and measured-cpu otherwise."""
    reader, reason = rss_reader()
    source = "measured-gpu" if device == "cuda" else "measured-cpu"
    return HostProbe(reader=reader, source=source, interval=interval, reason=reason, hwm=_hwm)


if __name__ == "__main__":  # manual check: python -m sweeps.probes.host
    import time

    probe = make_probe("cpu")
    with probe:
        block = bytearray(b"\x01") * (64 * 2**20)
        time.sleep(0.05)
    print(probe.result(), len(block))
