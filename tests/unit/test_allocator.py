"""The caching allocator's replay against cases worked by hand from CUDACachingAllocator.cpp's rules."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.simulator.allocator import allocation_size, replay, round_size

MIB = 1 << 20


def test_sizes_round_to_512_bytes_and_segments_by_pool():
    assert [round_size(n) for n in (1, 512, 513, 3 * MIB + 1)] == [512, 512, 1024, 3 * MIB + 512]
    assert [allocation_size(n) for n in (512, MIB, MIB + 512, 10 * MIB - 512, 10 * MIB, 11 * MIB)] == [
        2 * MIB,  # the small pool's 2 MiB segment
        2 * MIB,
        20 * MIB,  # 1-10 MiB: a 20 MiB segment to split
        20 * MIB,
        10 * MIB,  # 10 MiB and over: rounded up to 2 MiB
        12 * MIB,
    ]


def test_a_3_mib_request_reserves_a_20_mib_segment_and_a_small_one_2_mib():
    r = replay([3 * MIB])
    assert (r.allocated_peak, r.reserved_peak, r.segments) == (3 * MIB, 20 * MIB, (20 * MIB,))
    r = replay([1000, 1000])  # both in one 2 MiB small segment, each rounded to 1,024 B
    assert (r.allocated_peak, r.reserved_peak, r.requested_peak) == (2048, 2 * MIB, 2000)


def test_a_rest_of_1_mib_or_less_is_not_split_off_and_counts_as_allocated():
    r = replay([11 * MIB + 1])  # 11 MiB + 512 in a 12 MiB segment: the 1 MiB - 512 rest stays with it
    assert (r.allocated_peak, r.reserved_peak) == (12 * MIB, 12 * MIB)


def test_a_freed_segment_too_small_for_a_larger_request_is_kept_and_another_reserved():
    r = replay([12 * MIB, ~0, 14 * MIB])
    assert (r.allocated_peak, r.reserved_peak, r.segments) == (14 * MIB, 26 * MIB, (12 * MIB, 14 * MIB))


def test_a_larger_cached_block_is_split_for_a_smaller_request_and_its_rest_reused():
    r = replay([40 * MIB, ~0, 30 * MIB, 10 * MIB])
    assert (r.allocated_peak, r.reserved_peak) == (40 * MIB, 40 * MIB)


def test_best_fit_takes_the_smallest_cached_block_that_holds_the_request():
    # 24 and 40 MiB cached; 22 MiB takes the 24 (its 2 MiB rest splits off), so 36 MiB fits the 40
    r = replay([24 * MIB, 40 * MIB, ~0, ~1, 22 * MIB, 36 * MIB])
    assert r.reserved_peak == 64 * MIB


def test_freed_neighbours_coalesce_into_the_whole_segment():
    # two 3 MiB blocks of one 20 MiB segment, freed, merge back: a 19 MiB request fits in it
    r = replay([3 * MIB, 3 * MIB, ~0, ~1, 19 * MIB])
    assert r.reserved_peak == 20 * MIB
    r = replay([3 * MIB, 3 * MIB, ~0, 19 * MIB])  # the second still held: no room, a new segment
    assert r.reserved_peak == 20 * MIB + 20 * MIB


def test_a_block_freed_on_one_stream_is_not_reused_on_another():
    assert replay([30 * MIB, ~0, 30 * MIB], streams=[1, 1, 0]).reserved_peak == 60 * MIB
    assert replay([30 * MIB, ~0, 30 * MIB], streams=[1, 1, 1]).reserved_peak == 30 * MIB


def test_max_split_size_keeps_oversize_blocks_from_smaller_requests():
    mss = 16 * MIB
    assert replay([40 * MIB, ~0, 8 * MIB], max_split_size=mss).reserved_peak == 40 * MIB + 20 * MIB
    assert replay([40 * MIB, ~0, 8 * MIB]).reserved_peak == 40 * MIB  # the default: split and reused
    # an oversize request takes an oversize block less than kLargeBuffer larger, unsplit
    r = replay([40 * MIB, ~0, 30 * MIB], max_split_size=mss)
    assert (r.reserved_peak, r.allocated_peak) == (40 * MIB, 40 * MIB)
    assert replay([60 * MIB, ~0, 30 * MIB], max_split_size=mss).reserved_peak == 90 * MIB


def test_expandable_segments_reserve_the_rounded_sum_in_one_segment_per_pool():
    events = [3 * MIB, 5 * MIB, 30 * MIB]
    r = replay(events, expandable_segments=True)  # 38 MiB mapped in 20 MiB pages of the large pool
    assert (r.reserved_peak, r.segments) == (40 * MIB, (40 * MIB,))
    assert replay(events).reserved_peak == 20 * MIB + 30 * MIB  # 3 and 5 share a 20 MiB segment
    # a freed end block grows into the next pages; the small pool maps 2 MiB pages
    r = replay([12 * MIB, ~0, 30 * MIB, 1000, 1000], expandable_segments=True)
    assert r.segments == (40 * MIB, 2 * MIB) and r.reserved_peak == 42 * MIB


def test_expandable_segments_prefer_a_cached_block_to_the_growable_end():
    # 10 MiB free inside (between two held blocks) and a free end block of 12 MiB: 8 MiB takes the
    # inside one, so the later 12 MiB request still fits at the end without mapping more
    events = [10 * MIB, 2 * MIB, 28 * MIB, ~2, ~0, 8 * MIB, 28 * MIB]
    r = replay(events, expandable_segments=True)
    assert r.reserved_peak == 40 * MIB


def test_zero_byte_allocations_take_nothing():
    r = replay([0, ~0, 0])
    assert (r.allocated_peak, r.reserved_peak, r.segments) == (0, 0, ())


@st.composite
def traces(draw):
    sizes = st.one_of(st.integers(0, 4 * MIB), st.integers(4 * MIB, 64 * MIB))
    events, live = [], []
    for _ in range(draw(st.integers(1, 20))):
        if live and draw(st.booleans()):
            events.append(~live.pop(draw(st.integers(0, len(live) - 1))))
        else:
            live.append(sum(e >= 0 for e in events))
            events.append(draw(sizes))
    return events


@settings(max_examples=25, deadline=None, derandomize=True)
@given(traces(), st.booleans())
def test_requested_allocated_and_reserved_are_ordered_and_segments_sum_to_the_reserve(events, expandable):
    r = replay(events, expandable_segments=expandable)
    assert r.requested_peak <= r.allocated_peak <= r.reserved_peak == sum(r.segments)
    page = 2 * MIB
    assert all(s % page == 0 for s in r.segments)
    # no segment is reserved while a cached block of its pool could hold the request: with every
    # allocation freed before the next, one segment per pool serves a trace of one size at a time
    single = [e for i, e in enumerate(events) if e > 0][:1]
    if single:
        again = replay([single[0], ~0, single[0], ~1, single[0], ~2], expandable_segments=expandable)
        assert again.reserved_peak == replay(single, expandable_segments=expandable).reserved_peak
