"""Why a stream needs more than its allocated peak: what the caching allocator cannot give back at the limit.

Under a device limit torch's allocator frees every cached segment that holds no live block and retries before it
fails (`estimator.hardware.allocator`, `malloc`). What it can never give back is the free space inside a segment
that some live block still occupies: a segment carved for one size (a prefill's MLP output) and then holding a
smaller long-lived block (a layer's KV cache, a training block) strands the rest. This replays a stream under a
limit that fails within one resolution step below its smallest passing one, stops at the request that fails, and
says which segments strand how much, grouped by the phase and size each segment was made for and the phase and
size of the block that pins it (simulated, on a traced or a real stream).

    python -m sweeps.report.stranding STREAM.txt.gz [...]   # a stream of `estimator.hardware.allocator` events

It reads the streams `sweeps.trace.streams`, `make gpu-streams` and the min-card traces write; it explains a need,
it does not change one.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from estimator.hardware.allocator import (
    ALLOC,
    EMPTY_CACHE,
    FREE,
    MARK,
    MIB,
    AllocatorSettings,
    CachingAllocator,
    load_stream,
    min_device_limit,
    simulate,
)
from sweeps.oneline import OneLineParser, shown

PROG = "python -m sweeps.report.stranding"
RESOLUTION = 64 * MIB  # the bisection step of `sweeps.trace.streams.min_limits`


@dataclass(frozen=True)
class Pinned:
    """Segments alike: made in `segment_phase` at `segment_bytes`, each held by live blocks of which the largest
    was made in `block_phase` at `block_bytes`; `count` of them, stranding `stranded_bytes` in all."""

    segment_phase: str
    segment_bytes: int
    block_phase: str
    block_bytes: int
    count: int
    stranded_bytes: int


@dataclass(frozen=True)
class Stranding:
    """A stream under `limit_bytes`, a limit that fails at most one resolution step below one that passes
    (`passing_bytes`, at most `need_bytes`, the smallest passing limit `min_device_limit` finds): the request that
    fails, the allocator's state just before it, and the free bytes held inside segments with a live block
    (`stranded_bytes`, by group in `pinned`, largest first)."""

    need_bytes: int
    passing_bytes: int
    limit_bytes: int
    phase: str
    request_bytes: int
    reserved_bytes: int
    allocated_bytes: int
    stranded_bytes: int
    pinned: tuple[Pinned, ...]


def _segment_head(block):
    """The first block of `block`'s segment (its address is the segment's start)."""
    while block.prev is not None:
        block = block.prev
    return block


def _segment_size(head) -> int:
    size = 0
    while head is not None:
        size, head = size + head.size, head.next
    return size


def _bracket(events: list, s: AllocatorSettings, fails: int, passes: int, resolution: int) -> tuple[int, int]:
    """A failing and a passing limit at most `resolution` apart, `passes` or below: bisection that keeps a failing
    lower end. The allocator's retries make passing not monotonic in the limit, so a limit below the smallest
    passing one `min_device_limit` finds may pass, and one just below it may too."""
    while passes - fails > resolution:
        mid = (fails + passes) // 2
        if simulate(events, replace(s, device_limit=mid)).oom:
            fails = mid
        else:
            passes = mid
    return fails, passes


def stranding(
    events: list, settings: AllocatorSettings | None = None, resolution: int = RESOLUTION
) -> Stranding | None:
    """The stranding of `events` under the largest failing limit found within `resolution` below its smallest
    passing one; None for a stream that allocates nothing."""
    s = settings or AllocatorSettings()
    need, passed = min_device_limit(events, s, resolution)
    limit, passing = _bracket(events, s, passed.peak_allocated - 1, need, resolution)
    a = CachingAllocator(replace(s, device_limit=limit))
    made: dict[int, tuple[str, int]] = {}  # block key -> (phase, bytes asked)
    segment_phase: dict[int, str] = {}  # segment start -> phase of the request that made it
    phase = ""
    for ev in events:
        kind = ev[0]
        if kind == ALLOC:
            if not a.malloc(ev[1], ev[2], ev[3] if len(ev) > 3 else 0):
                return _state(a, need, passing, limit, phase, ev[2], made, segment_phase)
            made[ev[1]] = (phase, ev[2])
            segment_phase.setdefault(_segment_head(a.live[ev[1]]).addr, phase)
        elif kind == FREE:
            a.free(ev[1])
            made.pop(ev[1], None)
        elif kind == EMPTY_CACHE:
            a.empty_cache()
        elif kind == MARK:
            phase = ev[1]
    return None


def _state(
    a: CachingAllocator,
    need: int,
    passing: int,
    limit: int,
    phase: str,
    request: int,
    made: dict[int, tuple[str, int]],
    segment_phase: dict[int, str],
) -> Stranding:
    segments: dict[int, tuple] = {}  # segment start -> (its first block, its live blocks' keys)
    for key, block in a.live.items():
        head = _segment_head(block)
        segments.setdefault(head.addr, (head, []))[1].append(key)
    groups: dict[tuple[str, int, str, int], list[int]] = defaultdict(lambda: [0, 0])
    for start, (head, keys) in segments.items():
        size, live = _segment_size(head), sum(a.live[k].size for k in keys)
        if size == live:
            continue
        block_phase, block_bytes = made[max(keys, key=lambda k: a.live[k].size)]
        g = groups[(segment_phase.get(start, "?"), size, block_phase, block_bytes)]
        g[0] += 1
        g[1] += size - live
    pinned = tuple(
        sorted(
            (Pinned(sp, sb, bp, bb, n, st) for (sp, sb, bp, bb), (n, st) in groups.items()),
            key=lambda p: -p.stranded_bytes,
        )
    )
    return Stranding(
        need,
        passing,
        limit,
        phase,
        request,
        a.reserved,
        a.allocated,
        sum(p.stranded_bytes for p in pinned),
        pinned,
    )


def _mib(b: int) -> str:
    return f"{b / MIB:,.1f} MiB"


def describe(p: Pinned) -> str:
    """One group as the reports print it: `count x segment size (phase made in) held by block size (phase)`."""
    return (
        f"{p.count} x {p.segment_bytes / MIB:,.0f} MiB ({p.segment_phase or '(none)'}) held by "
        f"{p.block_bytes / MIB:,.1f} MiB ({p.block_phase or '(none)'})"
    )


def lines(s: Stranding | None, top: int = 8, source: str = "traced, simulated") -> list[str]:
    """What `stranding` found, as printed lines; `source` says where the stream came from."""
    if s is None:
        return ["nothing to explain: the stream allocates nothing"]
    out = [
        f"need {_mib(s.need_bytes)}, passes at {_mib(s.passing_bytes)} ({source})",
        f"at {_mib(s.limit_bytes)}: a request of {_mib(s.request_bytes)} in {s.phase or '(none)'} fails with "
        f"{_mib(s.reserved_bytes)} reserved, {_mib(s.allocated_bytes)} allocated",
        f"{_mib(s.stranded_bytes)} free inside segments a live block holds:",
    ]
    out += [f"  {describe(p)}: {_mib(p.stranded_bytes)} stranded" for p in s.pinned[:top]]
    if len(s.pinned) > top:
        rest = sum(p.stranded_bytes for p in s.pinned[top:])
        out.append(f"  {len(s.pinned) - top} more groups: {_mib(rest)} stranded")
    return out


def main(argv: list[str] | None = None) -> int:
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    p.add_argument("streams", nargs="*", help="event streams (.txt.gz) to explain")
    p.add_argument("--top", type=int, default=8, help="groups of segments to print per stream (default 8)")
    args = p.parse_args(argv)
    if not args.streams:
        p.error("name at least one stream (accepted: .txt.gz files of allocator events)")
    status = 0
    for path in args.streams:
        try:
            found = stranding(load_stream(Path(path)))
        except (OSError, ValueError, EOFError, IndexError) as e:
            print(
                f"{PROG}: {shown(path)}: not a readable event stream ({shown(str(e), 60)}); accepted: a gzip "
                "text file of alloc/free/mark events as estimator.hardware.allocator.dump_stream writes",
                file=sys.stderr,
            )
            status = 2
            continue
        print(f"{path}:")
        # a real stream (`probe=history`) is named <key>.gpu.txt.gz; the others are traced
        real = Path(path).name.endswith(".gpu.txt.gz")
        for line in lines(found, args.top, "measured-gpu stream, simulated" if real else "traced, simulated"):
            print(line)
    return status


if __name__ == "__main__":
    sys.exit(main())
