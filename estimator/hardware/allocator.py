"""A model of PyTorch's CUDA caching allocator: replays alloc/free events, returns what the card must reserve.

Pure Python, stdlib only. The rules are those of `DeviceCachingAllocator` in `c10/cuda/CUDACachingAllocator.cpp`
(torch 2.13.0, the version the project pins; permalink base `CPP` below, each rule names its function there)
and the constants of `c10/core/AllocatorConfig.h` (shipped in the torch 2.13 wheel under `torch/include`):

* sizes are rounded up to 512 B, or to a power-of-two division with `roundup_power2_divisions` (`round_size`);
* requests <= 1 MiB go to the small pool, larger ones to the large pool (`get_pool`);
* a new segment is 2 MiB for the small pool, 20 MiB (`large_segment_size`) for large requests under 10 MiB,
  else the request rounded up to 2 MiB (`get_allocation_size`);
* a cached free block is chosen best-fit (smallest size, then lowest address) among those of the same stream
  and pool (`get_free_block`, `BlockComparatorSize`); with `max_split_size` set, an oversize cached block never
  serves a small request, and serves an oversize one only if it is less than `max_non_split_rounding` larger;
* the chosen block is split when the remainder is >= 512 B (small pool, or expandable segments) or > 1 MiB
  (large pool, and only for requests under `max_split_size`) (`should_split`);
* a freed block merges with free neighbours of its segment (`free_block`, `try_merge_blocks`);
* when a new segment would exceed the device limit: free cached oversize blocks (`release_available_cached_blocks`),
  retry; free every cached unsplit block (`release_cached_blocks`), retry; then out of memory (`malloc`);
* `empty_cache()` frees every cached unsplit block (`emptyCache` -> `release_cached_blocks`);
* `expandable_segments`: one segment per stream and pool that grows by mapping pages of 2 MiB (small pool) or
  20 MiB (large pool) at the lowest address with room (`find_expandable_block`, `map_block`,
  `try_allocate_expandable_block`); freeing cached memory unmaps the whole free pages (`unmap_block`,
  `release_blocks`).

Not modelled (absent from a single-process GRPO step): CUDA-graph private pools, cross-stream `recordStream`
events, `garbage_collection_threshold`, free-memory callbacks, IPC. Where the real allocator fails a cudaMalloc
because *other* memory (CUDA context, NCCL, cuBLAS workspaces) filled the card, the model sees that only through
`device_limit`, the bytes left to the allocator.

The source was read at pytorch/pytorch 001074d2 (stored copy) and checked against 2.13's headers: 2.13 adds the
configurable `large_segment_size` (default 20 MiB) and `max_non_split_rounding` (default 20 MiB, the constant
`kLargeBuffer` in older code), both parameters of `AllocatorSettings` here.
"""

from __future__ import annotations

import bisect
import gzip
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

CPP = "https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp"
CONFIG_H = "https://github.com/pytorch/pytorch/blob/v2.13.0/c10/core/AllocatorConfig.h"

MIB = 1024**2
K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB  # kSmallSize: largest "small" allocation
K_SMALL_BUFFER = 2 * MIB  # kSmallBuffer: small allocations are packed in 2 MiB segments
K_MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: allocations between 1 and 10 MiB may use a 20 MiB segment
K_ROUND_LARGE = 2 * MIB  # kRoundLarge: larger allocations are rounded up to 2 MiB
K_LARGE_BUFFER = 20 * MIB  # kLargeBuffer / large_segment_size default
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB, one division count per power of two
UNLIMITED = 1 << 62  # std::numeric_limits<size_t>::max() stand-in
VA_SPAN = 1 << 44  # address space between two simulated segments (never touched by a real size)

# event kinds in a stream: alloc, free, empty_cache, phase mark, and a named point the replay ignores (where a
# setting may add an event, e.g. Trainer.training_step's empty_cache after the loss)
ALLOC, FREE, EMPTY_CACHE, MARK, POINT = "a", "f", "e", "m", "x"


@dataclass(frozen=True)
class AllocatorSettings:
    """`PYTORCH_CUDA_ALLOC_CONF` knobs the model honours, plus the bytes the allocator may reserve on the card.

    `roundup_power2_divisions` holds one division count per power-of-two interval from 1 MiB to 64 GiB (16 of
    them, as `AcceleratorAllocatorConfig::roundup_power2_divisions(size)` indexes them); empty means off.
    `device_limit` None: cudaMalloc never fails.
    """

    max_split_size: int = UNLIMITED
    max_non_split_rounding: int = K_LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = ()
    expandable_segments: bool = False
    large_segment_size: int = K_LARGE_BUFFER
    device_limit: int | None = None

    @classmethod
    def from_conf(cls, conf: str, device_limit: int | None = None) -> AllocatorSettings:
        """Parse a `PYTORCH_CUDA_ALLOC_CONF` string, e.g. `expandable_segments:True,max_split_size_mb:128`.

        Accepted keys: max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions (an int, or
        `[256:1,512:2,>:4]` keyed by MiB), expandable_segments, large_segment_size_mb; others raise ValueError.
        """
        kw: dict = {}
        for key, val in _conf_items(conf):
            if key == "max_split_size_mb":
                mb = int(val)
                if mb < K_LARGE_BUFFER // MIB:  # torch 2.13 parseMaxSplitSize: "too small, must be >= 20"
                    raise ValueError(f"max_split_size_mb={mb}: must be >= {K_LARGE_BUFFER // MIB}")
                kw["max_split_size"] = mb * MIB
            elif key == "max_non_split_rounding_mb":
                kw["max_non_split_rounding"] = int(val) * MIB
            elif key == "large_segment_size_mb":
                kw["large_segment_size"] = int(val) * MIB
            elif key == "expandable_segments":
                kw["expandable_segments"] = val.lower() in ("true", "1")
            elif key == "roundup_power2_divisions":
                kw["roundup_power2_divisions"] = _parse_divisions(val)
            else:
                raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF key {key!r} is not modelled")
        return cls(device_limit=device_limit, **kw)


def _digits(text: str) -> bool:
    """ASCII digits only, as torch's parser reads them (std::isdigit; Python's isdigit also takes '٣')."""
    return text.isascii() and text.isdigit()


def _power_of_two(text: str, zero: bool = False) -> bool:
    return (
        _digits(text)
        and len(text) <= 18
        and ((int(text) == 0 and zero) or (int(text) & (int(text) - 1) == 0 < int(text)))
    )


def torch_grammar_problem(conf: str) -> str | None:
    """Why torch's own parser refuses a `PYTORCH_CUDA_ALLOC_CONF` string at CUDA init, or None: tokens split at
    `, : [ ]` with spaces dropped, then `key : value` items separated by single commas (torch 2.13's
    `AcceleratorAllocatorConfig`, c10/core/AllocatorConfig.cpp, its messages as libc10.so carries them):
    max_split_size_mb and max_non_split_rounding_mb integers of at least kLargeBuffer's 20 MiB ("too small, must
    be >="); large_segment_size_mb above kMinLargeAlloc's 10 MiB (`parseLargeSegmentSize`);
    roundup_power2_divisions a power of two, or `[MiB:N, ..., >:N]` with power-of-two MiB keys and N a power of
    two or 0 (`parseRoundUpPower2Divisions`); expandable_segments exactly True or False.
    Keys torch has that the simulator does not model are left to `AllocatorSettings.from_conf`."""
    tokens = [t for t in re.split(r"([,:\[\]])", conf.replace(" ", "")) if t]
    i, n = 0, len(tokens)
    while i < n:
        key = tokens[i]
        if key in ",:[]":
            return f"{key!r} where an option name belongs (torch: 'Unrecognized CachingAllocator option')"
        if i + 1 >= n or tokens[i + 1] != ":":
            return f"{key}: expected ':' and a value"
        i += 2
        if i >= n or tokens[i] in ",:]":
            return f"{key}: expected a value after ':'"
        value = tokens[i]
        if key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            if not _digits(value) or len(value) > 18 or int(value) < K_LARGE_BUFFER // MIB:
                return f"{key}:{value[:20]}: torch takes an integer of at least {K_LARGE_BUFFER // MIB} (MiB)"
        elif key == "large_segment_size_mb" and (not _digits(value) or len(value) > 18 or int(value) <= 10):
            return f"{key}:{value[:20]}: torch takes an integer above kMinLargeAlloc's 10 (MiB)"
        elif key == "expandable_segments" and value not in ("True", "False"):
            return f"{key}:{value[:20]}: torch takes exactly True or False"
        elif key == "roundup_power2_divisions" and value != "[":
            if not _power_of_two(value):
                return f"{key}:{value[:20]}: torch takes a power of two (or [MiB:N,...,>:N])"
        elif key == "roundup_power2_divisions":
            i += 1
            while i < n and tokens[i] != "]":
                interval, colon, div = tokens[i], tokens[i + 1 : i + 2], tokens[i + 2 : i + 3]
                if colon != [":"] or not div or not _power_of_two(div[0], zero=True):
                    return f"{key}: each [MiB:N] needs N a power of two or 0"
                if interval != ">" and not _power_of_two(interval):
                    return f"{key}: interval {interval[:20]!r} is not a power of two (MiB) or '>'"
                i += 3
                if i < n and tokens[i] == ",":
                    i += 1
            if i >= n:
                return f"{key}: '[' without its ']'"
        i += 1
        if i < n:
            if tokens[i] != ",":
                return f"{tokens[i][:20]!r} after {key}'s value: expected ','"
            i += 1
            if i >= n:
                return "a trailing ','"
    return None


def _conf_items(conf: str) -> Iterator[tuple[str, str]]:
    """`k:v,k:[a:b,c:d]` -> (k, v) pairs (brackets kept whole)."""
    depth, cur, parts = 0, "", []
    for ch in conf.replace(" ", ""):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    for p in parts:
        key, _, val = p.partition(":")
        yield key, val


def _parse_divisions(val: str) -> tuple[int, ...]:
    """`roundup_power2_divisions`: `4` for every interval, or `[64:8,256:4,>:1]` per interval (MiB keys)."""
    if not val.startswith("["):
        return (int(val),) * ROUNDUP_INTERVALS
    out = [0] * ROUNDUP_INTERVALS
    last_index = 0
    for item in val.strip("[]").split(","):
        k, _, v = item.partition(":")
        if k == ">":
            for i in range(last_index + 1, ROUNDUP_INTERVALS):
                out[i] = int(v)
            continue
        index = _interval_index(int(k) * MIB)
        out[index] = int(v)
        last_index = index
    return tuple(out)


def _interval_index(size: int) -> int:
    """`roundup_power2_divisions(size)`'s interval: log2(size) - 20, clamped to 0..15 (1 MiB .. 64 GiB)."""
    log_size = size.bit_length() - 1
    return min(max(log_size - 20, 0), ROUNDUP_INTERVALS - 1)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """`roundup_power2_next_division`: the next of `divisions` equal steps between two powers of two.

    1200 with 4 divisions: steps 1024, 1280, 1536, 1792 -> 1280. Powers of two are returned as they are.

    Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
    """
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def round_size(size: int, s: AllocatorSettings) -> int:
    """`round_size`: at least 512 B; a multiple of 512 B, or the next power-of-two division when
    `roundup_power2_divisions` gives this size's interval more than one division and size > 512 × divisions.

    Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
    """
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = s.roundup_power2_divisions[_interval_index(size)] if s.roundup_power2_divisions else 0
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def is_small(size: int) -> bool:
    """`get_pool`: rounded requests <= 1 MiB use the small pool.

    Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
    """
    return size <= K_SMALL_SIZE


def allocation_size(size: int, s: AllocatorSettings) -> int:
    """`get_allocation_size`: the cudaMalloc size for a new segment serving a rounded request.

    <= 1 MiB: 2 MiB; < 10 MiB: `large_segment_size` (20 MiB); otherwise the request rounded up to 2 MiB.

    Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
    """
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return s.large_segment_size
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


def should_split(block_size: int, size: int, small: bool, s: AllocatorSettings) -> bool:
    """`should_split`: small pool or expandable segments split a remainder >= 512 B; the large pool
    splits a remainder > 1 MiB, and only for requests under `max_split_size`.

    Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
    """
    remaining = block_size - size
    if small or s.expandable_segments:
        return remaining >= K_MIN_BLOCK_SIZE
    return size < s.max_split_size and remaining > K_SMALL_SIZE


class _Block:
    """A piece of a segment: free or allocated, mapped or (expandable segments only) unmapped address space."""

    __slots__ = ("size", "addr", "prev", "next", "allocated", "small", "stream", "expandable", "mapped")

    def __init__(self, size: int, addr: int, small: bool, stream: int, expandable: bool = False) -> None:
        self.size = size
        self.addr = addr
        self.prev: _Block | None = None
        self.next: _Block | None = None
        self.allocated = False
        self.small = small
        self.stream = stream
        self.expandable = expandable
        self.mapped = True

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def split(self, size: int) -> _Block:
        """Keep the first `size` bytes; the rest becomes a new block linked right after this one, with the same
        pool, stream and kind (torch's `splitBlock` / `map_block` remainder); returns it."""
        rest = _Block(self.size - size, self.addr + size, self.small, self.stream, self.expandable)
        rest.prev, rest.next = self, self.next
        if self.next:
            self.next.prev = rest
        self.next = rest
        self.size = size
        return rest


@dataclass(frozen=True)
class SimResult:
    """What a replay found. Bytes; "allocated" counts whole blocks handed out (torch's `allocated_bytes`).

    `fragmentation` = peak_reserved - peak_allocated: what `max_memory_reserved` adds to `max_memory_allocated`
    (the two peaks may fall at different events). `fragmentation_at_peak` = reserved - allocated at the event
    of peak reserved (the "reserved but unallocated" of an OOM message there).
    """

    peak_reserved: int
    peak_allocated: int
    reserved_at_peak_allocated: int
    allocated_at_peak_reserved: int
    peak_label: str
    events: int
    segments_allocated: int
    retries: int
    oom: bool = False
    oom_event: int | None = None
    oom_request: int | None = None
    phase_peaks: dict = field(default_factory=dict)  # label -> [peak reserved, peak allocated]
    # reserved-but-free bytes at the peak of reserved, by where they sit: small pool; large pool in segments
    # that are split (carved for other sizes); large pool in whole cached segments (freeable by empty_cache)
    free_at_peak: dict = field(default_factory=dict)
    # per training step (a step starts at each "generate" mark; 0 = before the first): [peak reserved, allocated]
    step_peaks: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready: the fields, plus fragmentation (bytes and fraction of peak allocated)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(
            fragmentation=self.fragmentation,
            fragmentation_at_peak=self.fragmentation_at_peak,
            fragmentation_fraction=round(self.fragmentation_fraction, 6),
            source="simulated (estimator.hardware.allocator)",
        )
        return d

    @property
    def fragmentation(self) -> int:
        return self.peak_reserved - self.peak_allocated

    @property
    def fragmentation_at_peak(self) -> int:
        return self.peak_reserved - self.allocated_at_peak_reserved

    @property
    def fragmentation_fraction(self) -> float:
        """(peak reserved - peak allocated) / peak allocated."""
        return self.fragmentation / self.peak_allocated if self.peak_allocated else 0.0


class CachingAllocator:
    """The simulated `DeviceCachingAllocator` of one device. `malloc`/`free`/`empty_cache` mirror the C++."""

    def __init__(self, settings: AllocatorSettings | None = None) -> None:
        self.s = settings or AllocatorSettings()
        self.free_lists: dict[
            tuple[int, bool], list[tuple[int, int, _Block]]
        ] = {}  # (stream, small) -> sorted
        self.unmapped: dict[tuple[int, bool], list[tuple[int, _Block]]] = {}  # expandable: by address
        self.segments: list[_Block] = []  # expandable segments' first blocks (for release)
        self.live: dict[int, _Block] = {}
        self.reserved = 0
        self.allocated = 0
        self.next_addr = VA_SPAN
        self.segments_allocated = 0
        self.retries = 0

    # ---- pools of cached blocks -----------------------------------------------------------------------
    def _insert(self, b: _Block) -> None:
        bisect.insort(self.free_lists.setdefault((b.stream, b.small), []), (b.size, b.addr, b))

    def _erase(self, b: _Block) -> None:
        lst = self.free_lists[(b.stream, b.small)]
        i = bisect.bisect_left(lst, (b.size, b.addr))
        assert lst[i][2] is b
        del lst[i]

    # ---- malloc -------------------------------------------------------------------------------------------
    def malloc(self, key: int, orig_size: int, stream: int = 0) -> bool:
        """`malloc`: cached block, else new segment, else release and retry twice. False on OOM.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        s = self.s
        size = round_size(orig_size, s)
        small = is_small(size)
        block = self._get_free_block(size, small, stream)
        if block is None:
            block = (
                self._alloc_block(size, small, stream)
                or (
                    self._release_available_cached_blocks(size, small, stream)
                    and self._alloc_block(size, small, stream)
                )
                or (self._release_cached_blocks() and self._retry(size, small, stream))
            )
        if not block:
            return False
        if should_split(block.size, size, small, s):
            self._insert(block.split(size))
        block.allocated = True
        self.live[key] = block
        self.allocated += block.size
        return True

    def _retry(self, size: int, small: bool, stream: int) -> _Block | None:
        self.retries += 1
        return self._alloc_block(size, small, stream)

    def _get_free_block(self, size: int, small: bool, stream: int) -> _Block | None:
        """`get_free_block`: best fit of the same stream and pool, with the oversize-block rules.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        s = self.s
        lst = self.free_lists.get((stream, small))
        if not lst:
            return None
        i = bisect.bisect_left(lst, (size, -1))
        if i == len(lst):
            return None
        b = lst[i][2]
        if b.expandable and s.expandable_segments:
            # best fit by the size the block could grow to (free block followed by unmapped space)
            def grow(x: _Block) -> int:
                return x.size + (x.next.size if x.next is not None and not x.next.mapped else 0)

            j = i + 1
            while b.expandable and j < len(lst) and grow(lst[j][2]) < grow(b):
                b, i = lst[j][2], j
                j += 1
        if size < s.max_split_size and b.size >= s.max_split_size:
            return None  # "Do not return an oversized block for a large request"
        if size >= s.max_split_size and b.size >= size + s.max_non_split_rounding:
            return None  # "Allow oversized block size to be rounded up but within a limit"
        del lst[i]
        return b

    def _alloc_block(self, size: int, small: bool, stream: int) -> _Block | None:
        """`alloc_block`: a new cudaMalloc segment of `get_allocation_size`, or map expandable pages.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        if self.s.expandable_segments:
            return self._try_allocate_expandable_block(size, small, stream)
        alloc = allocation_size(size, self.s)
        if self.s.device_limit is not None and self.reserved + alloc > self.s.device_limit:
            return None
        b = _Block(alloc, self.next_addr, small, stream)
        self.next_addr += VA_SPAN
        self.reserved += alloc
        self.segments_allocated += 1
        return b

    # ---- release -----------------------------------------------------------------------------------------
    def _release_block(self, b: _Block) -> None:
        """`release_block`: cudaFree a whole cached segment.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        self._erase(b)
        self.reserved -= b.size

    def _release_available_cached_blocks(self, size: int, small: bool, stream: int) -> bool:
        """`release_available_cached_blocks`: only with max_split_size set; free the smallest cached
        oversize block >= max(size, max_split_size), else the largest oversize ones until enough is freed.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        s = self.s
        if s.max_split_size == UNLIMITED:
            return False
        lst = self.free_lists.get((stream, small), [])
        want = max(size, s.max_split_size)
        i = bisect.bisect_left(lst, (want, -1))
        if i < len(lst):
            self._release_block(lst[i][2])
            return True
        released = 0
        while lst and released < want and lst[-1][0] >= s.max_split_size and not lst[-1][2].is_split():
            b = lst[-1][2]
            released += b.size
            self._release_block(b)
        return released >= want

    def _release_cached_blocks(self) -> bool:
        """`release_cached_blocks` / `release_blocks`: free every cached unsplit segment; expandable
        segments unmap their whole free pages.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        for lst in list(self.free_lists.values()):
            for _, _, b in list(lst):
                if b.expandable:
                    self._unmap_block(b)
                elif not b.is_split():
                    self._release_block(b)
        return True

    def free_by_kind(self) -> dict[str, int]:
        """Cached free bytes now: small pool, large pool split blocks, large pool whole segments."""
        out = {"small": 0, "large_split": 0, "large_whole": 0}
        for (_, small), lst in self.free_lists.items():
            for size, _, b in lst:
                k = "small" if small else ("large_split" if b.is_split() else "large_whole")
                out[k] += size
        return out

    def empty_cache(self) -> None:
        """`emptyCache` = `release_cached_blocks`.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        self._release_cached_blocks()

    # ---- free --------------------------------------------------------------------------------------------
    def free(self, key: int) -> None:
        """`free` -> `free_block`: merge with free neighbours of the segment, back into the pool.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        b = self.live.pop(key)
        b.allocated = False
        self.allocated -= b.size
        for n in (b.prev, b.next):
            if n is not None and not n.allocated and n.mapped == b.mapped:
                self._merge(b, n)
        self._insert(b)

    def _merge(self, dst: _Block, src: _Block) -> None:
        """`try_merge_blocks`: dst absorbs its free neighbour src (src leaves its pool).

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        if src.mapped:
            self._erase(src)
        else:
            self._erase_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next:
                dst.next.prev = dst
        dst.size += src.size

    # ---- expandable segments -----------------------------------------------------------------------------
    def _page(self, small: bool) -> int:
        """ExpandableSegment's segment_size: 2 MiB pages for the small pool, 20 MiB for the large."""
        return K_SMALL_BUFFER if small else self.s.large_segment_size

    def _erase_unmapped(self, b: _Block) -> None:
        lst = self.unmapped[(b.stream, b.small)]
        i = bisect.bisect_left(lst, (b.addr,))
        assert lst[i][1] is b
        del lst[i]

    def _insert_unmapped(self, b: _Block) -> None:
        bisect.insort(self.unmapped.setdefault((b.stream, b.small), []), (b.addr, b))

    def _find_expandable_block(self, size: int, small: bool, stream: int) -> _Block:
        """`find_expandable_block`: the lowest-address unmapped range (with the free block before it)
        that has `size` bytes of free or unmapped space; else a new segment spanning the address space.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """

        def allocatable(x: _Block | None) -> bool:
            return x is not None and not x.allocated

        for _, c in self.unmapped.get((stream, small), []):
            if allocatable(c.prev):
                c = c.prev
            room, x = 0, c
            while room < size and allocatable(x):
                room += x.size
                x = x.next
            if room >= size:
                return c
        seg = _Block(VA_SPAN, self.next_addr, small, stream, expandable=True)
        self.next_addr += 2 * VA_SPAN
        seg.mapped = False
        self._insert_unmapped(seg)
        self.segments.append(seg)
        return seg

    def _map_block(self, b: _Block, size: int) -> bool:
        """`map_block`: map whole pages covering `size` bytes from the start of unmapped `b`.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        page = self._page(b.small)
        mapped = min(-(-size // page) * page, b.size)
        if self.s.device_limit is not None and self.reserved + mapped > self.s.device_limit:
            return False
        self._erase_unmapped(b)
        b.mapped = True
        if mapped < b.size:
            rest = b.split(mapped)
            rest.mapped = False
            self._insert_unmapped(rest)
        for n in (b.prev, b.next):
            if n is not None and not n.allocated and n.mapped:
                self._merge(b, n)
        self._insert(b)
        self.reserved += mapped
        self.segments_allocated += 1
        return True

    def _try_allocate_expandable_block(self, size: int, small: bool, stream: int) -> _Block | None:
        """`try_allocate_expandable_block`: map pages until the candidate range holds `size` bytes.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        c = self._find_expandable_block(size, small, stream)
        if not c.mapped and not self._map_block(c, min(c.size, size)):
            return None
        while c.size < size:
            nxt = c.next
            assert nxt is not None and not nxt.mapped
            if not self._map_block(nxt, min(size - c.size, nxt.size)):
                return None
            c = nxt
        self._erase(c)
        return c

    def _unmap_block(self, b: _Block) -> None:
        """`unmap_block`: unmap the whole pages inside a free block; the edges stay mapped and free.

        Source: https://github.com/pytorch/pytorch/blob/v2.13.0/c10/cuda/CUDACachingAllocator.cpp
        """
        page = self._page(b.small)
        base = self._segment_base(b)  # pages are counted from the segment's start
        begin = base + -(-(b.addr - base) // page) * page
        end = base + ((b.addr + b.size - base) // page) * page
        if begin >= end:
            return
        self._erase(b)
        if begin > b.addr:
            before = _Block(begin - b.addr, b.addr, b.small, b.stream, expandable=True)
            before.prev, before.next = b.prev, b
            if b.prev:
                b.prev.next = before
            b.prev = before
            self._insert(before)
        if b.addr + b.size > end:
            after = _Block(b.addr + b.size - end, end, b.small, b.stream, expandable=True)
            after.prev, after.next = b, b.next
            if b.next:
                b.next.prev = after
            b.next = after
            self._insert(after)
        b.addr, b.size, b.mapped = begin, end - begin, False
        self.reserved -= b.size
        for n in (b.prev, b.next):
            if n is not None and not n.allocated and not n.mapped:
                self._merge(b, n)
        self._insert_unmapped(b)

    @staticmethod
    def _segment_base(b: _Block) -> int:
        """An expandable segment spans [base, base + VA_SPAN) with base a multiple of VA_SPAN."""
        return b.addr - b.addr % VA_SPAN


# ---- replay ----------------------------------------------------------------------------------------------------
Event = tuple  # ("a", id, size, stream) | ("f", id) | ("e",) | ("m", label)


def simulate(events: Iterable[Event], settings: AllocatorSettings | None = None) -> SimResult:
    """Replay `events` through the model; peaks of reserved and allocated bytes, and the first OOM if any.

    After an OOM the replay goes on as if the limit were lifted (so the peaks say how much the run needed).
    An alloc of an id that is live, or a free of an unknown id, raises ValueError naming the event.
    """
    a = CachingAllocator(settings)
    peak_r = peak_a = r_at_a = a_at_r = 0
    label = peak_label = ""
    phase: dict[str, list[int]] = {}
    oom_event = oom_request = None
    free_at_peak: dict[str, int] = {}
    steps: dict[int, list[int]] = {0: [0, 0]}
    step_cur = steps[0]
    n = 0
    cur = [0, 0]
    for n, ev in enumerate(events, 1):
        kind = ev[0]
        if kind == ALLOC:
            if ev[1] in a.live:
                raise ValueError(f"event {n}: alloc of id {ev[1]} which is still live")
            stream = ev[3] if len(ev) > 3 else 0
            if not a.malloc(ev[1], ev[2], stream):
                if oom_event is None:
                    oom_event, oom_request = n, ev[2]
                a.s = _unlimited(a.s)
                a.malloc(ev[1], ev[2], stream)
            if a.reserved > peak_r:
                peak_r, a_at_r, peak_label = a.reserved, a.allocated, label
                free_at_peak = a.free_by_kind()
            if a.allocated > peak_a:
                peak_a, r_at_a = a.allocated, a.reserved
            if a.reserved > cur[0]:
                cur[0] = a.reserved
            if a.allocated > cur[1]:
                cur[1] = a.allocated
            if a.reserved > step_cur[0]:
                step_cur[0] = a.reserved
            if a.allocated > step_cur[1]:
                step_cur[1] = a.allocated
        elif kind == FREE:
            if ev[1] not in a.live:
                raise ValueError(f"event {n}: free of id {ev[1]} which is not live")
            a.free(ev[1])
        elif kind == EMPTY_CACHE:
            a.empty_cache()
        elif kind == POINT:
            continue
        elif kind == MARK:
            label = ev[1]
            if label == "generate":
                step_cur = steps[len(steps)] = [a.reserved, a.allocated]
            cur = phase.setdefault(label, [a.reserved, a.allocated])
            cur[0], cur[1] = max(cur[0], a.reserved), max(cur[1], a.allocated)
        else:
            raise ValueError(f"event {n}: unknown kind {kind!r} (accepted: a, f, e, m, x)")
    return SimResult(
        peak_r,
        peak_a,
        r_at_a,
        a_at_r,
        peak_label,
        n,
        a.segments_allocated,
        a.retries,
        oom_event is not None,
        oom_event,
        oom_request,
        phase,
        free_at_peak,
        steps,
    )


def min_device_limit(
    events: list[Event], settings: AllocatorSettings | None = None, resolution: int = 64 * MIB
) -> tuple[int, SimResult]:
    """The smallest allocator limit (to `resolution`) at which the stream runs without an OOM, and its replay.

    Under a limit the allocator frees cached blocks and retries before failing (`malloc`), so a run can fit in
    less than its unlimited peak reserved; never less than its peak allocated. Bisection between the two, which
    assumes no OOM above a limit that passes. The retries make that only nearly true: a limit changes when cached
    segments are given back and so the layout after, and on 6 of 24 traced streams (the min-card traces and the
    kept streams) a limit up to 112 MiB (0.97 % of the allocated peak) above the one found still fails, while on
    others a limit below it passes (`sweeps.report.stranding` brackets one). The band every fit verdict adds
    covers that; a GPU's bisection (`sweeps.mincard`) meets the same.
    """
    s = settings or AllocatorSettings()
    free = simulate(events, _unlimited(s))
    lo, hi = free.peak_allocated, free.peak_reserved
    best = free
    while hi - lo > resolution:
        mid = (lo + hi) // 2
        r = simulate(events, _with_limit(s, mid))
        if r.oom:
            lo = mid
        else:
            hi, best = mid, r
    return hi, best


def _with_limit(s: AllocatorSettings, limit: int) -> AllocatorSettings:
    return AllocatorSettings(
        s.max_split_size, s.max_non_split_rounding, s.roundup_power2_divisions, s.expandable_segments,
        s.large_segment_size, limit,
    )  # fmt: skip


def with_empty_cache_steps(events: Iterable[Event], every: int, step_mark: str = "generate") -> list[Event]:
    """The stream as it runs with TRL's `torch_empty_cache_steps=every`: transformers' `Trainer.training_step`
    calls `empty_cache()` after `compute_loss` when `global_step % every == 0`. Steps start at each `step_mark`
    phase mark (global_step 0 for the first); the loss points are the stream's `("x", "loss")` events."""
    out: list[Event] = []
    step = -1
    for ev in events:
        out.append(ev)
        if ev[0] == MARK and ev[1] == step_mark:
            step += 1
        elif ev[0] == POINT and ev[1] == "loss" and max(step, 0) % every == 0:
            out.append((EMPTY_CACHE,))
    return out


def _unlimited(s: AllocatorSettings) -> AllocatorSettings:
    return AllocatorSettings(
        s.max_split_size, s.max_non_split_rounding, s.roundup_power2_divisions, s.expandable_segments,
        s.large_segment_size, None,
    )  # fmt: skip


# ---- the stream on disk: gzip text, one event a line ------------------------------------------------------------
def dump_stream(events: Iterable[Event], path: str | Path) -> None:
    """Write events as gzip text: `a ID SIZE [STREAM]`, `f ID`, `e`, `m LABEL`; atomically (tmp + rename)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", compresslevel=9) as fh:
        for ev in events:
            if ev[0] == ALLOC and (len(ev) < 4 or ev[3] == 0):
                fh.write(f"a {ev[1]} {ev[2]}\n")
            else:
                fh.write(" ".join(str(x) for x in ev) + "\n")
    tmp.replace(path)


def load_stream(path: str | Path) -> list[Event]:
    """Read a stream written by `dump_stream`."""
    out: list[Event] = []
    with gzip.open(path, "rt") as fh:
        for n, line in enumerate(fh, 1):
            p = line.rstrip("\n").split(" ", 1) if line[0] in (MARK, POINT) else line.split()
            k = p[0]
            if k == ALLOC:
                if int(p[2]) < 0:
                    raise ValueError(f"line {n}: allocation of {int(p[2])} bytes (accepted: 0 or more)")
                out.append((ALLOC, int(p[1]), int(p[2]), int(p[3]) if len(p) > 3 else 0))
            elif k == FREE:
                out.append((FREE, int(p[1])))
            elif k in (MARK, POINT):
                out.append((k, p[1]))
            else:
                out.append((EMPTY_CACHE,))
    return out
