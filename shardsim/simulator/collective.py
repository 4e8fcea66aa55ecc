"""`shardsim collective`: one collective on a cluster, timed by the simpy network."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import simpy

from shardsim.core.errors import ConfigError
from shardsim.simulator.hardware.topology import Cluster
from shardsim.simulator.network.collectives import BUS_FACTOR, GroupLayout, PhaseRun, algo_for, plan
from shardsim.simulator.network.fluid import Network
from shardsim.simulator.network.linkgroups import group_links
from shardsim.simulator.network.links import LinkGraph, build_links
from shardsim.simulator.scale import world_refusal

OPS = tuple(BUS_FACTOR)  # the collectives timed: all_reduce, all_gather, reduce_scatter, broadcast, send_recv


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
    phases = [plan(g, op, layout, algo, backend) for op, layout, _ in calls]
    caps, routes = group_links(g.capacity, [ph.route for phs in phases for ph in phs])  # (linkgroups.py)
    net = Network(env, caps)
    finish = [0.0] * len(calls)
    it = iter(routes)
    for i, ((op, _, nbytes), phs) in enumerate(zip(calls, phases, strict=True)):
        steps = tuple((ph.latency_s, next(it)) for ph in phs)
        PhaseRun(net, steps, nbytes, op, lambda i=i: finish.__setitem__(i, env.now)).next()
    env.run()
    return finish


def simulate_collective(
    cluster: Cluster, op: str, size_bytes: int, algo: str = "ring", backend: str = "nccl", ranks: int | None = None
) -> CollectiveResult:
    """Time `op` over the first `ranks` ranks (default: all) as nccl-tests would report it."""
    too_big = world_refusal(cluster.world)
    if too_big:
        raise ConfigError(too_big, field="nodes")
    n = cluster.world if ranks is None else ranks
    if not 2 <= n <= cluster.world:
        raise ConfigError(
            f"a collective runs over 2 to the {cluster.world:,} devices of {cluster.describe()}, not {n:,} ranks"
            + ("; add --nodes" if n > cluster.world else ""),
            field="ranks",
        )
    if refusal := cluster.instance.device.backend_refusal(backend):
        raise ConfigError(refusal, field="backend")
    g = build_links(cluster)
    layout = GroupLayout(0, n, n)
    if algo == "auto":  # as predict and sweep choose
        algo = algo_for(op, algo, layout, cluster.devices_per_node, backend, g, float(size_bytes))
    plan(g, op, layout, algo, backend)  # validates op/algo/backend
    (t,) = time_collectives(g, [(op, layout, float(size_bytes))], algo, backend)
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
