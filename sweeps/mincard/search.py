"""The smallest torch memory limit a run passes under: a k-ary search over `memory_limit_bytes` (pure functions).

What bounds it before any constrained run (one run with a generous limit, the baseline, gives both):
- below: the peak allocated. The allocator's reserved total is never below what is allocated, so a limit under the
  allocated peak fails.
- above: the peak reserved. A limit at or above it never triggers, so the same deterministic stream passes again.
Each round tries k limits that split the open bracket (lo fails, hi passes) evenly, the peak reserved first while
it is untried; the search ends when (hi − lo) / lo ≤ resolution, so the smallest passing limit found is within
`resolution` above the true threshold. A run that fails at or above a passing limit (non-determinism) moves lo up
past that pass, and hi becomes the next larger pass: the answer stays one that passed above every failure.

Limits are multiples of `granularity` (2 MiB): the caching allocator reserves large segments rounded to 2 MiB
(`kRoundLarge`) and small ones as 2 MiB buffers (`kSmallBuffer`), so its reserved total is a multiple of 2 MiB
and a limit between two multiples behaves as the lower one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MIB = 1 << 20
GRANULARITY = 2 * MIB
STATUSES = ("ok", "oom", "error")  # passed; ran out of memory under the limit; anything else (not a bound)


@dataclass(frozen=True)
class Trial:
    """One run under one limit: its outcome and the peaks torch counted (None where not known)."""

    limit_bytes: int
    status: str
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None


@dataclass(frozen=True)
class Params:
    """How one configuration is searched."""

    first_limit: int  # the baseline's limit: the estimator's need × 2, or a given cap
    max_limit: int  # the largest limit one run may get on this card
    k: int = 4  # limits per round
    resolution: float = 0.015  # stop when (hi − lo) / lo is at most this
    granularity: int = GRANULARITY
    growth: float = 1.5  # a baseline that fails is retried this much higher (up to max_limit)


@dataclass(frozen=True)
class Bracket:
    """lo: every passing limit is above it (the largest failing limit, or the peak allocated − 1).
    hi: the smallest tried passing limit above lo (None: none). hint: the peak reserved of the passing run with
    the largest limit, rounded up to the granularity (None: no pass reported one)."""

    lo: int
    hi: int | None
    hint: int | None


def round_up(value: float, granularity: int) -> int:
    """`value` rounded up to a multiple of `granularity`."""
    return int(math.ceil(value / granularity)) * granularity


def bracket(trials: Iterable[Trial], granularity: int = GRANULARITY) -> Bracket:
    """The open bracket the trials so far leave (error trials bound nothing)."""
    trials = list(trials)
    passes = [t for t in trials if t.status == "ok"]
    lo = max((t.limit_bytes for t in trials if t.status == "oom"), default=0)
    allocated = max((t.peak_allocated_bytes or 0 for t in passes), default=0)
    lo = max(lo, allocated - 1)
    hi = min((t.limit_bytes for t in passes if t.limit_bytes > lo), default=None)
    hint = None
    if passes:
        widest = max(passes, key=lambda t: t.limit_bytes)
        if widest.peak_reserved_bytes:
            hint = round_up(widest.peak_reserved_bytes, granularity)
    return Bracket(lo=lo, hi=hi, hint=hint)


def narrow_enough(b: Bracket, p: Params) -> bool:
    """The bracket needs no more runs: within the resolution, or no limit on the granularity lies inside it."""
    if b.hi is None:
        return False
    if b.lo > 0 and (b.hi - b.lo) / b.lo <= p.resolution:
        return True
    return round_up(b.lo + 1, p.granularity) >= b.hi


def outcome(trials: Sequence[Trial], p: Params) -> str:
    """`searching`; `found` (the bracket is narrow enough); `no-fit` (even max_limit failed)."""
    b = bracket(trials, p.granularity)
    if b.hi is None and b.lo >= p.max_limit:
        return "no-fit"
    return "found" if narrow_enough(b, p) else "searching"


def baseline(p: Params) -> int:
    """The limit the baseline run gets: the first limit on the search's grid, within the card."""
    return min(round_up(p.first_limit, p.granularity), p.max_limit)


def next_limits(trials: Sequence[Trial], p: Params) -> list[int]:
    """The limits of the next round, ascending ([] when the search is over). No pass yet: the baseline's limit,
    then `growth` times the largest failure (up to max_limit). Else k limits inside (lo, hi): the hint (peak
    reserved) plus k − 1 evenly below it while the hint is untried and inside, else k evenly across."""
    if outcome(trials, p) != "searching":
        return []
    b = bracket(trials, p.granularity)
    tried = {t.limit_bytes for t in trials if t.status in ("ok", "oom")}
    if b.hi is None:
        if not any(t.status in ("ok", "oom") for t in trials):
            return [baseline(p)]
        wider = max(round_up(b.lo * p.growth, p.granularity), round_up(p.first_limit, p.granularity))
        return [min(wider, p.max_limit)]
    if b.hint is not None and b.lo < b.hint < b.hi and b.hint not in tried:
        top = b.hint
        points = [top] + [b.lo + (top - b.lo) * i / p.k for i in range(1, p.k)]
    else:
        points = [b.lo + (b.hi - b.lo) * i / (p.k + 1) for i in range(1, p.k + 1)]
    limits = {round_up(x, p.granularity) for x in points}
    return sorted(x for x in limits if b.lo < x < b.hi and x not in tried)


@dataclass(frozen=True)
class Found:
    """What a finished search says: the smallest passing limit, the largest failing one (None if no run failed:
    the lower bound was the peak allocated), and the bracket's lower end."""

    min_passing_bytes: int | None
    max_failing_bytes: int | None
    lower_bound_bytes: int


def found(trials: Sequence[Trial], granularity: int = GRANULARITY) -> Found:
    """The answer the trials give (whatever the outcome)."""
    b = bracket(trials, granularity)
    fails = [t.limit_bytes for t in trials if t.status == "oom"]
    return Found(min_passing_bytes=b.hi, max_failing_bytes=max(fails, default=None), lower_bound_bytes=b.lo)
