"""Time gloo collectives inside a node of an emulated cluster (run under torchrun there).

The ranks of one emulated node talk over loopback, and on this host that is no free link:
every byte is copied by the kernel on both sides, by processes that share a few cores with
every other rank. A TCP probe between two idle processes says gigabytes per second; what
FSDP2's intra-node all-gathers get is far less. So `shardsim profile` measures it as the
simulator uses it: all nodes' ranks all-gather within their node at once (as the partition
groups of ZeRO-2D do), at two sizes, and an alpha-beta fit of the ring all-gather gives the
loopback's achieved bandwidth per rank and its per-step latency.

    python -m torch.distributed.run ... -m runtime.linkbench OUT.json
"""

from __future__ import annotations

import json
import sys
import time

SIZES = (64 * 1024, 8 * 1024 * 1024)  # bytes of the gathered (whole) array
REPEATS = 6


def _time(fn, repeats: int) -> float:
    import torch.distributed as dist

    fn()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    dist.barrier()
    return (time.perf_counter() - t0) / repeats


def fit(k: int, sizes: tuple[int, int], times: tuple[float, float]) -> tuple[float, float]:
    """(bandwidth B/s, latency s per step) of a ring all-gather over k ranks from two timings:
    t(S) = (k-1)·alpha + (k-1)/k·S/B."""
    (s1, s2), (t1, t2) = sizes, times
    f = (k - 1) / k
    bw = f * (s2 - s1) / max(t2 - t1, 1e-9)
    alpha = max(t1 - f * s1 / bw, 0.0) / (k - 1)
    return bw, alpha


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
    times = []
    for size in SIZES:
        n = size // 4 // k
        shard, whole = torch.ones(n), torch.empty(n * k)
        times.append(_time(lambda s=shard, w=whole: dist.all_gather_into_tensor(w, s, group=mine), REPEATS))
    if rank == 0:
        bw, alpha = fit(k, (SIZES[0], SIZES[1]), (times[0], times[1]))
        doc = {"ranks_per_node": k, "sizes": list(SIZES), "times_s": times}
        doc |= {"loopback_Bps": bw, "loopback_latency_s": alpha}
        with open(out, "w") as fh:
            json.dump(doc, fh)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
