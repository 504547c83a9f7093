"""A real allocation stream (the `history` probe's, measured on a GPU) against the traced stream of the same
config (FakeTensorMode on CPU): what the simulator gets wrong on the real stream, how the two streams differ, and the
reserve each implies. Pure functions over `estimator.hardware.allocator` events; the numbers say where they came
from: the real stream's own counts are `measured-gpu`, the traced stream's `traced`, anything replayed through
`estimator.hardware.allocator.simulate` is `simulated`.

Phase labels differ in their idle names: the runner's phase hooks say `other`, the tracer `(none)` and
`(between steps)`; all three read as `other` here. The real stream may open with `load` (the model loading, which
the traced stream does not hold: it registers the parameters instead).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from estimator.hardware.allocator import (
    ALLOC,
    FREE,
    MARK,
    AllocatorSettings,
    SimResult,
    min_device_limit,
    round_size,
    simulate,
)

MIB = 1024**2
IDLE_LABELS = ("(none)", "(between steps)", "other", "")
STEP_MARK = "generate"
# by the request rounded as the allocator rounds it: the small pool (<= 1 MiB), requests that share 20 MiB
# segments (<= 10 MiB), and the rest (a segment of their own)
SIZE_CLASSES = (("<=1 MiB", 1 * MIB), ("1-10 MiB", 10 * MIB), (">10 MiB", None))
_DEFAULT = AllocatorSettings()


def phase_name(label: str) -> str:
    """A stream's phase label with the idle ones (`(none)`, `(between steps)`, `other`) read as `other`."""
    return "other" if label in IDLE_LABELS else label


def steps_in(events: Iterable[tuple]) -> int:
    """Training steps in a stream: its `generate` marks."""
    return sum(1 for e in events if e[0] == MARK and e[1] == STEP_MARK)


def first_steps(events: list[tuple], n: int) -> list[tuple]:
    """The stream up to the start of step n + 1 (its (n+1)-th `generate` mark), so a 3-step traced stream
    compares with a 2-step real one."""
    seen = 0
    for i, e in enumerate(events):
        if e[0] == MARK and e[1] == STEP_MARK:
            seen += 1
            if seen > n:
                return events[:i]
    return events


def size_class(size: int) -> str:
    """SIZE_CLASSES' name for a request of `size` bytes (rounded as the allocator does)."""
    rounded = round_size(size, _DEFAULT)
    for name, top in SIZE_CLASSES:
        if top is None or rounded <= top:
            return name
    raise AssertionError("unreachable")


def alloc_profile(events: Iterable[tuple]) -> dict[str, dict[str, list[int]]]:
    """{phase: {size class: [count, bytes requested]}}, plus phase `all`."""
    out: dict[str, dict[str, list[int]]] = {}
    phase = "other"
    for e in events:
        if e[0] == MARK:
            phase = phase_name(e[1])
        elif e[0] == ALLOC:
            cls = size_class(e[2])
            for p in (phase, "all"):
                cell = out.setdefault(p, {}).setdefault(cls, [0, 0])
                cell[0] += 1
                cell[1] += e[2]
    return out


def sizes(events: Iterable[tuple]) -> dict[int, tuple[int, str]]:
    """{rounded request size: (allocations of it, the phase it first appears in)}."""
    counts: Counter[int] = Counter()
    first: dict[int, str] = {}
    phase = "other"
    for e in events:
        if e[0] == MARK:
            phase = phase_name(e[1])
        elif e[0] == ALLOC:
            s = round_size(e[2], _DEFAULT)
            counts[s] += 1
            first.setdefault(s, phase)
    return {s: (n, first[s]) for s, n in counts.items()}


def unmatched_sizes(real: list[tuple], traced: list[tuple], top: int = 15) -> list[dict]:
    """The largest request sizes (rounded to the allocator's 512 B) of the real stream that the traced stream never
    requests, largest first: what the trace does not see (bitsandbytes' dequantize buffers, per-token cache growth,
    library workspaces). Each: size, count, bytes (size x count), the phase it first appears in."""
    theirs = sizes(traced)
    rows = [
        {"size": s, "count": n, "bytes": s * n, "first_phase": ph}
        for s, (n, ph) in sizes(real).items()
        if s not in theirs
    ]
    return sorted(rows, key=lambda r: -r["size"])[:top]


def live_at_peak(events: Iterable[tuple]) -> tuple[int, str, Counter[int]]:
    """At the stream's first highest allocated instant: the bytes requested and live, the phase, and how many live
    blocks of each requested size (two passes: find the instant, then replay to it)."""
    events = list(events)
    live: dict[int, int] = {}
    total = peak = at = 0
    for i, e in enumerate(events):
        if e[0] == ALLOC:
            live[e[1]] = e[2]
            total += e[2]
            if total > peak:
                peak, at = total, i
        elif e[0] == FREE and e[1] in live:
            total -= live.pop(e[1])
    live.clear()
    phase = "other"
    for e in events[: at + 1]:
        if e[0] == MARK:
            phase = phase_name(e[1])
        elif e[0] == ALLOC:
            live[e[1]] = e[2]
        elif e[0] == FREE:
            live.pop(e[1], None)
    return peak, phase, Counter(live.values())


def peak_difference(real: list[tuple], traced: list[tuple], top: int = 12) -> dict:
    """What is live at each stream's allocated peak, set side by side: each stream's peak and phase, and the
    request sizes held a different number of times (real minus traced), the largest byte differences first. Where
    the two peaks fall at the same instant of the step, the rows are what one stream holds that the other does not
    (a trace artifact, a GPU-only buffer)."""
    (rp, rph, rc), (tp, tph, tc) = live_at_peak(real), live_at_peak(traced)
    rows = [
        {"size": s, "real": rc[s], "traced": tc[s], "bytes": (rc[s] - tc[s]) * s}
        for s in set(rc) | set(tc)
        if rc[s] != tc[s]
    ]
    rows.sort(key=lambda r: -abs(r["bytes"]))
    return {
        "real": [rp, rph],
        "traced": [tp, tph],
        "sizes": rows[:top],
        "others_bytes": sum(r["bytes"] for r in rows[top:]),
    }


def normalised_phase_peaks(sim: SimResult) -> dict[str, list[int]]:
    """The replay's per-phase [peak reserved, peak allocated] with idle labels merged into `other`."""
    out: dict[str, list[int]] = {}
    for label, (r, a) in sim.phase_peaks.items():
        cell = out.setdefault(phase_name(label), [0, 0])
        cell[0], cell[1] = max(cell[0], r), max(cell[1], a)
    return out


def reserve(events: list[tuple], settings: AllocatorSettings | None = None, need: bool = True) -> dict:
    """What the stream implies for the caching allocator (simulated): peak reserved and allocated, the reserve
    above the tensors (reserved - allocated, the two peaks), per-phase peaks, and with `need` the smallest
    device limit the stream runs in (`min_device_limit`) and its margin over peak allocated."""
    sim = simulate(events, settings)
    out = {
        "source": "simulated",
        "peak_reserved": sim.peak_reserved,
        "peak_allocated": sim.peak_allocated,
        "reserve": sim.peak_reserved - sim.peak_allocated,
        "peak_label": phase_name(sim.peak_label),
        "phases": normalised_phase_peaks(sim),
        "events": sim.events,
    }
    if need:
        limit, _ = min_device_limit(events, settings)
        out["min_device_limit"] = limit
        out["need"] = limit - sim.peak_allocated
    return out


def fidelity(simulated_peak: int, torch_reserved: dict) -> dict:
    """The simulator's error on the real stream: its peak reserved against torch's own (the segment events of the
    same run, `measured-gpu`), as bytes and as a fraction of torch's; also over what was reserved when the
    recording began (the simulator starts from an empty allocator)."""
    peak, start = torch_reserved["peak_bytes"], torch_reserved.get("start_bytes", 0)
    return {
        "simulated_peak_reserved": simulated_peak,
        "measured_peak_reserved": peak,
        "measured_start_reserved": start,
        "error_bytes": simulated_peak - peak,
        "error_fraction": (simulated_peak - peak) / peak if peak else None,
        "error_over_start_bytes": simulated_peak - (peak - start),
    }


def compare(real: list[tuple], traced: list[tuple], torch_reserved: dict, need: bool = True) -> dict:
    """Everything the report prints for one pair: the traced stream cut to the real one's steps, (a) fidelity,
    (b) the streams' difference (peaks by phase, allocations by size class and phase, sizes only the real stream
    has, what each holds at its allocated peak), (c) the reserve each implies."""
    n = steps_in(real)
    cut = first_steps(traced, n) if n else traced
    r, t = reserve(real, need=need), reserve(cut, need=need)
    return {
        "steps": n,
        "fidelity": fidelity(r["peak_reserved"], torch_reserved),
        "real": r,
        "traced": t,
        "profile": {"real": alloc_profile(real), "traced": alloc_profile(cut)},
        "unmatched": unmatched_sizes(real, cut),
        "at_peak": peak_difference(real, cut),
    }


def by_cuda_stream(events: Iterable[tuple]) -> dict[int, dict[str, int]]:
    """Per CUDA stream (numbered by first appearance): allocations, bytes requested, and the peak of its own live
    bytes. torch's caching allocator keeps each stream's blocks apart (a cached block serves only requests on the
    stream it was made for), so a side stream's blocks are reserved beside the default stream's."""
    out: dict[int, dict[str, int]] = {}
    live: dict[int, tuple[int, int]] = {}  # id -> (size, stream)
    for e in events:
        if e[0] == ALLOC:
            s = e[3] if len(e) > 3 else 0
            cell = out.setdefault(s, {"allocs": 0, "bytes": 0, "live": 0, "peak_live": 0})
            cell["allocs"] += 1
            cell["bytes"] += e[2]
            cell["live"] += e[2]
            cell["peak_live"] = max(cell["peak_live"], cell["live"])
            live[e[1]] = (e[2], s)
        elif e[0] == FREE and e[1] in live:
            size, s = live.pop(e[1])
            out[s]["live"] -= size
    return {s: {k: v for k, v in c.items() if k != "live"} for s, c in sorted(out.items())}


def alone(real: list[tuple], torch_reserved: dict, need: bool = True, top: int = 12) -> dict:
    """A real stream with no traced counterpart (DeepSpeed, which the CPU tracer cannot run), replayed alone:
    (a) fidelity, (c) the reserve and need it implies, allocations by size class and phase and by CUDA stream, and
    the largest request sizes live at its allocated peak (size, count, bytes; the most bytes first)."""
    r = reserve(real, need=need)
    peak, phase, held = live_at_peak(real)
    at_peak = sorted(
        ({"size": s, "count": n, "bytes": s * n} for s, n in held.items()), key=lambda x: -x["bytes"]
    )
    return {
        "steps": steps_in(real),
        "fidelity": fidelity(r["peak_reserved"], torch_reserved),
        "real": r,
        "profile": alloc_profile(real),
        "streams": by_cuda_stream(real),
        "at_peak": {
            "requested": peak,
            "phase": phase,
            "sizes": at_peak[:top],
            "others_bytes": sum(x["bytes"] for x in at_peak[top:]),
        },
    }
