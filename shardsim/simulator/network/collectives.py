"""Collectives placed on the cluster's links, by algorithm and by backend.

A collective call in an SPMD program runs in every group of a `GroupLayout` at once
(e.g. all partition groups of ZeRO-2D all-gather together). It becomes a short list of
`Phase`s: each phase is the bytes every link carries (all ring edges of all groups) and
a latency (steps × the slowest hop). Phases run one after another; a phase lasts its
latency plus the time its most loaded link needs (pipelined ring: the bottleneck edge
sets the pace). Sizes follow nccl-tests: S is the whole array (the all-gather output,
the reduce-scatter input).

Algorithms (named choices):
- ring: NCCL's and gloo's ring; edges follow rank order, so a group of consecutive ranks
  crosses each node boundary once per direction.
- tree: NCCL's tree for all-reduce: a chain inside each node and a double binary tree
  over nodes, each tree carrying half the data up (reduce) and down (broadcast).
- hierarchical: intra-node reduce-scatter, inter-node all-reduce of S/k among ranks of
  the same local index (k rings in parallel), intra-node all-gather; for all-gather
  (MiCS) inter-node all-gather of S/k among same-local-index ranks, then intra-node
  all-gather; reduce-scatter is its mirror.
Backend semantics: gloo's reduce-scatter is an all-reduce of the whole tensor then a
local chunk; gloo has ring algorithms only.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardsim.config.schema import ALGOS
from shardsim.core.errors import ConfigError
from shardsim.simulator.network.fluid import Network, Route
from shardsim.simulator.network.links import LinkGraph

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv")

# nccl-tests doc/PERFORMANCE.md: busbw = algbw × factor(n)
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
}


@dataclass(frozen=True)
class GroupLayout:
    """Ranks [start, start+count) split into groups of `size`.

    strided=False: groups are consecutive ranks (reshape(-1, size)); strided=True: groups
    are the columns of reshape(size, -1) (rank i goes with i + count/size, ...), the
    replica groups of ZeRO-2D.
    """

    start: int
    count: int
    size: int
    strided: bool = False
    reverse: bool = False  # reverse each group's order (the backward direction of send/recv)

    def groups(self) -> np.ndarray:
        r = np.arange(self.start, self.start + self.count)
        g = r.reshape(self.size, -1).T.copy() if self.strided else r.reshape(-1, self.size)
        return g[:, ::-1].copy() if self.reverse else g

    @staticmethod
    def world(world: int) -> GroupLayout:
        return GroupLayout(0, world, world)


@dataclass(frozen=True)
class Phase:
    links: np.ndarray
    load: np.ndarray  # bytes per link, per byte of S (scaled by the caller)
    latency_s: float
    sent: float = 0.0  # bytes all ranks send together, per byte of S (what moving them costs a host's CPU)

    @cached_property
    def route(self) -> Route:
        """Links and load, for the network."""
        return Route.of(self.links, self.load)


def _ring_edges(rings: np.ndarray, wrap: bool = True) -> tuple[np.ndarray, np.ndarray]:
    src = rings if wrap else rings[:, :-1]
    dst = np.roll(rings, -1, axis=1) if wrap else rings[:, 1:]
    return src.ravel(), dst.ravel()


def _ring_phase(g: LinkGraph, rings: np.ndarray, per_edge: float, steps_per_rank: int, wrap: bool = True) -> Phase:
    """All rings at once; every edge carries `per_edge` bytes (per byte of S)."""
    n = rings.shape[1]
    if n < 2 or per_edge <= 0:
        return Phase(np.zeros(0, np.int64), np.zeros(0), 0.0)
    src, dst = _ring_edges(rings, wrap)
    links, load = g.edge_loads(src, dst, per_edge)
    return Phase(links, load, steps_per_rank * g.edge_latency(src, dst), float(src.size * per_edge))


def _by_node(g: LinkGraph, groups: np.ndarray) -> np.ndarray | None:
    """Reshape groups (G, n) into (G, m nodes, k local) when every node holds k of them."""
    k_dev = g.cluster.devices_per_node
    G, n = groups.shape
    nodes = groups // k_dev
    m = len(np.unique(nodes[0]))
    if n % m:
        return None
    k = n // m
    arr = groups.reshape(G, m, k)
    if not (arr // k_dev == arr[:, :, :1] // k_dev).all():
        return None
    return arr


def _tree_phases(g: LinkGraph, groups: np.ndarray) -> list[Phase]:
    """NCCL-style tree all-reduce: intra-node chains + double binary tree over node heads."""
    arr = _by_node(g, groups)
    if arr is None:
        raise ConfigError("tree all-reduce needs the same number of group ranks on every node", field="algo")
    G, m, k = arr.shape
    src_parts, dst_parts, bytes_parts = [], [], []
    # chain inside each node: local i <-> i+1 carries S up (reduce) and S down (broadcast)
    if k > 1:
        a, b = arr[:, :, :-1].ravel(), arr[:, :, 1:].ravel()
        src_parts += [b, a]
        dst_parts += [a, b]
        bytes_parts += [np.ones(a.size), np.ones(a.size)]
    depth = 0
    if m > 1:
        heads = arr[:, :, 0]  # (G, m)
        for mirror in (False, True):
            pos = np.arange(m)
            order = heads[:, ::-1] if mirror else heads
            child = pos[1:]
            parent = (child - 1) // 2
            c, p = order[:, child].ravel(), order[:, parent].ravel()
            # half of S per tree, up and down
            src_parts += [c, p]
            dst_parts += [p, c]
            bytes_parts += [np.full(c.size, 0.5), np.full(c.size, 0.5)]
        depth = int(math.floor(math.log2(m)))
    src = np.concatenate(src_parts)
    dst = np.concatenate(dst_parts)
    sent = np.concatenate(bytes_parts)
    links, load = g.edge_loads(src, dst, sent)
    latency = 2 * (depth * g.inter_latency_s + (k - 1) * g.intra_latency_s)
    return [Phase(links, load, latency, float(sent.sum()))]


def _ring_plan(g: LinkGraph, op: str, groups: np.ndarray) -> list[Phase]:
    n = groups.shape[1]
    f = (n - 1) / n
    if op == "all_reduce":
        return [_ring_phase(g, groups, 2 * f, 2 * (n - 1))]
    if op in ("all_gather", "reduce_scatter"):
        return [_ring_phase(g, groups, f, n - 1)]
    if op == "broadcast":
        return [_ring_phase(g, groups, 1.0, n - 1, wrap=False)]
    if op == "send_recv":
        return [_ring_phase(g, groups, 1.0, 1, wrap=False)]
    raise ConfigError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}", field="op")


def _hier_plan(g: LinkGraph, op: str, groups: np.ndarray) -> list[Phase]:
    arr = _by_node(g, groups)
    if arr is None or arr.shape[1] == 1 or arr.shape[2] == 1:
        return _ring_plan(g, op, groups)  # one node, or one rank per node: a plain ring
    G, m, k = arr.shape
    intra = arr.reshape(G * m, k)
    inter = arr.transpose(0, 2, 1).reshape(G * k, m)
    fk, fm = (k - 1) / k, (m - 1) / m
    if op == "all_reduce":
        return [
            _ring_phase(g, intra, fk, k - 1),
            _ring_phase(g, inter, 2 * fm / k, 2 * (m - 1)),
            _ring_phase(g, intra, fk, k - 1),
        ]
    if op == "all_gather":
        return [_ring_phase(g, inter, fm / k, m - 1), _ring_phase(g, intra, fk, k - 1)]
    if op == "reduce_scatter":
        return [_ring_phase(g, intra, fk, k - 1), _ring_phase(g, inter, fm / k, m - 1)]
    raise ConfigError(
        f"hierarchical {op} is not modelled; expected all_reduce, all_gather or reduce_scatter", field="algo"
    )


def algo_for(
    op: str,
    algo: str,
    layout: GroupLayout,
    devices_per_node: int,
    backend: str,
    g: LinkGraph | None = None,
    nbytes: float = 0.0,
) -> str:
    """The algorithm a call really uses. `auto`: MiCS's hierarchical all-gather when a group
    spans nodes (as SageMaker's sharded data parallelism does); for an NCCL all-reduce over
    nodes, ring or tree, whichever the call's size takes less time on (as NCCL's tuner picks by
    its cost model, src/graph/tuning.cc: tree's latency grows with log2 of the nodes, ring's
    with the ranks), given the graph `g` and `nbytes`; ring otherwise. Tree only applies to
    all-reduce, hierarchical to all-reduce/all-gather/reduce-scatter; gloo has rings only."""
    if backend == "gloo":
        return "ring"
    if algo == "auto":
        grp = layout.groups()[0]
        spans_nodes = grp.size > 1 and (grp[0] // devices_per_node) != (grp[-1] // devices_per_node)
        if op == "all_gather" and spans_nodes:
            return "hierarchical"
        if op == "all_reduce" and spans_nodes and g is not None and nbytes > 0:
            return min(("ring", "tree"), key=lambda a: _alone_time(g, op, layout, a, backend, nbytes))
        return "ring"
    if algo == "tree" and op != "all_reduce":
        return "ring"
    if algo == "hierarchical" and op not in ("all_reduce", "all_gather", "reduce_scatter"):
        return "ring"
    return algo


def _alone_time(g: LinkGraph, op: str, layout: GroupLayout, algo: str, backend: str, nbytes: float) -> float:
    """Seconds of one call on an idle network (its phases one after another); inf where the
    algorithm does not apply to the layout (tree needs the same ranks on every node)."""
    try:
        phases = _plan_cached(g, op, layout, algo, backend)
    except ConfigError:
        return math.inf
    return sum(phase_time(g, ph, nbytes) for ph in phases)


def check_algo(op: str, algo: str, backend: str) -> None:
    if op not in OPS:
        raise ConfigError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}", field="op")
    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; expected one of {', '.join(ALGOS)}", field="algo")
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"unknown backend {backend!r}; expected nccl or gloo", field="backend")
    if backend == "gloo" and algo != "ring":
        raise ConfigError(f"gloo implements ring collectives only, not {algo}", field="algo")
    if algo == "tree" and op != "all_reduce":
        raise ConfigError(f"NCCL's tree algorithm is for all_reduce only, not {op}", field="algo")


def _phases(g: LinkGraph, op: str, layout: GroupLayout, algo: str, backend: str) -> tuple[Phase, ...]:
    groups = layout.groups()
    if groups.shape[1] < 2:
        return ()
    if backend == "gloo" and op == "reduce_scatter":
        op = "all_reduce"  # gloo: all-reduce of the whole tensor, then keep one chunk
    if algo == "tree":
        phases = _tree_phases(g, groups)
    elif algo == "hierarchical":
        phases = _hier_plan(g, op, groups)
    else:
        phases = _ring_plan(g, op, groups)
    return tuple(p for p in phases if p.links.size)


PLAN_CACHE_BYTES = 128 * 2**20  # the planned phases' arrays a process keeps (a phase of 16,384 ranks: ~3 MB)
PLAN_CACHE_ENTRIES = 4096  # and at most this many calls' phases


class _PlanCache:
    """The phases of each (graph, collective, layout, algorithm, backend), the least recently
    used dropped once their arrays pass PLAN_CACHE_BYTES (or PLAN_CACHE_ENTRIES): a sweep calls the same few collectives
    thousands of times, and over a big cluster every phase holds arrays as long as its links."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.nbytes = 0
        self.entries: OrderedDict[tuple, tuple[tuple[Phase, ...], int]] = OrderedDict()

    def __call__(self, g: LinkGraph, op: str, layout: GroupLayout, algo: str, backend: str) -> tuple[Phase, ...]:
        key = (g, op, layout, algo, backend)
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit[0]
        phases = _phases(g, op, layout, algo, backend)
        size = sum(ph.links.nbytes + ph.load.nbytes for ph in phases)
        self.entries[key] = (phases, size)
        self.nbytes += size
        while len(self.entries) > 1 and (self.nbytes > self.budget or len(self.entries) > PLAN_CACHE_ENTRIES):
            _, (_, dropped) = self.entries.popitem(last=False)
            self.nbytes -= dropped
        return phases

    def cache_clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0


_plan_cached = _PlanCache(PLAN_CACHE_BYTES)


def plan(g: LinkGraph, op: str, layout: GroupLayout, algo: str = "ring", backend: str = "nccl") -> tuple[Phase, ...]:
    """Per-byte phases of one SPMD collective call over all groups of `layout`."""
    check_algo(op, algo, backend)
    return _plan_cached(g, op, layout, algo, backend)


def phase_time(g: LinkGraph, phase: Phase, nbytes: float) -> float:
    """Time of one phase alone on the network."""
    return phase.latency_s + float(np.max(phase.load * nbytes / g.capacity[phase.links]))


Steps = tuple[tuple[float, Route], ...]  # a call's phases as (latency, route) for the network


def steps_of(phases: tuple[Phase, ...]) -> Steps:
    return tuple((ph.latency_s, ph.route) for ph in phases)


def run_phases(net: Network, g: LinkGraph, phases: tuple[Phase, ...], nbytes: float, tag: str = ""):
    """simpy process body: the phases one after another on a shared Network."""
    done = net.env.event()
    PhaseRun(net, steps_of(phases), nbytes, tag, done.succeed).next()
    yield done


@dataclass(eq=False, slots=True)
class PhaseRun:
    """The phases of one call one after another on a shared Network, without a simpy process:
    each phase waits its latency (a timeout), then moves its bytes; `on_done()` runs when the
    last one ends (at once when there are none). Call `next()` to start."""

    net: Network
    steps: Steps
    nbytes: float
    tag: str
    on_done: Callable[[], object]
    i: int = 0  # the phase to start next
    waited: bool = False  # its latency is over

    def next(self) -> None:
        if self.i == len(self.steps):
            self.on_done()
            return
        latency, route = self.steps[self.i]
        if latency and not self.waited:
            self.waited = True
            self.net.env.timeout(latency).callbacks.append(self._after_latency)
            return
        self.i, self.waited = self.i + 1, False
        self.net.send(route, self.nbytes, self.tag, self.next)

    def _after_latency(self, _ev: object) -> None:
        self.next()
