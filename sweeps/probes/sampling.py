"""A probe that samples on a thread: start, stop and phase labels shared by the NVML and host-memory probes.

A subclass is a dataclass with the fields `interval`, `phase`, `baseline_bytes`, `_stop` (threading.Event),
`_thread` and `_lock`, and defines `available`, `sample()` (one reading folded into its peaks under `phase`) and
`read_baseline()` (the reading before the run starts). One sample is taken at each phase boundary and at stop,
so a phase shorter than the interval is still seen.
"""

from __future__ import annotations

import threading
from typing import TypeVar

P = TypeVar("P", bound="SamplingThread")


class SamplingThread:
    """Start / stop / set_phase for a probe sampling every `interval` seconds on a daemon thread."""

    thread_name = "probe"

    def set_phase(self, name: str) -> None:
        """Label later samples with `name`; one sample at the boundary, so a short phase is seen."""
        if self.available and self._thread is not None:
            self.sample()
        with self._lock:
            self.phase = name

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self: P) -> P:
        if self.available:
            self.baseline_bytes = self.read_baseline()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            self.sample()
            self._thread = None

    def __enter__(self: P) -> P:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
