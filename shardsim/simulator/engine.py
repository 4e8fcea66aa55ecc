"""Runs a plan's ops in simpy (`clock.Clock`): streams in order, dependencies, a shared network."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from shardsim.simulator.clock import Clock
from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.idle_chain import IdleChain
from shardsim.simulator.network.collectives import Algo, Phase, PhaseRun, Steps, algo_for
from shardsim.simulator.network.collectives import plan as plan_collective
from shardsim.simulator.network.fluid import Network, Route
from shardsim.simulator.network.linkgroups import group_links
from shardsim.simulator.network.links import LinkGraph
from shardsim.simulator.network.nccl_runs import channels
from shardsim.simulator.plan import Op, Plan
from shardsim.specs.hardware.topology import Cluster

# SM sharing: while an NCCL kernel runs on a GPU, its CTAs (one per channel, each holding an SM:
# NCCL launches a grid of nChannels blocks, src/enqueue.cc) leave compute kernels the other SMs,
# so compute on that GPU slows by CTAs / SMs (`sm_share`): the channels NCCL opens as
# `nccl_runs` assumes them (16 on NVLink / NVSwitch nodes, 2 on PCIe ones) over the device's SMs
# (`device.kernels.sms`). A kernel-level trace (Nsight Systems) of FSDP's all-gather overlapping a
# GEMM on an H100 showed 24 CTAs on 132 SMs = 0.18 (NVIDIA developer forum, "Compute-Communication
# Overlap Causes Severe GEMM Performance Degradation because of Tail Effect",
# forums.developer.nvidia.com/t/337991): the same order as 16 / 132 = 0.12, and the share taken
# for a GPU whose SMs the topology does not give. Assumptions (named): the same share for every
# collective and send; compute slows in proportion to the SMs it loses (the wave-quantization
# tail that thread shows for a single-wave GEMM, up to 2x, is not modelled; nor HBM bandwidth the
# collective takes); communication is not slowed by compute. Applied with nccl only (gloo runs on
# the CPU).
NCCL_SM_SHARE = 24 / 132


def sm_share(cluster: Cluster) -> float:
    """The fraction of a GPU's SMs NCCL's kernels hold while they run (see NCCL_SM_SHARE)."""
    kernels = cluster.instance.device.kernels
    if kernels is None:
        return NCCL_SM_SHARE
    return min(1.0, channels(cluster) / kernels.sms)


@dataclass(slots=True)  # not frozen: a frozen dataclass costs 5x more to create, and a plan makes many
class Span:
    op: int
    rank_class: int
    stream: str
    kind: str
    name: str
    phase: str
    start: float
    end: float


def simulate(
    p: Plan,
    g: LinkGraph,
    algo: str,
    backend: str,
    shared_cores: float | None = None,
    comm_cpu: dict[str, float] | None = None,
    mics: bool = False,
    call_wait_s: float = 0.0,
    idle_chains: bool = True,
) -> list[Span]:
    """Execute the plan; every op starts when its dependencies (including the previous op on
    its stream, recorded by the plan) are done. Returns one span per op.

    `shared_cores`: all ranks run on one host with this many cores (an emulated cluster).
    Compute then becomes processor sharing: a compute op of a rank class is `count` ranks
    each needing `duration` core-seconds; ranks computing at once split the cores, and no
    rank runs faster than one core (measured here: 8 processes on 2 cores take 4x as long).
    `comm_cpu` (with `shared_cores`): core-seconds per byte a rank sends, per collective: on
    such a host moving bytes costs the same cores (gloo copies and reduces, the kernel runs TCP
    on both ends), so every phase also loads the cores with its bytes sent; compute yields
    to it (fairshare.fill). `call_wait_s` (with `shared_cores`): seconds every collective and
    send waits, beyond its latency, for ranks the host's scheduler has not run yet (on a host
    whose ranks outnumber its cores a rank that reaches a call waits for its partners, which
    the fluid share of the cores, where a group's ranks end their compute together, does not
    hold; measured by the profile, a named addition to each call's first phase). `mics`: the
    collectives are SageMaker's library's (MiCS's hierarchical all-gather under `auto`), not
    PyTorch's flat NCCL ones.

    With nccl, a compute op of a rank class runs at 1 - `sm_share` of its speed while a
    collective or send of that class (or to it) is in flight (`SmSharing`).

    `idle_chains` (without `shared_cores`): a chain of one-phase collectives that starts on idle
    links is timed as one event (`idle_chain.IdleChain`: the same spans up to float rounding);
    False runs every op on the network (what the tests compare it with)."""
    with paused_gc():  # setting up allocates an object or more per op too
        run = _Run(p, g, algo, backend, shared_cores, comm_cpu, mics, call_wait_s, idle_chains)
        run.ready.extend(op.id for op in p.ops if not op.deps)
        run.drain()
        run.env.run()
    if run.ended < len(p.ops):
        first = next(i for i, s in enumerate(run.spans) if s is None)
        raise RuntimeError(f"plan deadlocked: op {p.ops[first].name!r} never ran")
    return run.spans  # type: ignore[return-value]


def chain_bound(
    p: Plan,
    g: LinkGraph,
    algo: str,
    backend: str,
    shared_cores: float | None = None,
    comm_cpu: dict[str, float] | None = None,
    mics: bool = False,
    call_wait_s: float = 0.0,
) -> float:
    """A lower bound on the step `simulate` gives (same arguments), without running it: the
    longest chain of dependencies, each compute op at its duration and each collective's phases
    one after another, each alone on the network (its latency, then its bytes at its route's
    bottleneck rate: the phases, links and capacities `simulate` uses); or, when longer, the
    busiest link's time (every byte the step puts on it at its capacity). Sound because nothing
    in a run is faster: an op starts when its dependencies end; a compute op takes at least its
    duration (NCCL's SM share and shared cores slow it); a transfer sharing a link gets at most
    what it would alone; a link moves at most its capacity (a collective op of a rank class
    carries every group's bytes: the whole world's traffic)."""
    caps, steps, _ = _network(p, g, algo, backend, shared_cores, comm_cpu, mics, call_wait_s)
    cap = caps.tolist()
    busy = [0.0] * len(cap)  # seconds of each (grouped) link's capacity the step's bytes take
    alone: dict[int, float] = {}  # per route: seconds per byte alone
    finish = [0.0] * len(p.ops)
    for op in p.ops:
        start = max([finish[d] for d in op.deps], default=0.0)
        if op.kind == "comm":
            t = 0.0
            for latency, route in steps[op.id] or ():
                per_byte = alone.get(id(route))
                if per_byte is None:
                    per_byte = alone[id(route)] = max(
                        [u / cap[link] for link, u in zip(route.links, route.unit, strict=True)], default=0.0
                    )
                t += latency + op.nbytes * per_byte
                for link, u in zip(route.links, route.unit, strict=True):
                    busy[link] += op.nbytes * u / cap[link]
        else:
            t = op.duration
        finish[op.id] = start + t
    return max(max(finish, default=0.0), max(busy, default=0.0))


def _network(
    p: Plan,
    g: LinkGraph,
    algo: str,
    backend: str,
    shared_cores: float | None,
    comm_cpu: dict[str, float] | None,
    mics: bool,
    call_wait_s: float,
) -> tuple[np.ndarray, list[Steps | None], Route]:
    """The network `p` runs on (`simulate`'s arguments): the capacities of its (grouped) links,
    each op's phases as (latency, route) (None: not a collective) and the route of the host's
    cores (one link; used only with `shared_cores`)."""
    shared = shared_cores is not None
    capacity = g.capacity if shared_cores is None else np.append(g.capacity, float(shared_cores))
    core_link = len(g.capacity)
    cpu = Route.of(np.array([core_link]), np.ones(1))  # the host's cores, one link
    # every call's phases, then the links merged where they always carry the same load
    # per (collective, layout, algorithm, all-to-all's exchange): the same for every call
    phases: dict[tuple, tuple[Phase, ...]] = {}
    of_op: list[tuple[Phase, ...] | None] = [None] * len(p.ops)
    algos: dict[tuple, Algo] = {}  # per (collective, layout, size, exchange): what it runs
    # per (collective, layout object, size, exchange): its phases, found without hashing the layout's
    # fields (the plan's ops hold their layouts, so no id is reused while this runs)
    seen: dict[tuple, tuple[Phase, ...]] = {}
    for op in p.ops:
        if op.kind == "comm":
            ex = op.exchange
            phs = seen.get((op.coll, id(op.layout), op.nbytes, ex))
            if phs is None:
                call = (op.coll, op.layout, op.nbytes, ex)
                used = algos.get(call)
                if used is None:
                    dpn = g.cluster.devices_per_node
                    used = algos[call] = algo_for(
                        op.coll, algo, op.layout, dpn, backend, g, op.nbytes, mics=mics, exchange=ex
                    )
                key = (op.coll, op.layout, used, op.nbytes if used.proto else 0.0, ex)
                phs = phases.get(key)
                if phs is None:
                    phs = phases[key] = plan_collective(g, op.coll, op.layout, used, backend, op.nbytes, ex)
                seen[(op.coll, id(op.layout), op.nbytes, ex)] = phs
            of_op[op.id] = phs
    uniq = {id(ph): ph for phs in phases.values() for ph in phs}
    own = {id(ph): (ph.links, ph.load) for ph in uniq.values()}  # arrays: group_links takes them whole
    if shared and comm_cpu:
        for (coll, *_), phs in phases.items():
            for ph in phs:  # the phase's bytes sent load the cores too
                own[id(ph)] = (
                    np.append(ph.links, core_link),
                    np.append(ph.load, comm_cpu.get(coll, 0.0) * ph.sent),
                )
    caps, routes = group_links(capacity, list(own.values()) + ([cpu] if shared else []))
    route_of = dict(zip(uniq, routes, strict=False))
    steps = {id(phs): tuple((ph.latency_s, route_of[id(ph)]) for ph in phs) for phs in phases.values()}
    if shared and call_wait_s > 0:  # the call waits for its ranks once, before its first phase
        steps = {k: ((st[0][0] + call_wait_s, st[0][1]),) + st[1:] if st else st for k, st in steps.items()}
    per_op: list[Steps | None] = [None if phs is None else steps[id(phs)] for phs in of_op]
    return caps, per_op, routes[-1] if shared else cpu


class _Run:
    """One simulation. Ops start from the callback of their last dependency's end (no process per
    op): a compute op is one call on the clock at its end, a collective its phases one after
    another on the shared network (collectives.PhaseRun), a zero-length op ends at once. Nothing
    here refers back to itself through a callback, so it is all freed when the run returns."""

    def __init__(
        self,
        p: Plan,
        g: LinkGraph,
        algo: str,
        backend: str,
        shared_cores: float | None,
        comm_cpu: dict[str, float] | None = None,
        mics: bool = False,
        call_wait_s: float = 0.0,
        idle_chains: bool = True,
    ) -> None:
        self.env = Clock()
        self.shared = shared_cores is not None
        self.chains = idle_chains and not self.shared  # (on a shared host the cores are a link too)
        caps, self.steps, self.cpu = _network(p, g, algo, backend, shared_cores, comm_cpu, mics, call_wait_s)
        self.net = Network(self.env, caps)
        self.counts = [c.count for c in p.classes]
        self.ops = p.ops
        self.waiting = [len(op.deps) for op in p.ops]
        self.children: list[list[int]] = [[] for _ in p.ops]
        for op in p.ops:
            for d in op.deps:
                self.children[d].append(op.id)
        share = sm_share(g.cluster)
        self.sm = SmSharing(self.env, len(p.classes), share) if backend == "nccl" and not self.shared else None
        self.spans: list[Span | None] = [None] * len(p.ops)
        self.ready: deque[int] = deque()  # ops whose dependencies are all done, to start now
        self.ended = 0

    def begin(self, op: Op) -> None:
        start = self.env._now
        if op.kind == "comm":
            if self.sm is not None:
                self.sm.comm(op, +1)
            steps = self.steps[op.id]
            if steps is not None and len(steps) == 1:  # one phase (the usual): PhaseRun's calls, without it
                if self.chains and self._held(op, start):
                    return
                latency, route = steps[0]
                if latency:
                    self.env.call_in(latency, self._send, (op, start, route))
                else:
                    self._send((op, start, route))
            else:
                PhaseRun(self.net, steps, op.nbytes, op.name, partial(self.end, op, start)).next()
        elif not op.duration > 0:
            self.finish(op, start)  # zero length: ends now, its dependents start in the same drain
        elif self.sm is not None:
            self.sm.compute(op, partial(self.end, op, start))
        elif self.shared:
            work = self.counts[op.rank_class] * op.duration  # core-seconds of the whole class
            self.net.send(self.cpu, work, op.name, partial(self.end, op, start), max_rate=1 / op.duration, yields=True)
        else:
            self.env.call_in(op.duration, self._ended, (op, start))

    def _held(self, op: Op, start: float) -> bool:
        """Start one-phase collective `op` and the chain after it (each the only child of the one
        before and waiting for nothing else, one phase, the same rank class, no peer) as an
        `IdleChain` when all their links are idle; False (nothing started) when not."""
        latency, route = self.steps[op.id][0]  # type: ignore[index]
        ops, routes, latencies = [op], [route], [latency]
        if op.peer is None:
            children, all_ops, steps = self.children, self.ops, self.steps
            cur = op
            while len(children[cur.id]) == 1:
                b = all_ops[children[cur.id][0]]
                st = steps[b.id]
                if b.kind != "comm" or b.peer is not None or b.rank_class != op.rank_class or len(b.deps) != 1:
                    break
                if st is None or len(st) != 1:
                    break
                ops.append(b)
                latencies.append(st[0][0])
                routes.append(st[0][1])
                cur = b
        if len(routes) == 1:
            links = route.links
        else:
            links = tuple(dict.fromkeys(link for r in dict.fromkeys(routes) for link in r.links))
        if not self.net.idle(links):
            return False
        IdleChain(self, ops, routes, latencies, links, start)
        return True

    def span(self, op: Op, start: float, end: float) -> Span:
        """`op`'s span from `start` to `end`."""
        return Span(op.id, op.rank_class, op.stream, op.kind, op.name, op.phase, start, end)

    def finish(self, op: Op, start: float) -> None:
        self.spans[op.id] = Span(op.id, op.rank_class, op.stream, op.kind, op.name, op.phase, start, self.env._now)
        self.ended += 1
        waiting, ready = self.waiting, self.ready
        for c in self.children[op.id]:
            left = waiting[c] - 1
            waiting[c] = left
            if not left:
                ready.append(c)

    def _send(self, at: tuple[Op, float, Route]) -> None:
        """A one-phase collective's bytes, once its latency is over: `at` = (op, its start, route)."""
        op, start, route = at
        self.net.send(route, op.nbytes, op.name, partial(self.end, op, start))

    def _ended(self, op_start: tuple[Op, float]) -> None:
        """The clock's call at a compute op's end: `end(op, start)`."""
        self.end(*op_start)

    def end(self, op: Op, start: float) -> None:
        """An op with a duration ends: record it, start what waited for it."""
        if self.sm is not None and op.kind == "comm":
            self.sm.comm(op, -1)
        self.finish(op, start)
        self.drain()

    def drain(self) -> None:
        ops, ready, begin = self.ops, self.ready, self.begin
        while ready:
            begin(ops[ready.popleft()])


class SmSharing:
    """Compute ops whose speed drops to 1 - `share` while their rank class has communication in
    flight: each running op keeps its work left (seconds at full speed) and is rescheduled when
    the class's count of collectives in flight goes from 0 to 1 or back (a stale end is
    recognised by its generation and ignored)."""

    def __init__(self, env: Clock, classes: int, share: float) -> None:
        self.env = env
        self.share = share
        self.slow = 1.0 - share  # the rate of compute while its class communicates
        self.in_flight = [0] * classes
        self.running: list[dict[int, list]] = [{} for _ in range(classes)]  # op id → [left, since, rate, gen, done]

    def compute(self, op: Op, done: Callable[[], None]) -> None:
        """Start compute op `op`; `done()` when its work is done."""
        job = [op.duration, self.env._now, self.slow if self.in_flight[op.rank_class] else 1.0, 0, done]
        self.running[op.rank_class][op.id] = job
        self._schedule(op.rank_class, op.id, job)

    def comm(self, op: Op, delta: int) -> None:
        """A collective (or send) of `op`'s class starts (+1) or ends (-1)."""
        if op.peer is None:
            self._shift(op.rank_class, delta)
        else:
            for rc in {op.rank_class, op.peer}:
                self._shift(rc, delta)

    def _shift(self, rc: int, delta: int) -> None:
        """Class `rc`'s count of collectives in flight moves by `delta`; its running compute ops are
        rescheduled when that starts or ends its slowdown."""
        n = self.in_flight[rc]
        self.in_flight[rc] = m = n + delta
        if (n == 0) == (m == 0) or self.slow == 1.0:
            return
        rate = self.slow if m else 1.0
        now = self.env._now
        for oid, job in self.running[rc].items():
            job[0] -= (now - job[1]) * job[2]
            job[1], job[2], job[3] = now, rate, job[3] + 1
            self._schedule(rc, oid, job)

    def _schedule(self, rc: int, oid: int, job: list) -> None:
        self.env.call_in(max(job[0], 0.0) / job[2], self._fire, (rc, oid, job, job[3]))

    def _fire(self, at: tuple[int, int, list, int]) -> None:
        """A compute op's scheduled end, `at` = (class, op id, job, generation when scheduled)."""
        rc, oid, job, gen = at
        if job[3] == gen:  # not rescheduled since
            del self.running[rc][oid]
            job[4]()
