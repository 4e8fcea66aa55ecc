"""Runs a plan's ops in simpy: streams in order, dependencies, a shared network."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import simpy

from simulator.collectives import algo_for, run_phases
from simulator.collectives import plan as plan_collective
from simulator.links import LinkGraph
from simulator.network import Network
from simulator.plan import Plan


@dataclass(frozen=True)
class Span:
    op: int
    rank_class: int
    stream: str
    kind: str
    name: str
    phase: str
    start: float
    end: float


def simulate(p: Plan, g: LinkGraph, algo: str, backend: str, shared_cores: int | None = None) -> list[Span]:
    """Execute the plan; every op starts when its dependencies (including the previous op on
    its stream, recorded by the plan) are done. Returns one span per op.

    `shared_cores`: all ranks run on one host with this many cores (an emulated cluster).
    Compute then becomes processor sharing: a compute op of a rank class is `count` ranks
    each needing `duration` core-seconds; ranks computing at once split the cores, and no
    rank runs faster than one core (measured here: 8 processes on 2 cores take 4x as long)."""
    env = simpy.Environment()
    capacity = g.capacity if shared_cores is None else np.append(g.capacity, float(shared_cores))
    cpu = np.array([len(g.capacity)])
    net = Network(env, capacity)
    counts = [c.count for c in p.classes]
    done = [env.event() for _ in p.ops]
    spans: list[Span | None] = [None] * len(p.ops)

    def run(op):
        if op.deps:
            yield simpy.AllOf(env, [done[d] for d in op.deps])
        start = env.now
        if op.kind == "comm":
            used = algo_for(op.coll, algo, op.layout, g.cluster.devices_per_node, backend)
            phases = plan_collective(g, op.coll, op.layout, used, backend)
            yield from run_phases(net, g, phases, op.nbytes, op.name)
        elif op.duration > 0 and shared_cores is not None:
            yield net.transfer(cpu, np.array([counts[op.rank_class] * op.duration]), op.name, max_rate=1 / op.duration)
        elif op.duration > 0:
            yield env.timeout(op.duration)
        spans[op.id] = Span(op.id, op.rank_class, op.stream, op.kind, op.name, op.phase, start, env.now)
        done[op.id].succeed()

    for op in p.ops:
        env.process(run(op))
    env.run()
    missing = [i for i, s in enumerate(spans) if s is None]
    if missing:
        raise RuntimeError(f"plan deadlocked: op {p.ops[missing[0]].name!r} never ran")
    return spans  # type: ignore[return-value]
