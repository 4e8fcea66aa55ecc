"""Time gloo collectives inside a node of an emulated cluster (run under torchrun there).

The ranks of one emulated node talk over loopback, and on this host that is no free link:
every byte is copied by the kernel on both sides, by processes that share a few cores with
every other rank. A TCP probe between two idle processes says gigabytes per second; what
FSDP2's intra-node all-gathers get is far less. So `shardsim profile` measures it as the
simulator uses it: all nodes' ranks all-gather within their node at once (as the partition
groups of ZeRO-2D do), at two sizes, and an alpha-beta fit of the ring all-gather gives the
loopback's achieved bandwidth per rank and its per-step latency. Every rank's process CPU time
over the largest all-gather over all ranks and over an all-reduce gives what moving a byte
costs the host's cores (the simulator charges it to the cores that compute shares). Every rank
alternating a little compute with a small all-reduce in its node gives what a call waits for
ranks the host's scheduler has not run yet (`_call_wait_s`).

    python -m torch.distributed.run ... -m shardsim.runtime.profile.linkbench OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from shardsim.core.files import atomic_write

SIZES = (64 * 1024, 8 * 1024 * 1024)  # bytes of the gathered (whole) array
REPEATS = 6
NIC_SIZES = (2 * 1024 * 1024, 16 * 1024 * 1024)  # the world ring: NIC-bound, so larger arrays
NIC_REPEATS = 2
# Every figure is the median of ROUNDS rounds (each `repeats` calls after a barrier): this
# shared host stalls now and then for a fraction of a second, and a stall inside a plain mean
# of a few calls counts whole (profiles of one day had the NIC 14 % apart).
ROUNDS = 5
# 2-rank groups across the NICs (`_pair_gather_Bps`): one call a round, and more rounds, since
# how two TCP pairs share a shaped NIC varies from call to call (18-22 MB/s of 23 on emu-2x2)
PAIR_SIZE = 8 * 1024 * 1024
PAIR_ROUNDS = 9
# The CPU an all-reduce costs (gloo's reduction on top of the moving): over every rank, this
# size, fewer rounds (process CPU time does not count a stall, so it needs no median).
REDUCE_SIZE = 4 * 1024 * 1024
REDUCE_ROUNDS = 2
# `_call_wait_s`: rounds of PACED_CALLS calls, each after PACED_MATMULS small matmuls (about 2 ms on
# a free core here: a tensor-parallel block's compute between two of its calls), of PACED_SIZE bytes
PACED_CALLS = 20
PACED_ROUNDS = 15
PACED_MATMULS = 100
PACED_SIZE = 32 * 1024


def _time(fn, repeats: int, rounds: int = ROUNDS) -> tuple[float, float]:
    """(seconds, CPU seconds) per call of `fn` (a collective): the median over `rounds` of the
    mean of `repeats` calls, and this process' CPU time over all of them per call. No barrier
    inside the timed span: its cost would count as latency."""
    import torch.distributed as dist

    fn()
    per_call, cpu = [], 0.0
    for _ in range(rounds):
        dist.barrier()  # all start together; a round ends when this rank's last call returns
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(repeats):
            fn()
        per_call.append((time.perf_counter() - t0) / repeats)
        cpu += time.process_time() - c0
    return statistics.median(per_call), cpu / (rounds * repeats)


def fit(k: int, sizes: tuple[int, int], times: tuple[float, float]) -> tuple[float, float]:
    """(bandwidth B/s, latency s per step) of a ring all-gather over k ranks from two timings:
    t(S) = (k-1)·alpha + (k-1)/k·S/B."""
    (s1, s2), (t1, t2) = sizes, times
    f = (k - 1) / k
    bw = f * (s2 - s1) / max(t2 - t1, 1e-9)
    alpha = max(t1 - f * s1 / bw, 0.0) / (k - 1)
    return bw, alpha


def _gather_time(size: int, k: int, group, repeats: int, rounds: int = ROUNDS) -> tuple[float, float]:
    """(seconds, this rank's CPU seconds) of one all-gather of `size` bytes (the whole array)
    over a group of `k` ranks."""
    import torch
    import torch.distributed as dist

    n = size // 4 // k
    shard, whole = torch.ones(n), torch.empty(n * k)
    return _time(lambda: dist.all_gather_into_tensor(whole, shard, group=group), repeats, rounds)


def _reduce_cpu(size: int, world: int) -> float:
    """This rank's CPU seconds per byte it sends in an all-reduce of `size` bytes over all ranks."""
    import torch
    import torch.distributed as dist

    x = torch.ones(size // 4)
    _, cpu = _time(lambda: dist.all_reduce(x), NIC_REPEATS, REDUCE_ROUNDS)
    return cpu / (2 * (world - 1) / world * size)


def _pair_gather_Bps(size: int, world: int, k: int) -> float | None:
    """Payload bytes/s one NIC sends while every rank all-gathers `size` bytes with the rank of
    the same local index on its partner node (nodes 0-1, 2-3, ...), all at once: the 2-rank
    groups that cross the NIC in a tensor-parallel layout's data-parallel dimension, timed
    until the slowest group is done (they share the NIC, not always evenly). None with fewer
    than two nodes. (gloo's ring over two ranks runs both ways on one TCP pair; on the shaped
    NICs it gets less of the link than a ring over more ranks does.)"""
    import torch
    import torch.distributed as dist

    nodes = world // k
    if nodes < 2:
        return None
    rank, mine = dist.get_rank(), None
    for m in range(0, nodes - 1, 2):
        for r in range(k):
            pair = [m * k + r, (m + 1) * k + r]
            group = dist.new_group(pair)  # every rank creates every group
            mine = group if rank in pair else mine
    if mine is None:  # a last, odd node: it idles through the rounds
        t = _time(lambda: None, 1, PAIR_ROUNDS)[0] * 0.0
    else:  # one call a round, as FSDP2's gathers come between a layer's compute on CPU
        t = _gather_time(size, 2, mine, 1, PAIR_ROUNDS)[0]
    slowest = torch.tensor([t], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return k * (size / 2) / float(slowest.item())  # k ranks of a node each send half the array across its NIC


def _call_wait_s(group, k: int) -> float:
    """Seconds a small collective waits, beyond its cost on an idle host, when every rank of the
    host alternates compute with calls in its node's group (as training does, most of all a
    tensor-parallel block): on a host whose ranks outnumber its cores a rank that reaches the
    call waits for its partners to be scheduled and reach it. Per call:
    (paced − work) with every rank at once, less the same with node 0's ranks alone (its call's
    own cost); each round times the four in turn (this host's speed moves within seconds, so
    a difference is taken within a round), the medians over PACED_ROUNDS rounds, the slowest
    rank's figures. 0 when a node has one rank (no group to call in)."""
    import torch
    import torch.distributed as dist

    if k < 2:
        return 0.0
    a, b = torch.randn(96, 96), torch.randn(96, 96)
    x = torch.ones(PACED_SIZE // 4)
    node0 = dist.get_rank() < k

    def work() -> None:
        for _ in range(PACED_MATMULS):
            a @ b

    def paced() -> None:
        work()
        dist.all_reduce(x, group=group)

    def timed(fn, member: bool = True) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(PACED_CALLS if member else 0):
            fn()
        return (time.perf_counter() - t0) / PACED_CALLS

    timed(paced)  # warm-up
    every, alone = [], []
    for _ in range(PACED_ROUNDS):
        every.append(timed(paced) - timed(work))
        alone.append(timed(paced, node0) - timed(work, node0))
    # the slowest rank's call with every rank paced, and node 0's slowest alone
    t = torch.tensor([statistics.median(every), statistics.median(alone) if node0 else 0.0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return max(0.0, float(t[0] - t[1]))


def _mean_over_ranks(v: float, world: int) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([v], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / world


def main(argv: list[str] | None = None) -> int:
    import os

    import torch
    import torch.distributed as dist

    out = (argv or sys.argv[1:])[0]
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    k = int(os.environ["LOCAL_WORLD_SIZE"])
    groups = [dist.new_group(list(range(n * k, (n + 1) * k))) for n in range(world // k)]
    mine = groups[rank // k]
    local = [_gather_time(size, k, mine, REPEATS) for size in SIZES]
    times = [t for t, _ in local]
    ring_cpu = [_gather_time(size, world, None, NIC_REPEATS) for size in NIC_SIZES] if world > k else []
    ring = [t for t, _ in ring_cpu]
    # CPU per byte a rank sends: the largest all-gather over every rank, and an all-reduce
    n, (_, gather_cpu) = (world, ring_cpu[-1]) if ring_cpu else (k, local[-1])
    size = NIC_SIZES[-1] if ring_cpu else SIZES[-1]
    gather_cpu = _mean_over_ranks(gather_cpu / ((n - 1) / n * size), world)
    reduce_cpu = _mean_over_ranks(_reduce_cpu(REDUCE_SIZE, world), world)
    pair_Bps = _pair_gather_Bps(PAIR_SIZE, world, k) if world > k else None
    call_wait = _call_wait_s(mine, k)
    if rank == 0:
        bw, alpha = fit(k, (SIZES[0], SIZES[1]), (times[0], times[1]))
        doc = {"ranks_per_node": k, "sizes": list(SIZES), "times_s": times}
        doc |= {"loopback_Bps": bw, "loopback_latency_s": alpha}
        doc |= {"gather_cpu_s_per_B": gather_cpu, "reduce_cpu_s_per_B": reduce_cpu, "reduce_size": REDUCE_SIZE}
        if ring:
            nic_bw, nic_alpha = fit(world, (NIC_SIZES[0], NIC_SIZES[1]), (ring[0], ring[1]))
            doc |= {"ring_sizes": list(NIC_SIZES), "ring_times_s": ring}
            doc |= {"nic_ring_Bps": nic_bw, "nic_ring_latency_s": nic_alpha}
        if pair_Bps is not None:
            doc["nic_pair_gather_Bps"] = pair_Bps
        doc["call_wait_s"] = call_wait
        atomic_write(out, json.dumps(doc))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    from shardsim.runtime.processes import follow_launcher

    follow_launcher()  # under `shardsim profile`: end with it
    sys.exit(main())
