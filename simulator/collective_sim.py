"""`shardsim collective`: one collective on a cluster, timed by the simpy network."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import simpy

from simulator.collectives import BUS_FACTOR, GroupLayout, plan, run_phases
from simulator.links import LinkGraph, build_links
from simulator.network import Network
from simulator.topology import Cluster


@dataclass(frozen=True)
class CollectiveResult:
    op: str
    ranks: int
    size_bytes: int
    time_s: float
    algbw_GBps: float
    busbw_GBps: float
    algo: str
    backend: str
    cluster: str

    def to_dict(self) -> dict:
        return asdict(self)


def time_collectives(g: LinkGraph, calls: list[tuple[str, GroupLayout, float]], algo: str, backend: str) -> list[float]:
    """Run several collective calls concurrently on one network; each one's finish time."""
    env = simpy.Environment()
    net = Network(env, g.capacity)
    finish = [0.0] * len(calls)

    def one(i: int, op: str, layout: GroupLayout, nbytes: float):
        yield from run_phases(net, g, plan(g, op, layout, algo, backend), nbytes, tag=op)
        finish[i] = env.now

    for i, (op, layout, nbytes) in enumerate(calls):
        env.process(one(i, op, layout, nbytes))
    env.run()
    return finish


def simulate_collective(
    cluster: Cluster, op: str, size_bytes: int, algo: str = "ring", backend: str = "nccl", ranks: int | None = None
) -> CollectiveResult:
    """Time `op` over the first `ranks` ranks (default: all) as nccl-tests would report it."""
    n = ranks or cluster.world
    g = build_links(cluster)
    plan(g, op, GroupLayout(0, n, n), algo, backend)  # validates op/algo/backend
    (t,) = time_collectives(g, [(op, GroupLayout(0, n, n), float(size_bytes))], algo, backend)
    algbw = size_bytes / t / 1e9 if t > 0 else float("inf")
    return CollectiveResult(
        op=op,
        ranks=n,
        size_bytes=int(size_bytes),
        time_s=t,
        algbw_GBps=algbw,
        busbw_GBps=algbw * BUS_FACTOR[op](n),
        algo=algo,
        backend=backend,
        cluster=cluster.describe(),
    )
