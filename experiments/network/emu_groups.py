"""How gloo's collectives share an emulated NIC: one ring over every rank, one 2-rank group
across the NIC alone, and every node-local rank's cross-node group at once (the data-parallel
groups of a tensor-parallel layout); and what a small tensor-parallel call costs on the host's
shared cores while other ranks compute.

    sudo .venv/bin/python experiments/network/emu_groups.py emu-2x2 [--out FILE.json]

Each figure is the median over rounds of a call's time. Rank 0 writes them; this script
prints them beside what a fair share of the profile's NIC rate would give.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

SIZES = (4 * 1024 * 1024, 16 * 1024 * 1024)  # bytes of the whole array (all-gather) / tensor (all-reduce)
ROUNDS = 5
TP_SIZES = (32 * 1024, 128 * 1024, 512 * 1024)  # a tensor-parallel block's activations


def _median_time(fn, rounds: int = ROUNDS) -> float:
    import torch.distributed as dist

    fn()
    out = []
    for _ in range(rounds):
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _only(member: bool, fn):
    """`fn` on the ranks that are `member`, nothing on the others."""
    return fn if member else (lambda: None)


def _times(n: int, fn):
    """`fn` called `n` times back to back."""

    def run():
        for _ in range(n):
            fn()

    return run


def bench(out: str) -> None:
    """Under torchrun inside the cluster: the timings, written by rank 0 to `out`."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    k = int(os.environ["LOCAL_WORLD_SIZE"])
    nodes = world // k
    # cross-node groups: local rank r of every node (r = 0..k-1), as mesh dp groups with tp = k
    cross = [dist.new_group([n * k + r for n in range(nodes)]) for r in range(k)]
    mine = cross[rank % k]
    pair = dist.new_group([0, k])  # local rank 0 of nodes 0 and 1
    res: dict[str, float] = {}
    for size in SIZES:
        n = size // 4
        x = torch.ones(n)
        # the world ring
        shard, whole = torch.ones(n // world), torch.empty(n // world * world)
        res[f"world_all_gather_{size}"] = _median_time(partial(dist.all_gather_into_tensor, whole, shard))
        res[f"world_all_reduce_{size}"] = _median_time(partial(dist.all_reduce, x))
        # every cross group at once
        shard, whole = torch.ones(n // nodes), torch.empty(n // nodes * nodes)
        gather = partial(dist.all_gather_into_tensor, whole, shard)
        res[f"groups_all_gather_{size}"] = _median_time(partial(gather, group=mine))
        res[f"groups_all_reduce_{size}"] = _median_time(partial(dist.all_reduce, x, group=mine))
        # cross group 0 alone (the others wait at the barrier)
        zero = rank % k == 0
        res[f"alone_all_gather_{size}"] = _median_time(_only(zero, partial(gather, group=cross[0])))
        res[f"alone_all_reduce_{size}"] = _median_time(_only(zero, partial(dist.all_reduce, x, group=cross[0])))
        # local rank 0 of nodes 0 and 1 alone
        half, both = torch.ones(n // 2), torch.empty(n // 2 * 2)
        in_pair = rank in (0, k)
        pair_gather = partial(dist.all_gather_into_tensor, both, half, group=pair)
        res[f"pair_all_gather_{size}"] = _median_time(_only(in_pair, pair_gather))
        res[f"pair_all_reduce_{size}"] = _median_time(_only(in_pair, partial(dist.all_reduce, x, group=pair)))
    # the tensor-parallel groups (each node's ranks), every node at once: small all-reduces and all-gathers
    local = [dist.new_group(list(range(n * k, (n + 1) * k))) for n in range(nodes)][rank // k]
    for size in TP_SIZES:
        y = torch.ones(size // 4)
        res[f"local_all_reduce_{size}"] = _median_time(_times(10, partial(dist.all_reduce, y, group=local))) / 10
        shard, whole = torch.ones(size // 4 // k), torch.empty(size // 4 // k * k)
        gather = partial(dist.all_gather_into_tensor, whole, shard, group=local)
        res[f"local_all_gather_{size}"] = _median_time(_times(10, gather)) / 10
    # node 0's tensor-parallel group alone, then while every other rank computes (8 ranks on the
    # host's cores: does a small call wait for its ranks to be scheduled?)
    a, b = torch.randn(256, 256), torch.randn(256, 256)

    def busy():
        t_end = time.perf_counter() + 0.05
        while time.perf_counter() < t_end:
            a @ b

    for size in TP_SIZES:
        y = torch.ones(size // 4)
        calls = _times(10, partial(dist.all_reduce, y, group=local))
        res[f"node0_all_reduce_{size}"] = _median_time(_only(rank < k, calls)) / 10
        res[f"loaded_all_reduce_{size}"] = _median_time(calls if rank < k else _times(2, busy)) / 10
    # every rank alternating a fixed amount of compute (about 2 ms on a free core, as much as a
    # small-gpt block's share between two of its calls) with a small
    # all-reduce in its node's tensor-parallel group, as a tensor-parallel block does: the work
    # alone (every rank at once), then work and calls, node 0 alone and every node at once
    # (per round of the two; what the calls add beyond the shared compute is the ranks' wait)
    c, d = torch.randn(96, 96), torch.randn(96, 96)
    probe = torch.ones(32 * 1024 // 4)

    def work():
        for _ in range(100):
            c @ d

    def paced():
        work()
        dist.all_reduce(probe, group=local)

    res["work_all"] = _median_time(_times(20, work)) / 20
    res["work_node0"] = _median_time(_only(rank < k, _times(20, work))) / 20
    res["paced_node0"] = _median_time(_only(rank < k, _times(20, paced))) / 20
    res["paced_all"] = _median_time(_times(20, paced)) / 20
    if rank >= k:  # node 0's figures are node 0's
        res |= {key: 0.0 for key in res if key.startswith(("node0", "loaded")) or key.endswith("node0")}
    t = torch.tensor(list(res.values()), dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's figure
    if rank == 0:
        doc = {"world": world, "ranks_per_node": k, "times_s": dict(zip(res, t.tolist(), strict=True))}
        Path(out).write_text(json.dumps(doc, indent=1))
    dist.destroy_process_group()


def launch(topology: str) -> dict:
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster
    from shardsim.runtime.emulation.processes import run_in_node, torchrun_argv
    from shardsim.runtime.launch import free_port

    cluster = plan_cluster(topology, None)
    with emulated(cluster), tempfile.TemporaryDirectory(prefix="shardsim-groups-") as tmp:
        result = Path(tmp) / "groups.json"
        port = free_port()
        env = {"OMP_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR", "TMPDIR": tmp}
        argv = [str(Path(__file__).resolve()), "--bench", str(result)]
        procs = [
            run_in_node(cluster, i, torchrun_argv(cluster, i, argv, master_port=port), env=env)
            for i in range(len(cluster.nodes))
        ]
        for p in procs:
            p.wait(timeout=600)
        return json.loads(result.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("topology", nargs="?")
    ap.add_argument("--bench")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.bench:
        bench(a.bench)
        return 0
    doc = launch(a.topology)
    doc["topology"] = a.topology
    text = json.dumps(doc, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    world, k = doc["world"], doc["ranks_per_node"]
    nodes = world // k
    for key, t in doc["times_s"].items():
        if key.startswith(("work", "paced")):
            print(f"{key:32s} {t * 1e3:9.2f} ms a round")
            continue
        kind, op, size = key.split("_", 1)[0], key.split("_", 1)[1].rsplit("_", 1)[0], int(key.rsplit("_", 1)[1])
        n = {"world": world, "pair": 2, "local": k, "node0": k, "loaded": k}.get(kind, nodes)
        per_rank = (n - 1) / n * size * (2 if op == "all_reduce" else 1)  # bytes each rank sends (ring)
        print(f"{key:32s} {t * 1e3:9.1f} ms   {per_rank / t / 1e6:7.2f} MB/s sent per rank")
    return 0


if __name__ == "__main__":
    sys.exit(main())
