"""A CUDA memory snapshot, written by hand in torch's format, turned into a stream (sweeps/probes/snapshot_stream.py)."""

from __future__ import annotations

import pytest

from sweeps.probes.snapshot_stream import PhaseMark, convert, count_actions, live_blocks, lost_entries

MIB = 1024**2
SMALL, A, B = 0x10000000, 0x20000000, 0x30000000
A2 = A + 3000320  # the second block of segment A: 3,000,000 rounded up to 512 B


def _e(action: str, addr: int | None, size: int, stream: int = 0, **kw) -> dict:
    e = {"action": action, "size": size, "stream": stream, "time_us": 0, "frames": [], **kw}
    if addr is not None:
        e["addr"] = addr
    return e


# the allocator when recording began: one 2 MiB small-pool segment holding one live 100-byte tensor
START = {
    "segments": [
        {
            "device": 0,
            "address": SMALL,
            "total_size": 2 * MIB,
            "stream": 0,
            "segment_type": "small",
            "allocated_size": 512,
            "active_size": 512,
            "blocks": [
                {"size": 512, "requested_size": 100, "state": "active_allocated", "frames": []},
                {"size": 2 * MIB - 512, "requested_size": 0, "state": "inactive", "frames": []},
            ],
        }
    ],
    "device_traces": [[]],
}
TRACE = [
    _e("segment_alloc", A, 20 * MIB),  # 1
    _e("alloc", A, 3_000_000),  # 2
    _e("alloc", A2, 4_000_000),  # 3   -> "generate" begins after two allocations
    _e("free_requested", A, 3_000_000),  # 4
    _e("free_completed", A, 3_000_000),  # 5
    _e("segment_alloc", B, 50 * MIB, stream=7),  # 6
    _e("alloc", B, 50 * MIB, stream=7),  # 7   -> "train" begins after three allocations and one free
    _e("free_requested", A2, 4_000_000),  # 8
    _e("free_requested", B, 50 * MIB, stream=7),  # 9
    _e("free_completed", B, 50 * MIB, stream=7),  # 10
    _e("free_completed", A2, 4_000_000),  # 11  completed late (another free came between)
    _e("segment_free", B, 50 * MIB, stream=7),  # 12
    _e("free_requested", SMALL, 100),  # 13  the tensor live before recording began
    _e("free_completed", SMALL, 100),  # 14
    _e("oom", None, 80 * MIB, device_free=0),  # 15
    _e("snapshot", 0, 0),  # 16
]
SNAP = {"segments": [], "device_traces": [TRACE]}
MARKS = [PhaseMark(0, 0, "load"), PhaseMark(2, 0, "generate"), PhaseMark(3, 1, "train")]


def test_live_blocks_of_the_start_snapshot():
    # blocks carry no address: the first sits at the segment's start
    assert live_blocks(START) == [(SMALL, 100, 0)]


def test_conversion_frees_at_completion_with_phase_marks():
    c = convert(SNAP, MARKS, start=START)
    assert c.events == [
        ("a", 1, 100, 0),  # live at the start
        ("m", "load"),
        ("a", 2, 3_000_000, 0),
        ("a", 3, 4_000_000, 0),
        ("m", "generate"),
        ("f", 2),  # at free_completed (5)
        ("a", 2, 50 * MIB, 1),  # id 2 reused; the second CUDA stream seen is stream 1
        ("m", "train"),
        ("f", 2),  # 10
        ("f", 3),  # 11
        ("f", 1),  # 14
    ]
    assert c.actions == {
        "segment_alloc": 2,
        "alloc": 3,
        "free_requested": 4,
        "free_completed": 4,
        "segment_free": 1,
        "oom": 1,
        "snapshot": 1,
    }
    # reserved: 2 MiB at the start, +20 MiB (load), +50 MiB (generate), -50 MiB (train)
    assert (c.reserved_start, c.reserved_peak, c.reserved_end) == (2 * MIB, 72 * MIB, 22 * MIB)
    assert c.reserved_peak_phase == "generate"
    assert c.reserved_phases == {"load": 22 * MIB, "generate": 72 * MIB, "train": 72 * MIB}
    # requested bytes live: 100 + 4,000,000 + 50 MiB after the first free
    assert c.requested_peak == 100 + 4_000_000 + 50 * MIB
    assert (c.deferred_frees, c.unmatched_frees, c.reallocs, c.initial_blocks) == (1, 0, 0, 1)
    assert c.summary()["torch_reserved"]["source"].startswith("measured-gpu")


def test_conversion_frees_at_request():
    c = convert(SNAP, MARKS, start=START, free_at="requested")
    assert c.events[5:] == [("f", 2), ("a", 2, 50 * MIB, 1), ("m", "train"), ("f", 3), ("f", 2), ("f", 1)]


def test_min_bytes_drops_small_allocations_and_their_frees():
    c = convert(SNAP, MARKS, start=START, min_bytes=1 * MIB)
    assert [e for e in c.events if e[0] in ("a", "f")] == [
        ("a", 1, 3_000_000, 0),
        ("a", 2, 4_000_000, 0),
        ("f", 1),
        ("a", 1, 50 * MIB, 1),
        ("f", 1),
        ("f", 2),
    ]
    assert c.dropped_allocs == 1
    assert c.requested_peak == 100 + 4_000_000 + 50 * MIB  # the dropped tensor still counts as requested


def test_a_full_ring_buffer_shifts_the_marks_and_counts_unmatched_frees():
    # torch counted 3 allocations and 4 free requests; the ring kept the entries from the fourth on
    trace = TRACE[3:]  # starts with the free of A (its alloc overwritten)
    actions = count_actions({"device_traces": [trace]})
    lost = lost_entries((3, 4), actions)
    assert lost == (2, 0)  # 3 counted - 1 alloc kept; 4 free requests all kept
    c = convert({"device_traces": [trace]}, MARKS, lost=lost)
    assert c.truncated
    assert c.unmatched_frees == 3  # A, A2 and the start's block: their allocations are not in the trace
    # "load" and "generate" fall before the first entry kept; "train" (3 - 2 allocations, 1 free) after entry 7
    assert c.events == [("m", "load"), ("m", "generate"), ("a", 1, 50 * MIB, 0), ("m", "train"), ("f", 1)]


def test_a_reused_address_without_a_free_frees_the_old_id_first():
    trace = [_e("alloc", A, 1000), _e("alloc", A, 2000)]
    c = convert({"device_traces": [trace]})
    assert c.events == [("a", 1, 1000, 0), ("f", 1), ("a", 1, 2000, 0)]
    assert c.reallocs == 1


def test_bad_free_at_is_refused():
    with pytest.raises(ValueError, match="free_at='late': accepted values are completed, requested"):
        convert(SNAP, free_at="late")
