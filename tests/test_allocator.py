"""Hand-worked event sequences for the caching-allocator model (estimator/hardware/allocator.py).

Each test names the rule of c10/cuda/CUDACachingAllocator.cpp it checks; the expected bytes are worked out by
hand in the comments from that rule (1 MiB = 1048576 B), never by calling the code under test.
"""

from __future__ import annotations

import pytest

from estimator.hardware.allocator import (
    AllocatorSettings,
    CachingAllocator,
    dump_stream,
    load_stream,
    roundup_power2_next_division,
    simulate,
)

M = 1024**2
K = 1024


def test_round_size_minimum_512_bytes():
    # round_size: 1 B -> 512 B (kMinBlockSize); small pool -> one 2 MiB segment (kSmallBuffer).
    r = simulate([("a", 1, 1)])
    assert r.peak_allocated == 512
    assert r.peak_reserved == 2 * M


def test_round_size_multiple_of_512():
    # round_size: 513 B -> 1024 B; 1537 B -> 2048 B. Both in the same 2 MiB small segment.
    r = simulate([("a", 1, 513), ("a", 2, 1537)])
    assert r.peak_allocated == 1024 + 2048
    assert r.peak_reserved == 2 * M


def test_small_pool_packs_2mib_segments():
    # get_allocation_size: <= 1 MiB -> 2 MiB segment; should_split (small): remainder >= 512 B is split.
    # 4 x 512 KiB fill one 2 MiB segment exactly; the 5th needs a second one: 4 MiB reserved.
    ev = [("a", i, 512 * K) for i in range(5)]
    r = simulate(ev)
    assert r.peak_reserved == 4 * M
    assert r.peak_allocated == 5 * 512 * K


def test_pool_boundary_at_1mib():
    # get_pool: exactly 1 MiB is small (2 MiB segment); 1 MiB + 1 B rounds to 1 MiB + 512 B -> large pool,
    # get_allocation_size < 10 MiB -> a 20 MiB segment. Reserved 2 + 20 = 22 MiB.
    r = simulate([("a", 1, M), ("a", 2, M + 1)])
    assert r.peak_reserved == 22 * M


def test_large_request_under_10mib_gets_20mib_segment_and_is_split():
    # get_allocation_size: 9 MiB -> 20 MiB; should_split (large): remainder 11 MiB > 1 MiB -> split.
    # Second 9 MiB is served from the 11 MiB remainder (remainder 2 MiB > 1 MiB, split again): 20 MiB reserved.
    r = simulate([("a", 1, 9 * M), ("a", 2, 9 * M)])
    assert r.peak_reserved == 20 * M
    assert r.peak_allocated == 18 * M


def test_large_request_rounded_to_2mib_and_unsplit_remainder_counts_as_allocated():
    # get_allocation_size: 11 MiB + 1 B -> rounds to 11 MiB + 512 B -> segment ceil to 2 MiB = 12 MiB.
    # should_split (large): remainder 1 MiB - 512 B is not > 1 MiB -> the whole 12 MiB block is handed out,
    # and allocated_bytes counts block->size: 12 MiB.
    r = simulate([("a", 1, 11 * M + 1)])
    assert r.peak_reserved == 12 * M
    assert r.peak_allocated == 12 * M


def test_large_split_needs_remainder_over_1mib():
    # should_split (large): 19 MiB -> 20 MiB segment, remainder exactly 1 MiB is not > 1 MiB: not split,
    # so a following 1 MiB + 512 B large request cannot use it and opens a new 20 MiB segment: 40 MiB.
    r = simulate([("a", 1, 19 * M), ("a", 2, M + 512)])
    assert r.peak_reserved == 40 * M
    assert r.peak_allocated == 20 * M + M + 512


def test_best_fit_picks_smallest_cached_block():
    # get_free_block: lower_bound on size = best fit. Cached 12 MiB and 14 MiB segments; a 12 MiB request
    # takes the 12 MiB one, so the 14 MiB request still fits the 14 MiB one: reserved stays 26 MiB.
    # (A worst fit would split the 14 into 12 + 2 and need a new 14 MiB segment: 40 MiB.)
    ev = [("a", 1, 12 * M), ("a", 2, 14 * M), ("f", 1), ("f", 2), ("a", 3, 12 * M), ("a", 4, 14 * M)]
    r = simulate(ev)
    assert r.peak_reserved == 26 * M


def test_free_merges_neighbours():
    # free_block / try_merge_blocks: 20 MiB segment split into A=5, B=5, C=5, rest=5 (MiB).
    # Free A, free B -> A+B merge into one 10 MiB free block. A 9 MiB request fits it (remainder 1 MiB
    # not > 1 MiB: handed out whole, 10 MiB allocated). No new segment: 20 MiB reserved; allocated 5 + 10.
    ev = [("a", 1, 5 * M), ("a", 2, 5 * M), ("a", 3, 5 * M), ("f", 1), ("f", 2), ("a", 4, 9 * M)]
    a = CachingAllocator()
    for e in ev:
        a.malloc(e[1], e[2]) if e[0] == "a" else a.free(e[1])
    assert a.reserved == 20 * M
    assert a.allocated == 15 * M


def test_blocks_are_per_stream():
    # get_free_block: a cached block is reused only on its own stream (BlockComparatorSize orders by stream).
    # 12 MiB freed on stream 0, 12 MiB requested on stream 1 -> second segment: 24 MiB.
    r = simulate([("a", 1, 12 * M, 0), ("f", 1), ("a", 2, 12 * M, 1)])
    assert r.peak_reserved == 24 * M


def test_empty_cache_releases_only_unsplit_segments():
    # release_cached_blocks / release_blocks: only blocks with no prev/next (whole segments) are cudaFree'd.
    # A = 12 MiB (own 12 MiB segment), B = 5 MiB (split from a 20 MiB segment). Free A, empty_cache:
    # 32 -> 20 MiB (the 20 MiB segment is split while B lives). Free B (merges back whole), empty_cache: 0.
    a = CachingAllocator()
    a.malloc(1, 12 * M)
    a.malloc(2, 5 * M)
    assert a.reserved == 32 * M
    a.free(1)
    a.empty_cache()
    assert a.reserved == 20 * M
    a.free(2)
    a.empty_cache()
    assert a.reserved == 0


def test_failed_cudamalloc_frees_cached_blocks_and_retries():
    # malloc: alloc_block fails (30 + 20 > 40 MiB limit) -> release_available_cached_blocks is a no-op
    # without max_split_size -> release_cached_blocks frees the cached 30 MiB (stream 1) -> retry succeeds.
    # Peak reserved 30 MiB, no OOM, one retry.
    s = AllocatorSettings(device_limit=40 * M)
    r = simulate([("a", 1, 30 * M, 1), ("f", 1), ("a", 2, 20 * M, 0)], s)
    assert not r.oom
    assert r.retries == 1
    assert r.peak_reserved == 30 * M


def test_out_of_memory_when_nothing_cached():
    # malloc: 30 MiB live, 20 MiB more would need 50 MiB > 40 MiB limit, nothing cached to free -> OOM at
    # event 2; the replay goes on unlimited, so peak reserved says what the run needed: 50 MiB.
    s = AllocatorSettings(device_limit=40 * M)
    r = simulate([("a", 1, 30 * M), ("a", 2, 20 * M)], s)
    assert r.oom and r.oom_event == 2 and r.oom_request == 20 * M
    assert r.peak_reserved == 50 * M


def test_max_split_size_oversize_block_does_not_serve_small_request():
    # get_free_block: request 30 MiB < max_split_size 40 MiB and the cached block 60 MiB >= 40 MiB -> not used;
    # new 30 MiB segment: 90 MiB. Without max_split_size the 60 MiB block is split: 60 MiB.
    ev = [("a", 1, 60 * M), ("f", 1), ("a", 2, 30 * M)]
    assert simulate(ev, AllocatorSettings.from_conf("max_split_size_mb:40")).peak_reserved == 90 * M
    assert simulate(ev).peak_reserved == 60 * M


def test_max_split_size_oversize_request_rounding_limit():
    # get_free_block with max_split_size 40 MiB: an oversize request may take a cached oversize block less than
    # max_non_split_rounding (20 MiB) larger. 50 MiB into the cached 60 MiB: 60 < 70, served whole
    # (should_split: size >= max_split_size -> no split), allocated 60 MiB, reserved 60 MiB.
    # 50 MiB into a cached 100 MiB: 100 >= 70 -> refused, new 50 MiB segment: 150 MiB.
    s = AllocatorSettings.from_conf("max_split_size_mb:40")
    r = simulate([("a", 1, 60 * M), ("f", 1), ("a", 2, 50 * M)], s)
    assert (r.peak_reserved, r.peak_allocated) == (60 * M, 60 * M)
    r = simulate([("a", 1, 100 * M), ("f", 1), ("a", 2, 50 * M)], s)
    assert r.peak_reserved == 150 * M


def test_release_available_cached_blocks_frees_one_oversize_block():
    # max_split_size 40 MiB, limit 100 MiB. Cached 70 MiB can't serve 45 MiB (70 >= 45 + 20). New segment
    # 46 MiB (45 rounded up to 2 MiB) would need 116 > 100 -> release_available_cached_blocks frees the
    # smallest cached block >= max(45, 40) MiB = the 70 MiB one -> alloc_block succeeds (not a "retry").
    a = CachingAllocator(AllocatorSettings.from_conf("max_split_size_mb:40", device_limit=100 * M))
    a.malloc(1, 70 * M)
    a.free(1)
    assert a.malloc(2, 45 * M)
    assert a.reserved == 46 * M
    assert a.retries == 0


def test_roundup_power2_divisions():
    # roundup_power2_next_division: the docstring's example in the .cpp, 1200 with 4 divisions -> 1280;
    # round_size with divisions 4: 5 MiB + 1 B lies in [4, 8) MiB, steps of 1 MiB -> 6 MiB, carved from a
    # 20 MiB segment (remainder 14 MiB split): allocated 6 MiB.
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(4096, 4) == 4096
    s = AllocatorSettings.from_conf("roundup_power2_divisions:4")
    r = simulate([("a", 1, 5 * M + 1)], s)
    assert r.peak_allocated == 6 * M
    assert r.peak_reserved == 20 * M
    # round_size: size <= 512 x divisions keeps the 512 B rounding: 1200 B -> 1536 B
    assert simulate([("a", 1, 1200)], s).peak_allocated == 1536


def test_expandable_segments_map_20mib_pages_and_reuse_the_tail():
    # try_allocate_expandable_block / map_block: 25 MiB maps ceil(25/20) = 2 large pages = 40 MiB; the 15 MiB
    # tail is split off (should_split with expandable: remainder >= 512 B) and serves a 15 MiB request.
    # Reserved 40 MiB. Default allocator: 26 MiB + 16 MiB segments = 42 MiB.
    ev = [("a", 1, 25 * M), ("a", 2, 15 * M)]
    assert simulate(ev, AllocatorSettings(expandable_segments=True)).peak_reserved == 40 * M
    assert simulate(ev).peak_reserved == 42 * M


def test_expandable_segments_grow_from_free_tail():
    # find_expandable_block: the free mapped block before the unmapped range is part of the candidate.
    # 12 MiB: maps 20 (12 used, 8 free). 12 MiB: 8 free + map one more page -> 28 free, 12 used, 16 left.
    # 12 MiB: from the 16 left. Reserved 40 MiB; allocated 36 MiB.
    ev = [("a", i, 12 * M) for i in range(3)]
    r = simulate(ev, AllocatorSettings(expandable_segments=True))
    assert r.peak_reserved == 40 * M
    assert r.peak_allocated == 36 * M


def test_expandable_segments_empty_cache_unmaps_whole_free_pages():
    # unmap_block: A = 5 MiB maps page [0, 20); B = 30 MiB maps page [20, 40), B = [5, 35), free [35, 40).
    # Free B: merges with [35, 40) -> free [5, 40). empty_cache unmaps the whole pages inside it: [20, 40).
    # Reserved 40 -> 20 MiB ([0, 20) stays: A lives there).
    a = CachingAllocator(AllocatorSettings(expandable_segments=True))
    a.malloc(1, 5 * M)
    a.malloc(2, 30 * M)
    assert a.reserved == 40 * M
    a.free(2)
    a.empty_cache()
    assert a.reserved == 20 * M
    a.free(1)
    a.empty_cache()
    assert a.reserved == 0


def test_expandable_small_pool_uses_2mib_pages():
    # ExpandableSegment: 2 MiB pages for the small pool. 512 KiB -> one 2 MiB page; 5 x 512 KiB -> 2 pages.
    s = AllocatorSettings(expandable_segments=True)
    assert simulate([("a", i, 512 * K) for i in range(5)], s).peak_reserved == 4 * M


def test_phase_marks_and_peak_label():
    # Peaks are attributed to the last mark before them: 12 MiB in "gen", +14 MiB in "train" -> peak 26 MiB
    # in "train"; "gen" peaked at 12 MiB.
    ev = [("m", "gen"), ("a", 1, 12 * M), ("m", "train"), ("a", 2, 14 * M)]
    r = simulate(ev)
    assert r.peak_label == "train"
    assert r.phase_peaks["gen"] == [12 * M, 12 * M]
    assert r.phase_peaks["train"] == [26 * M, 26 * M]


def test_stream_round_trip(tmp_path):
    ev = [("m", "generate step 1"), ("a", 1, 12345, 0), ("a", 2, 7, 3), ("f", 1), ("e",), ("f", 2)]
    p = tmp_path / "s.txt.gz"
    dump_stream(ev, p)
    assert load_stream(p) == ev


def test_bad_events_are_named():
    with pytest.raises(ValueError, match="event 2: free of id 9"):
        simulate([("a", 1, 10), ("f", 9)])
    with pytest.raises(ValueError, match="max_split_size_mb=10"):
        AllocatorSettings.from_conf("max_split_size_mb:10")


def test_conf_parsing():
    s = AllocatorSettings.from_conf(
        "expandable_segments:True,max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4]"
    )
    assert s.expandable_segments and s.max_split_size == 128 * M
    # intervals: index = log2(MiB) ; 256 MiB -> 8, 512 MiB -> 9, ">" fills 10..15
    assert s.roundup_power2_divisions[8] == 1 and s.roundup_power2_divisions[9] == 2
    assert s.roundup_power2_divisions[10:] == (4,) * 6


def test_torch_empty_cache_steps_releases_the_cache_after_the_loss():
    # Trainer.training_step: empty_cache() after compute_loss when global_step % N == 0.
    # Step: 30 MiB transient freed before the loss, then 20 MiB on another stream (no reuse across streams).
    # Without emptying: 30 + 20 = 50 MiB reserved. With N=1 the cached 30 MiB segment is released at the
    # loss point first: peak 30 MiB.
    from estimator.hardware.allocator import with_empty_cache_steps

    ev = [
        ("m", "generate"),
        ("a", 1, 30 * M, 0),
        ("f", 1),
        ("m", "train"),
        ("x", "loss"),
        ("a", 2, 20 * M, 1),
    ]
    assert simulate(ev).peak_reserved == 50 * M
    assert simulate(with_empty_cache_steps(ev, 1)).peak_reserved == 30 * M


def test_free_at_peak_by_kind():
    # At the peak of reserved (12 + 20 = 32 MiB): A's cached 12 MiB segment is whole (release_cached_blocks
    # could free it); the 20 MiB segment holds B = 5 MiB and a split-off free 15 MiB (large pool, split).
    r = simulate([("a", 1, 12 * M, 0), ("f", 1), ("a", 2, 5 * M, 1)])
    assert r.peak_reserved == 32 * M
    assert r.free_at_peak == {"small": 0, "large_split": 15 * M, "large_whole": 12 * M}


@pytest.mark.parametrize("expandable", [False, True])
def test_random_streams_return_every_byte(expandable):
    # free_block / try_merge_blocks / unmap_block: once every block is freed, merging must rebuild whole segments
    # (or whole free pages), so empty_cache returns reserved to 0; at every step allocated <= reserved and the
    # allocated total equals the sum of live blocks (>= the 512-rounded requests).
    import random

    rng = random.Random(7)
    sizes = [1, 700, 300 * K, M, M + 1, 3 * M, 9 * M, 12 * M + 5, 47 * M]
    for seed in range(20):
        rng.seed(seed)
        a = CachingAllocator(AllocatorSettings(expandable_segments=expandable))
        live, nid, requested = {}, 0, 0
        for _ in range(400):
            if live and rng.random() < 0.45:
                k = rng.choice(list(live))
                requested -= live.pop(k)
                a.free(k)
            else:
                nid += 1
                s = rng.choice(sizes) * rng.randint(1, 3)
                live[nid] = -(-s // 512) * 512
                requested += live[nid]
                a.malloc(nid, s, rng.choice([0, 0, 1]))
            assert requested <= a.allocated <= a.reserved
            if rng.random() < 0.02:
                a.empty_cache()
        for k in list(live):
            a.free(k)
        a.empty_cache()
        assert a.allocated == 0
        assert a.reserved == 0, (seed, expandable)


def test_step_peaks_show_fragmentation_building_across_steps():
    # Step 1: 12 MiB then freed (cached). Step 2: two 7 MiB requests: the first splits the cached 12 MiB segment
    # (remainder 5 MiB > 1 MiB), the second finds no 7 MiB block and opens a 20 MiB segment: 32 MiB reserved in
    # step 2 for 14 MiB allocated, against 12 MiB for 12 MiB in step 1.
    ev = [("m", "generate"), ("a", 1, 12 * M), ("f", 1), ("m", "generate"), ("a", 2, 7 * M), ("a", 3, 7 * M)]
    r = simulate(ev)
    assert r.step_peaks[1] == [12 * M, 12 * M]
    assert r.step_peaks[2] == [32 * M, 14 * M]


def test_min_device_limit_uses_release_and_retry():
    # malloc's retry: 30 MiB cached on stream 1, 20 MiB wanted on stream 0. Unlimited: 50 MiB reserved. With a
    # limit of 30 MiB or a little more, the cudaMalloc fails, release_cached_blocks frees the 30 MiB, the retry
    # succeeds: the card needs only the 30 MiB allocated peak (bisection to 1 MiB: within (30, 31] MiB).
    from estimator.hardware.allocator import min_device_limit

    ev = [("a", 1, 30 * M, 1), ("f", 1), ("a", 2, 20 * M, 0)]
    assert simulate(ev).peak_reserved == 50 * M
    lim, r = min_device_limit(ev, resolution=M)
    assert 30 * M < lim <= 31 * M
    assert not r.oom and r.retries == 1
