"""Several limit runs at once on one GPU: which waiting runs may start (pure), and the loop that starts them,
waits for them and feeds each configuration's search.

A run may start only while Σ(limits of the running runs + its own) + (running + 1) × the per-process memory outside
torch's allocator (the CUDA context) ≤ the usable device memory, and running + 1 ≤ max_concurrent. Waiting runs are
taken in priority order (lineup order, then limit); one that does not fit keeps its share reserved, so the runs
behind it only use memory it could not use anyway (it is never starved). Under a deadline no run starts that its
expected time would carry past it; a run still going at the deadline is killed and its trial is not recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from estimator.units import GIB
from sweeps.mincard import search


@dataclass(frozen=True)
class Card:
    """What the runs may share: usable device bytes, each process's non-torch bytes, how many at once."""

    usable_bytes: int
    context_bytes: int = int(0.6 * GIB)  # CUDA context + lazily loaded kernels, outside the allocator
    max_concurrent: int = 6

    @property
    def max_limit(self) -> int:
        """The largest limit one run may get alone on the card."""
        return self.usable_bytes - self.context_bytes


@dataclass(frozen=True)
class Waiting:
    """A run ready to start: its search (by index), limit and expected seconds."""

    search: int
    limit_bytes: int
    expected_s: float


def pick(
    waiting: Sequence[Waiting],
    running_limits: Sequence[int],
    card: Card,
    now: float = 0.0,
    deadline: float | None = None,
) -> list[Waiting]:
    """The waiting runs to start now, in the order given (see the module docstring for the rule)."""
    free = card.usable_bytes - sum(running_limits) - len(running_limits) * card.context_bytes
    slots = card.max_concurrent - len(running_limits)
    out = []
    for w in waiting:
        if slots <= 0:
            break
        if deadline is not None and now + w.expected_s > deadline:
            continue  # cannot finish in the time left: never started, reserves nothing
        cost = w.limit_bytes + card.context_bytes
        if cost <= free:
            out.append(w)
            slots -= 1
        free -= cost  # started, or kept for it
    return out


class Handle(Protocol):
    """A started run."""

    timeout_s: float

    def done(self) -> bool: ...

    def result(self) -> dict: ...


Launch = Callable[[int, int, float], Handle]  # (search index, limit bytes, timeout s) -> a started run


@dataclass
class SearchState:
    """One configuration's search: its trials (loaded ones included), the round in flight, its errors."""

    params: search.Params
    trials: list[search.Trial] = field(default_factory=list)
    expected_s: float = 600.0  # until a run of it has finished: the lineup's estimate
    max_errors: int = 2
    waiting: list[int] = field(default_factory=list)
    running: list[int] = field(default_factory=list)
    errors: int = 0
    seconds: list[float] = field(default_factory=list)

    def refill(self) -> None:
        """Start the next round once the current one has fully finished."""
        if not self.waiting and not self.running and self.state == "searching":
            self.waiting = search.next_limits(self.trials, self.params)

    @property
    def state(self) -> str:
        """`searching`, `found`, `no-fit` or `failed` (too many runs that ended in neither ok nor oom)."""
        if self.errors >= self.max_errors:
            return "failed"
        return search.outcome(self.trials, self.params)


@dataclass(frozen=True)
class Finished:
    """A run that ended, handed to the caller (which records it) before the search sees it."""

    search: int
    limit_bytes: int
    result: dict
    seconds: float


def run(
    states: Sequence[SearchState],
    launch: Launch,
    card: Card,
    *,
    child_timeout_s: float,
    deadline: float | None = None,
    on_trial: Callable[[Finished], search.Trial | None],
    on_done: Callable[[int], None] = lambda i: None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    poll_s: float = 0.5,
) -> bool:
    """Run every search until each is over or the deadline leaves nothing that can start. `on_trial` records a
    finished run and returns its Trial (None: an error, not a bound); `on_done(i)` is called once per search that
    ends. True when every search ended."""
    running: list[tuple[int, int, Handle, float]] = []
    ended: set[int] = set()
    while True:
        now = clock()
        for i, s in enumerate(states):
            s.refill()
            if s.state != "searching" and not s.running and i not in ended:
                ended.add(i)
                on_done(i)
        waiting = [Waiting(i, lim, s.expected_s) for i, s in enumerate(states) for lim in s.waiting]
        for w in pick(waiting, [r[1] for r in running], card, now, deadline):
            timeout = child_timeout_s if deadline is None else min(child_timeout_s, deadline - now)
            states[w.search].waiting.remove(w.limit_bytes)
            states[w.search].running.append(w.limit_bytes)
            running.append((w.search, w.limit_bytes, launch(w.search, w.limit_bytes, timeout), now))
        if not running:
            return len(ended) == len(states)
        sleep(poll_s)
        still = []
        for i, limit, handle, started in running:
            if not handle.done():
                still.append((i, limit, handle, started))
                continue
            s = states[i]
            s.running.remove(limit)
            result = handle.result()
            seconds = clock() - started
            cut = (
                handle.timeout_s < child_timeout_s
                and result.get("status") == "error"
                and str(result.get("error", "")).startswith("timeout")
            )
            if cut:  # killed at the deadline: not a measurement; the search stops here, a rerun resumes
                s.waiting.clear()
                continue
            trial = on_trial(Finished(i, limit, result, seconds))
            s.seconds.append(seconds)
            s.expected_s = max(s.seconds)
            if trial is None:
                s.errors += 1
                if s.state != "failed" and limit not in s.waiting:
                    s.waiting.append(limit)  # run again (an error bounds nothing)
            else:
                s.trials.append(trial)
            if s.state != "searching":
                s.waiting.clear()  # the rest of this round would add nothing
        running = still
