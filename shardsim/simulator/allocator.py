"""PyTorch's CUDA caching allocator, replayed: a trace of allocations and frees in, the allocated
and reserved peaks (`torch.cuda.max_memory_allocated`, `max_memory_reserved`) and the segments out.

Modelled from c10/cuda/CUDACachingAllocator.cpp (`DeviceCachingAllocator`); each constant and rule
is named where it is used. What is left out, named: the device has room for every segment (no
out-of-memory retry, so `release_available_cached_blocks` and `release_cached_blocks` never run and
cached segments are kept, as without `empty_cache`); no cross-stream uses (`record_stream` events);
no CUDA-graph private pools; `roundup_power2_divisions` and `garbage_collection_threshold` unset (the
defaults). cudaMalloc's addresses, which only break ties between free blocks of one size, are taken
to increase with each new segment.

A trace is a sequence of ints: a size >= 0 allocates that many bytes (the allocation's id is the
count of allocations before it), `~i` (that is, -1 - i) frees allocation `i`. `streams`, parallel
to the events, says on which stream each allocation is made (default: all on one). A replay
can resume from the pools an earlier part of a trace left (`Pools`, `advance`): the same result
as replaying the whole trace."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Sequence
from copy import copy
from dataclasses import dataclass, field

K_MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is rounded up to a multiple of 512 B
K_SMALL_SIZE = 1 << 20  # kSmallSize: the largest request of the small pool (1 MiB)
K_SMALL_BUFFER = 2 << 20  # kSmallBuffer: small requests are packed in 2 MiB segments
K_MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: requests under 10 MiB take a kLargeBuffer segment
K_LARGE_BUFFER = 20 << 20  # kLargeBuffer: the 20 MiB segment of a 1-10 MiB request
K_ROUND_LARGE = 2 << 20  # kRoundLarge: larger requests get a segment rounded up to 2 MiB
NO_SPLIT_LIMIT = (1 << 64) - 1  # max_split_size's default (SIZE_MAX): every block may split
# expandable_segments:True maps physical memory into one growing segment per pool and stream, in
# pages of kSmallBuffer for the small pool and kLargeBuffer for the large one (find_expandable_block)


def round_size(size: int) -> int:
    """`round_size`: a request rounded up to kMinBlockSize (at least one block of it)."""
    return K_MIN_BLOCK_SIZE if size < K_MIN_BLOCK_SIZE else -(-size // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """`get_allocation_size`: the segment cudaMalloc'd for a rounded request no cached block holds."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-size // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass(frozen=True)
class Replay:
    """What a trace leaves: the peaks the allocator's statistics report (bytes) and its segments."""

    allocated_peak: int  # allocated_bytes' peak: the blocks handed out, rounding and unsplit rests included
    reserved_peak: int  # reserved_bytes' peak: every segment cudaMalloc'd or mapped (none released)
    requested_peak: int  # requested_bytes' peak: the sizes asked for, before rounding
    segments: tuple[int, ...]  # each segment's size, in the order they were reserved


@dataclass
class Pools:
    """The allocator's state between two events (what `replay` resumes from, `Pools.copy`). Blocks,
    by id, are parallel lists (no object per block); a block belongs to one segment of one pool and
    stream (`pool_of`: 2 x stream, + 1 for the small pool); `prev` / `nxt` link the blocks split
    from one segment (-1: none). A pool's free blocks are a sorted list of size << 64 | address
    (BlockComparatorSize's order: best fit first), `at` their ids by that key."""

    size: list[int] = field(default_factory=list)
    ptr: list[int] = field(default_factory=list)
    prev: list[int] = field(default_factory=list)
    nxt: list[int] = field(default_factory=list)
    used: list[bool] = field(default_factory=list)
    pool_of: list[int] = field(default_factory=list)
    free: dict[int, list[int]] = field(default_factory=dict)
    at: dict[int, int] = field(default_factory=dict)
    tail: dict[int, int] = field(default_factory=dict)  # expandable: the block at the mapped end of each pool's segment
    segment_of: dict[int, int] = field(default_factory=dict)  # expandable: each pool's index in `segments`
    block_of: list[int] = field(default_factory=list)  # allocation id -> block id (-1: a zero-size allocation)
    asked: list[int] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    next_ptr: int = 0
    allocated: int = 0
    reserved: int = 0
    requested: int = 0
    allocated_peak: int = 0
    requested_peak: int = 0

    def copy(self) -> Pools:
        """An independent copy (its lists and the free lists in `free` copied)."""
        c = copy(self)
        for name in ("size", "ptr", "prev", "nxt", "used", "pool_of", "block_of", "asked", "segments"):
            setattr(c, name, getattr(self, name).copy())
        c.free = {k: v.copy() for k, v in self.free.items()}
        c.at, c.tail, c.segment_of = self.at.copy(), self.tail.copy(), self.segment_of.copy()
        return c

    def result(self) -> Replay:
        return Replay(self.allocated_peak, self.reserved, self.requested_peak, tuple(self.segments))


def replay(
    events: Sequence[int],
    streams: Sequence[int] | None = None,
    *,
    expandable_segments: bool = False,
    max_split_size: int = NO_SPLIT_LIMIT,
    start: Pools | None = None,
) -> Replay:
    """Replay `events` (see the module's docstring) through the caching allocator, from empty pools
    or from `start` (left as it is: a state `advance` reached on the events before these)."""
    pools = Pools() if start is None else start.copy()
    advance(pools, events, streams, expandable_segments=expandable_segments, max_split_size=max_split_size)
    return pools.result()


def advance(
    pools: Pools,
    events: Sequence[int],
    streams: Sequence[int] | None = None,
    *,
    expandable_segments: bool = False,
    max_split_size: int = NO_SPLIT_LIMIT,
) -> Pools:
    """Run `events` through the allocator in state `pools` (changed in place; returned)."""
    size, ptr, prev, nxt, used, pool_of = pools.size, pools.ptr, pools.prev, pools.nxt, pools.used, pools.pool_of
    free, at, tail, segment_of = pools.free, pools.at, pools.tail, pools.segment_of
    block_of, asked, segments = pools.block_of, pools.asked, pools.segments
    next_ptr = pools.next_ptr
    allocated, reserved, requested = pools.allocated, pools.reserved, pools.requested
    allocated_peak, requested_peak = pools.allocated_peak, pools.requested_peak
    shift = 64
    stream_of = streams if streams is not None else [0] * len(events)

    for ev, stream in zip(events, stream_of, strict=True):
        if ev >= 0:
            asked.append(ev)
            if ev == 0:  # NativeCachingAllocator::allocate hands out no memory for zero bytes
                block_of.append(-1)
                continue
            n = K_MIN_BLOCK_SIZE if ev < K_MIN_BLOCK_SIZE else -(-ev // K_MIN_BLOCK_SIZE) * K_MIN_BLOCK_SIZE
            small = n <= K_SMALL_SIZE  # get_pool: kSmallSize and under go to the small pool
            key = 2 * stream + small
            lst = free.get(key)
            if lst is None:
                lst = free[key] = []
            # get_free_block: the smallest cached block of this pool and stream that holds the
            # request (BlockComparatorSize orders by size, then address)
            j = bisect_left(lst, n << shift)
            if expandable_segments and j + 1 < len(lst) and at[lst[j]] == tail.get(key):
                # the end block counts as the size it can grow to (its size and the unmapped address
                # space after it): any other block that holds the request fits better
                j += 1
            b = -1
            if j < len(lst):
                found = lst[j] >> shift
                # max_split_size: an oversize block serves no smaller request, nor a request it
                # exceeds by kLargeBuffer or more
                if not (n < max_split_size <= found) and not (n >= max_split_size and found >= n + K_LARGE_BUFFER):
                    b = at.pop(lst.pop(j))
            if b < 0 and expandable_segments:
                # try_allocate_expandable_block: map pages at the segment's end, joining a free end block
                page = K_SMALL_BUFFER if small else K_LARGE_BUFFER
                t = tail.get(key, -1)
                if t >= 0 and not used[t]:
                    k = size[t] << shift | ptr[t]
                    del lst[bisect_left(lst, k)]
                    del at[k]
                    grow = -(-(n - size[t]) // page) * page
                    size[t] += grow
                    b = t
                else:
                    grow = -(-n // page) * page
                    if t < 0:
                        segment_of[key] = len(segments)
                        segments.append(0)
                    b = len(size)
                    size.append(grow)
                    ptr.append(len(segment_of) << 48 if t < 0 else ptr[t] + size[t])
                    prev.append(t)
                    nxt.append(-1)
                    used.append(False)
                    pool_of.append(key)
                    if t >= 0:
                        nxt[t] = b
                    tail[key] = b
                reserved += grow
                segments[segment_of[key]] += grow
            elif b < 0:  # alloc_block: cudaMalloc a new segment of get_allocation_size
                seg = allocation_size(n)
                b = len(size)
                size.append(seg)
                ptr.append(next_ptr)
                prev.append(-1)
                nxt.append(-1)
                used.append(False)
                pool_of.append(key)
                next_ptr += seg
                reserved += seg
                segments.append(seg)
            rest = size[b] - n
            # should_split: the small pool (and every expandable segment) splits a rest of at least
            # kMinBlockSize; the large pool only a rest over kSmallSize, of a request under max_split_size
            if small or expandable_segments:
                split = rest >= K_MIN_BLOCK_SIZE
            else:
                split = n < max_split_size and rest > K_SMALL_SIZE
            if split:  # alloc_found_block: the request takes the front, the rest stays cached
                front = len(size)
                size.append(n)
                ptr.append(ptr[b])
                prev.append(prev[b])
                nxt.append(b)
                used.append(False)
                pool_of.append(key)
                if prev[b] >= 0:
                    nxt[prev[b]] = front
                prev[b] = front
                ptr[b] += n
                size[b] = rest
                k = rest << shift | ptr[b]
                insort(lst, k)
                at[k] = b
                b = front
            used[b] = True
            block_of.append(b)
            allocated += size[b]
            requested += ev
            if allocated > allocated_peak:
                allocated_peak = allocated
            if requested > requested_peak:
                requested_peak = requested
        else:
            a = ~ev
            b = block_of[a]
            if b < 0:
                continue
            used[b] = False
            allocated -= size[b]
            requested -= asked[a]
            key = pool_of[b]
            lst = free[key]
            # free_block: merge with free neighbours split from the same segment (try_merge_blocks)
            p = prev[b]
            if p >= 0 and not used[p]:
                k = size[p] << shift | ptr[p]
                del lst[bisect_left(lst, k)]
                del at[k]
                ptr[b] = ptr[p]
                size[b] += size[p]
                prev[b] = prev[p]
                if prev[b] >= 0:
                    nxt[prev[b]] = b
            q = nxt[b]
            if q >= 0 and not used[q]:
                k = size[q] << shift | ptr[q]
                del lst[bisect_left(lst, k)]
                del at[k]
                size[b] += size[q]
                nxt[b] = nxt[q]
                if nxt[b] >= 0:
                    prev[nxt[b]] = b
                if tail.get(key) == q:
                    tail[key] = b
            k = size[b] << shift | ptr[b]
            insort(lst, k)
            at[k] = b
    pools.next_ptr = next_ptr
    pools.allocated, pools.reserved, pools.requested = allocated, reserved, requested
    pools.allocated_peak, pools.requested_peak = allocated_peak, requested_peak
    return pools
