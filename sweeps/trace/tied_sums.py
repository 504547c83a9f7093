"""A traced stream as real tensors allocate it where a tied head's gradient meets the embedding's.

Under FakeTensorMode autograd's input buffer sums the two [V, H] gradients out of place (FakeTensors are a tensor
subclass), so a traced stream holds three there; real tensors with TRL's fused head sum them in place, two
(`estimator.terms.optimizer.tied_gradients_at_meeting`, tests/ground_truth/test_tied_gradient_sum.py). In a
traced stream the out-of-place sum is an allocation of V·H·w bytes whose next two events free the two gradients it
summed: the head's, waiting in the buffer since the head's backward, then the embedding's. In place, the waiting
gradient takes the sum: no allocation, and it lives on, freed where the sum was.
"""

from __future__ import annotations

from estimator.hardware.allocator import ALLOC, FREE, Event
from estimator.model.architecture import Arch
from estimator.settings.config import RunConfig
from estimator.terms.optimizer import DISPATCH, REAL, tied_gradient_buffer, tied_gradients_at_meeting


def in_place(events: list[Event], nbytes: int) -> tuple[list[Event], int]:
    """`events` with every out-of-place sum of two live `nbytes` allocations made in place; and how many were
    (`nbytes` 0, no tied gradient: `events` as they are)."""
    if nbytes <= 0:
        return list(events), 0
    live: dict[int, int] = {}
    dropped: set[int] = set()  # indices of the sums' allocations and of the waiting gradients' frees
    renamed: dict[int, int] = {}  # the sum's id -> the waiting gradient's, which holds the sum in place
    for i, ev in enumerate(events):
        if ev[0] == ALLOC:
            nxt = events[i + 1 : i + 3]
            if (
                ev[2] == nbytes
                and len(nxt) == 2
                and all(e[0] == FREE and live.get(e[1]) == nbytes for e in nxt)
                and nxt[0][1] != nxt[1][1]
            ):
                dropped |= {i, i + 1}
                renamed[ev[1]] = nxt[0][1]
                continue
            live[ev[1]] = ev[2]
        elif ev[0] == FREE:
            live.pop(ev[1], None)
    out = [
        (FREE, renamed[ev[1]]) if ev[0] == FREE and ev[1] in renamed else ev
        for i, ev in enumerate(events)
        if i not in dropped
    ]
    return out, len(renamed)


def as_real(events: list[Event], cfg: RunConfig, arch: Arch) -> list[Event]:
    """A traced stream of `cfg` as real tensors allocate it: its tied sums made in place where real tensors sum in
    place (`tied_gradients_at_meeting`), else `events` as they are."""
    if tied_gradients_at_meeting(cfg, arch, REAL) < tied_gradients_at_meeting(cfg, arch, DISPATCH):
        events, _ = in_place(events, tied_gradient_buffer(cfg, arch))
    return events
