"""The host probe: /proc status parsing, RSS rising by an allocation it is shown, per-phase peaks from a scripted
reader, and an unreadable /proc reported with its reason."""

import sys

import pytest

from sweeps.probes import host

STATUS = """Name:\tpython
VmPeak:\t 9000 kB
VmHWM:\t   2048 kB
VmRSS:\t   1536 kB
Threads:\t4
"""


def test_status_lines_are_read_in_bytes(tmp_path):
    path = tmp_path / "status"
    path.write_text(STATUS)
    assert host.read_status(path) == {"VmHWM": 2048 * 1024, "VmRSS": 1536 * 1024}


def test_without_proc_the_probe_says_why_and_measures_nothing(tmp_path):
    reader, reason = host.rss_reader(tmp_path / "missing")
    assert reader is None and "cannot be read" in reason
    probe = host.HostProbe(reader=None, reason=reason)
    probe.start()
    probe.set_phase("train")
    probe.stop()
    assert probe.result() == {"available": False, "source": "measured-cpu", "reason": reason}


def test_per_phase_peaks_from_a_scripted_reader():
    values = iter([100, 150, 120, 400, 90, 300, 50])
    probe = host.HostProbe(reader=lambda: next(values), source="measured-gpu")
    probe.baseline_bytes = probe.reader()  # 100: what start() reads before the thread samples
    probe.sample()  # 150 under "other"
    probe.phase = "generate"
    probe.sample()  # 120
    probe.sample()  # 400
    probe.phase = "train"
    probe.sample()  # 90
    probe.sample()  # 300
    probe.sample()  # 50
    out = probe.result()
    assert out["phases"] == {"other": 150, "generate": 400, "train": 300}
    assert (out["peak_rss_bytes"], out["baseline_rss_bytes"], out["samples"]) == (400, 100, 6)
    assert out["source"] == "measured-gpu"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="VmRSS is read from Linux /proc")
def test_rss_rises_by_at_least_an_allocation_of_known_size():
    size = 64 * 2**20
    probe = host.make_probe("cpu", interval=0.005)
    probe.start()
    probe.set_phase("train")
    block = bytearray(b"\x01") * size  # every page written, so resident
    probe.set_phase("other")
    probe.stop()
    out = probe.result()
    assert out["available"] and out["source"] == "measured-cpu"
    assert out["phases"]["train"] - out["baseline_rss_bytes"] >= size
    assert out["hwm_bytes"] >= out["baseline_rss_bytes"] + size
    # getrusage's peak comes from the kernel's batched per-thread RSS counters: it may trail by some pages
    assert out["max_rss_bytes"] >= out["baseline_rss_bytes"] + size - 2**20
    pinned = out["pinned"]
    assert pinned["available"] or pinned["reason"]  # without CUDA: a reason, never a crash
    del block
