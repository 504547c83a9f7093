"""The smallest-limit search against oracles with known thresholds (the limits of each round worked by hand)."""

import pytest

from sweeps.mincard.search import Params, Trial, bracket, found, next_limits, outcome

MIB = 1 << 20
GIB = 1 << 30


def oracle(threshold: int, allocated: int, reserved: int):
    """A run that passes at a limit >= threshold, reporting the given peaks."""

    def run(limit: int) -> Trial:
        if limit >= threshold:
            return Trial(limit, "ok", allocated, reserved)
        return Trial(limit, "oom")

    return run


def search_all(run, p: Params) -> tuple[list[Trial], list[list[int]]]:
    trials, rounds = [], []
    while limits := next_limits(trials, p):
        rounds.append(limits)
        trials += [run(lim) for lim in limits]
        assert len(rounds) < 30
    return trials, rounds


def test_rounds_worked_by_hand_bracket_the_threshold():
    # allocated 6 GiB, reserved 14 GiB, true threshold 13,000 MiB, baseline limit 20 GiB
    p = Params(first_limit=20 * GIB, max_limit=75 * GIB)
    trials, rounds = search_all(oracle(13_000 * MIB, 6 * GIB, 14 * GIB), p)
    assert [[x // MIB for x in r] for r in rounds] == [
        [20_480],  # the baseline
        [
            8_192,
            10_240,
            12_288,
            14_336,
        ],  # the peak reserved and three limits evenly below it, above allocated
        [12_698, 13_108, 13_518, 13_928],  # (12,288, 14,336) split in five, rounded up to 2 MiB
        [12_780, 12_862, 12_944, 13_026],  # (12,698, 13,108) split in five: 82 / 12,944 = 0.6 % <= 1.5 %
    ]
    f = found(trials)
    assert (f.max_failing_bytes, f.min_passing_bytes) == (12_944 * MIB, 13_026 * MIB)
    assert outcome(trials, p) == "found"


@pytest.mark.parametrize("threshold_mib", [3_001, 7_777, 14_335, 14_336, 19_999])
@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_any_threshold_is_bracketed_within_the_resolution(threshold_mib, k):
    threshold = threshold_mib * MIB
    p = Params(first_limit=20 * GIB, max_limit=75 * GIB, k=k)
    trials, rounds = search_all(oracle(threshold, 2 * GIB, 14 * GIB), p)
    f = found(trials)
    assert f.max_failing_bytes is None or f.max_failing_bytes < threshold
    assert threshold <= f.min_passing_bytes <= threshold * 1.015
    assert all(len(r) <= k for r in rounds)
    assert len({t.limit_bytes for t in trials}) == len(trials)  # no limit is run twice


def test_a_failure_at_the_peak_reserved_widens_above_it():
    # the run reserved 14 GiB unconstrained but needs 15,000 MiB under a limit (non-deterministic stream)
    p = Params(first_limit=20 * GIB, max_limit=75 * GIB)
    trials, rounds = search_all(oracle(15_000 * MIB, 6 * GIB, 14 * GIB), p)
    assert rounds[1][-1] == 14 * GIB  # tried first, and failed
    assert all(x > 14 * GIB for x in rounds[2])  # the next round lies between it and the baseline's 20 GiB
    assert 15_000 * MIB <= found(trials).min_passing_bytes <= 15_000 * MIB * 1.015


def test_a_failing_baseline_is_retried_higher_and_a_card_too_small_is_no_fit():
    p = Params(first_limit=10 * GIB, max_limit=24 * GIB)
    assert next_limits([], p) == [10 * GIB]
    assert next_limits([Trial(10 * GIB, "oom")], p) == [15 * GIB]
    assert next_limits([Trial(10 * GIB, "oom"), Trial(15 * GIB, "oom")], p) == [22.5 * GIB]
    failed = [Trial(10 * GIB, "oom"), Trial(15 * GIB, "oom"), Trial(int(22.5 * GIB), "oom")]
    assert next_limits(failed, p) == [24 * GIB]  # 33.75 GiB, held at max_limit
    gone = [*failed, Trial(24 * GIB, "oom")]
    assert next_limits(gone, p) == [] and outcome(gone, p) == "no-fit"


def test_a_failure_above_a_pass_keeps_the_answer_above_every_failure():
    trials = [Trial(16 * GIB, "ok", 5 * GIB, 9 * GIB), Trial(10 * GIB, "ok"), Trial(12 * GIB, "oom")]
    b = bracket(trials)
    assert (b.lo, b.hi) == (12 * GIB, 16 * GIB)


def test_errors_bound_nothing():
    trials = [Trial(16 * GIB, "ok", 5 * GIB, 9 * GIB), Trial(8 * GIB, "error")]
    assert (bracket(trials).lo, bracket(trials).hi) == (5 * GIB - 1, 16 * GIB)
