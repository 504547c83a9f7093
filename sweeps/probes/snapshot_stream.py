"""A CUDA memory snapshot (`torch.cuda.memory._snapshot()` with history recorded) turned into the project's
allocation stream (`estimator.hardware.allocator` events), plus torch's own reserved-bytes curve. Pure: dicts in,
events and counts out; nothing here touches a GPU.

What torch writes (`c10/cuda/CUDACachingAllocator.cpp`, `record_trace` calls; field names from
`torch/csrc/cuda/Module.cpp` and `torch/cuda/memory.py`'s `_snapshot` docstring), per entry of
`snapshot["device_traces"][device]`: `action`, `addr`, `size`, `stream`, `time_us`, `frames`:

* `alloc` (`alloc_found_block`): `size` is the *requested* size (`orig_size`, before `round_size`), not the block;
* `free_requested` (`free`): the tensor died; torch's `allocated_bytes` drops here. `size` is the requested size;
* `free_completed` (`free_block`): the block is back in its pool and can serve the next malloc. For a block used
  on other streams (`recordStream`) this comes later, from `process_events`; otherwise right after the request;
* `segment_alloc` / `segment_free` (`alloc_block` / `release_block`): a cudaMalloc / cudaFree of a whole segment;
  `segment_map` / `segment_unmap` (`map_block` / `unmap_block`, expandable segments): pages mapped or unmapped.
  These four are what `reserved_bytes` (`max_memory_reserved`, nvidia-smi's share) moves with;
* `oom` (the failed malloc; `size` requested, `device_free`), `snapshot` (a snapshot was taken): counted only.

Choices made here:

* a stream event gets the requested size, as the traced streams and `sweeps/report/allocator_check.py`'s replay
  do: the simulator rounds it itself (`round_size`), exactly as the real allocator did;
* a free enters the stream at `free_completed` (`free_at="completed"`, the default): that is when the block can
  be reused, which is what the simulator's free means. `free_at="requested"` frees at the request instead (what
  `allocated_bytes` follows). The two differ only for blocks freed late; `deferred_frees` counts those;
* events are keyed by address; ids are the smallest free positive integers (an address freed and reused gets the
  same small id back, which keeps the gzip file small); CUDA streams are numbered 0, 1, ... by first appearance;
* phase labels come from the allocator's own counters read at each phase change (`PhaseMark`: allocations and
  free requests since recording began), so no snapshot is taken mid-run. A mark goes before the first event of
  the new phase, after the `free_completed` entries that finish the old phase's last frees;
* blocks live when recording began come from the snapshot taken then (`start`): one alloc each, before the
  first mark, as the traced streams start with the registered parameters. The reserved curve starts at that
  snapshot's segments.

When the ring buffer (`max_entries`) overflowed, the oldest entries are gone: `lost` (allocations, frees) says how
many, the marks are shifted by it, frees of addresses never seen are counted as `unmatched_frees`, and
`truncated` is set.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from estimator.hardware.allocator import ALLOC, FREE, MARK

SEGMENT_GROW = ("segment_alloc", "segment_map")
SEGMENT_SHRINK = ("segment_free", "segment_unmap")
FREE_AT = ("completed", "requested")
LIVE_STATES = ("active_allocated", "active_pending_free", "active_awaiting_free")


@dataclass(frozen=True)
class PhaseMark:
    """A phase change, placed by torch's cumulative counters since recording began: `allocs`
    (`allocation.all.allocated`) and `frees` (`allocation.all.freed`, one per `free_requested`)."""

    allocs: int
    frees: int
    label: str


@dataclass
class Converted:
    """A converted snapshot: the stream, what torch recorded, and torch's own reserved curve (bytes)."""

    events: list[tuple]
    actions: dict[str, int]
    reserved_start: int
    reserved_end: int
    reserved_peak: int
    reserved_peak_phase: str
    reserved_phases: dict[str, int]
    requested_peak: int
    unmatched_frees: int = 0
    reallocs: int = 0
    deferred_frees: int = 0
    dropped_allocs: int = 0
    initial_blocks: int = 0
    streams: dict[int, int] = field(default_factory=dict)
    truncated: bool = False

    def summary(self) -> dict:
        """JSON-ready, every byte count labelled by where it came from (the trace is `measured-gpu`)."""
        return {
            "events": len(self.events),
            "actions": dict(self.actions),
            "torch_reserved": {
                "source": "measured-gpu (segment events of torch.cuda.memory._snapshot)",
                "start_bytes": self.reserved_start,
                "end_bytes": self.reserved_end,
                "peak_bytes": self.reserved_peak,
                "peak_phase": self.reserved_peak_phase,
                "phases": dict(self.reserved_phases),
            },
            "requested_peak_bytes": self.requested_peak,
            "unmatched_frees": self.unmatched_frees,
            "reallocs": self.reallocs,
            "deferred_frees": self.deferred_frees,
            "dropped_allocs": self.dropped_allocs,
            "initial_blocks": self.initial_blocks,
            "streams": len(self.streams),
            "truncated": self.truncated,
        }


class _Ids:
    """Smallest free positive integer ids."""

    def __init__(self) -> None:
        self._free: list[int] = []
        self._next = 1

    def take(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        self._next += 1
        return self._next - 1

    def give(self, i: int) -> None:
        heapq.heappush(self._free, i)


def live_blocks(snapshot: dict | None, device: int = 0) -> list[tuple[int, int, int]]:
    """(address, requested size, stream) of every block allocated in `snapshot`'s segments of `device`,
    by address. A block without `address` sits where the previous one ended (`_memory_viz.py` does the same)."""
    out = []
    for seg in (snapshot or {}).get("segments", ()):
        if seg.get("device", device) != device:
            continue
        addr = seg["address"]
        for b in seg.get("blocks", ()):
            addr = b.get("address", addr)
            if b.get("state") in LIVE_STATES:
                out.append((addr, int(b.get("requested_size") or b["size"]), seg.get("stream", 0)))
            addr += b["size"]
    return sorted(out)


def reserved_bytes(snapshot: dict | None, device: int = 0) -> int:
    """Sum of `total_size` over `snapshot`'s segments of `device` (torch's `memory_reserved`)."""
    return sum(
        int(s["total_size"])
        for s in (snapshot or {}).get("segments", ())
        if s.get("device", device) == device
    )


class _Replay:
    """The stream being built from torch's trace entries: live blocks by address, ids reused as the simulator
    expects, the requested bytes, and torch's reserved curve walked from its segment events."""

    def __init__(self, out: Converted, min_bytes: int) -> None:
        self.out = out
        self.min_bytes = min_bytes
        self.ids = _Ids()
        self.live: dict[int, int] = {}  # address -> id
        self.sizes: dict[int, int] = {}  # address -> requested size (live, kept or dropped)
        self.dropped: set[int] = set()
        self.requested = 0
        self.label = ""

    def stream_of(self, handle) -> int:
        return self.out.streams.setdefault(int(handle or 0), len(self.out.streams))

    def alloc(self, addr: int, size: int, stream) -> None:
        s = self.stream_of(stream)
        if addr in self.sizes:  # never freed (its free fell outside the trace): free it first
            self.out.reallocs += 1
            self.free(addr)
        self.sizes[addr] = size
        self.requested += size
        self.out.requested_peak = max(self.out.requested_peak, self.requested)
        if size < self.min_bytes:
            self.dropped.add(addr)
            self.out.dropped_allocs += 1
            return
        i = self.ids.take()
        self.live[addr] = i
        self.out.events.append((ALLOC, i, size, s))

    def free(self, addr: int) -> None:
        if addr not in self.sizes:
            self.out.unmatched_frees += 1
            return
        self.requested -= self.sizes.pop(addr)
        if addr in self.dropped:
            self.dropped.discard(addr)
            return
        i = self.live.pop(addr)
        self.out.events.append((FREE, i))
        self.ids.give(i)

    def enter(self, mark: PhaseMark) -> None:
        """A phase begins: its mark in the stream, and the reserved bytes it starts with."""
        self.label = mark.label
        self.out.events.append((MARK, mark.label))
        phases = self.out.reserved_phases
        phases[mark.label] = max(phases.get(mark.label, 0), self.out.reserved_end)

    def segment(self, delta: int) -> None:
        """torch mapped (+) or released (-) device memory: the reserved curve and its peaks."""
        out = self.out
        out.reserved_end += delta
        if out.reserved_end > out.reserved_peak:
            out.reserved_peak, out.reserved_peak_phase = out.reserved_end, self.label
        if self.label:
            out.reserved_phases[self.label] = max(out.reserved_phases.get(self.label, 0), out.reserved_end)


def convert(
    snapshot: dict,
    marks: Sequence[PhaseMark] = (),
    start: dict | None = None,
    device: int = 0,
    free_at: str = "completed",
    min_bytes: int = 0,
    lost: tuple[int, int] = (0, 0),
) -> Converted:
    """`snapshot`'s history of `device` as stream events with phase marks, and torch's reserved curve.

    `start`: the snapshot taken when recording began (its live blocks open the stream; its segments are the
    reserved bytes then); None for an empty allocator. `min_bytes` > 0 drops allocations smaller than that (and
    their frees): a smaller file that no longer shows the small pool. `lost`: (allocations, frees) the ring
    buffer dropped before the first entry kept. Raises ValueError for a `free_at` not in FREE_AT.
    """
    if free_at not in FREE_AT:
        raise ValueError(f"free_at={free_at!r}: accepted values are {', '.join(FREE_AT)}")
    traces = snapshot.get("device_traces") or []
    trace: Iterable[dict] = traces[device] if device < len(traces) else []
    free_action = "free_" + free_at
    reserved = reserved_bytes(start, device)
    out = Converted([], {}, reserved, reserved, reserved, "", {}, 0)
    replay = _Replay(out, min_bytes)
    for addr, size, stream in live_blocks(start, device):
        replay.alloc(addr, size, stream)
        out.initial_blocks += 1
    # a mark is placed once torch's counters reach it: its counts are of the whole run, the trace's of what it kept
    pending = sorted(marks, key=lambda m: (m.allocs, m.frees))
    pending = [PhaseMark(m.allocs - lost[0], m.frees - lost[1], m.label) for m in pending]
    n_alloc = n_free = 0
    prev: dict | None = None
    for e in trace:
        action = e.get("action", "?")
        out.actions[action] = out.actions.get(action, 0) + 1
        if action != "free_completed":
            while pending and pending[0].allocs <= n_alloc and pending[0].frees <= n_free:
                replay.enter(pending.pop(0))
        if action == "alloc":
            n_alloc += 1
            replay.alloc(int(e["addr"]), int(e["size"]), e.get("stream"))
        elif action == "free_requested":
            n_free += 1
        elif action == "free_completed" and not (
            prev is not None and prev.get("action") == "free_requested" and prev.get("addr") == e.get("addr")
        ):
            out.deferred_frees += 1
        if action == free_action:
            replay.free(int(e["addr"]))
        elif action in SEGMENT_GROW or action in SEGMENT_SHRINK:
            replay.segment(int(e["size"]) if action in SEGMENT_GROW else -int(e["size"]))
        prev = e
    for m in pending:
        replay.enter(m)
    out.truncated = lost != (0, 0)
    return out


def lost_entries(totals: tuple[int, int], actions: dict[str, int]) -> tuple[int, int]:
    """(allocations, frees) counted by torch since recording began but absent from the trace: what a full ring
    buffer overwrote. `totals` are the counter deltas at stop; `actions` the trace's counts by action."""
    return (
        max(0, totals[0] - actions.get("alloc", 0)),
        max(0, totals[1] - actions.get("free_requested", 0)),
    )


def count_actions(snapshot: dict, device: int = 0) -> dict[str, int]:
    """Trace entries of `device` by action."""
    out: dict[str, int] = {}
    traces = snapshot.get("device_traces") or []
    for e in traces[device] if device < len(traces) else []:
        out[e.get("action", "?")] = out.get(e.get("action", "?"), 0) + 1
    return out
