"""Packing limit runs on one card: the memory sum, the concurrency cap and the deadline (fake runs, fake clock)."""

from sweeps.mincard import schedule
from sweeps.mincard.search import Params, Trial

GIB = 1 << 30


def W(search, gib, expected=10.0):
    return schedule.Waiting(search, gib * GIB, expected)


def test_pick_packs_by_memory_and_keeps_room_for_a_run_that_waits():
    card = schedule.Card(usable_bytes=20 * GIB, context_bytes=1 * GIB, max_concurrent=6)
    # running 8 GiB + its context: 11 GiB free; 5 + 1 fits (5 left), then 4 + 1 fits (0 left)
    assert schedule.pick([W(0, 5), W(1, 4), W(2, 1)], [8 * GIB], card) == [W(0, 5), W(1, 4)]
    # 12 + 1 does not fit in 11: its share is kept, so the 5 behind it waits too
    assert schedule.pick([W(0, 12), W(1, 5)], [8 * GIB], card) == []
    # alone on the card, a run up to usable - context starts
    assert schedule.pick([W(0, 19)], [], card) == [W(0, 19)]


def test_pick_respects_concurrency_and_the_deadline():
    card = schedule.Card(usable_bytes=80 * GIB, context_bytes=0, max_concurrent=2)
    assert schedule.pick([W(0, 1), W(0, 2), W(0, 3)], [4 * GIB], card) == [W(0, 1)]
    # at t=100 with the deadline at 160: a 90 s run cannot finish, a 30 s one can; the long one reserves nothing
    late = [W(0, 1, 90.0), W(1, 1, 30.0)]
    assert schedule.pick(late, [], card, now=100.0, deadline=160.0) == [W(1, 1, 30.0)]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.t += s


class FakeRun:
    def __init__(self, clock, limit, need, duration, timeout_s):
        self.clock, self.start, self.timeout_s = clock, clock(), timeout_s
        self.duration = min(duration, timeout_s)
        if duration > timeout_s:
            self.res = {"status": "error", "error": f"timeout: run killed after {timeout_s:g} s"}
        elif limit >= need:
            self.res = {"status": "ok", "alloc": need // 2, "reserved": need}
        else:
            self.res = {"status": "oom"}

    def done(self):
        return self.clock() >= self.start + self.duration

    def result(self):
        return self.res


def _run(needs, card, deadline=None, duration=lambda limit, need: 10.0):
    clock = Clock()
    running: list[int] = []
    seen = []

    def launch(i, limit, timeout_s):
        running.append(limit)
        n = len(running)
        seen.append((sum(running) + n * card.context_bytes, n))
        return FakeRun(clock, limit, needs[i], duration(limit, needs[i]), timeout_s)

    def on_trial(f):
        running.remove(f.limit_bytes)
        r = f.result
        if r["status"] == "ok":
            return Trial(f.limit_bytes, "ok", r["alloc"], r["reserved"])
        return Trial(f.limit_bytes, "oom")

    states = [
        schedule.SearchState(Params(first_limit=2 * n, max_limit=card.max_limit), expected_s=5.0)
        for n in needs
    ]
    done = []
    complete = schedule.run(
        states,
        launch,
        card,
        child_timeout_s=100.0,
        deadline=deadline,
        on_trial=on_trial,
        on_done=done.append,
        clock=clock,
        sleep=clock.sleep,
        poll_s=1.0,
    )
    return states, seen, done, complete, clock


def test_several_searches_share_the_card_within_memory_and_concurrency():
    card = schedule.Card(usable_bytes=40 * GIB, context_bytes=1 * GIB, max_concurrent=3)
    needs = [3 * GIB, 5 * GIB, 7 * GIB, 9 * GIB]
    states, seen, done, complete, _ = _run(needs, card)
    assert complete and sorted(done) == [0, 1, 2, 3]
    assert all(total <= card.usable_bytes and n <= 3 for total, n in seen)
    assert max(n for _, n in seen) == 3  # the card was shared
    for s, need in zip(states, needs, strict=True):
        best = min(t.limit_bytes for t in s.trials if t.status == "ok")
        assert need <= best <= need * 1.015


def test_the_deadline_stops_new_runs_and_drops_the_cut_ones():
    card = schedule.Card(usable_bytes=40 * GIB, context_bytes=0, max_concurrent=6)
    # the baseline takes 3 s, so the first round (expected 3 s, started at t=3) starts; its runs take 20 s and
    # are killed at the deadline (t=15), their trials not recorded; nothing starts after it
    slow_after_baseline = lambda limit, need: 3.0 if limit == 2 * need else 20.0  # noqa: E731
    states, seen, done, complete, clock = _run([3 * GIB], card, deadline=15.0, duration=slow_after_baseline)
    assert not complete and done == []
    assert len(seen) == 5  # the baseline, then one round of 4
    assert [t.limit_bytes for t in states[0].trials] == [6 * GIB]  # only the baseline was recorded
    assert clock.t <= 15.0 + 1.0 and states[0].running == []
