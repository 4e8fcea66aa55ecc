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
- p2p (NCCL) and pairwise (gloo): all-to-all, point-to-point sends from every rank to every
  other of its group at once (module `alltoall`), whatever algorithm the other collectives use.
Backend semantics: gloo's reduce-scatter is an all-reduce of the whole tensor then a
local chunk; gloo has ring algorithms only (and its pairwise all-to-all).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardsim.config.schema import ALGOS, PROTOCOLS
from shardsim.core.errors import ConfigError
from shardsim.simulator.network import alltoall
from shardsim.simulator.network.alltoall import Exchange
from shardsim.simulator.network.fluid import Network, Route
from shardsim.simulator.network.links import LinkGraph
from shardsim.simulator.network.nccl_runs import NCCL_ALGOS, WIRE_BYTES, Shape, compute_capability, nccl_call
from shardsim.simulator.network.nvlink_mesh import edge_shares, nvlink_GBps

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "send_recv", "all_to_all")
A2A_ALGOS = {"nccl": "p2p", "gloo": "pairwise"}  # what all-to-all runs on each backend (module alltoall)

# nccl-tests doc/PERFORMANCE.md: busbw = algbw × factor(n)
BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}


@dataclass(frozen=True)
class GroupLayout:
    """Ranks [start, start+count) split into groups of `size`.

    strided=False: groups are consecutive ranks (reshape(-1, size)); strided=True: groups
    are the columns of reshape(size, -1) (rank i goes with i + count/size, ...), the
    replica groups of ZeRO-2D. A device mesh with more dimensions adds two views first:
    the range is cut into `outer` consecutive blocks, and in each block the ranks are read as
    (n, `inner`), the layout applied along n for each inner index (ranks `inner` apart: the
    data-parallel groups beside `inner` tensor-parallel ranks).
    """

    start: int
    count: int
    size: int
    strided: bool = False
    reverse: bool = False  # reverse each group's order (the backward direction of send/recv)
    inner: int = 1
    outer: int = 1
    ends: bool = False  # each group's first and last rank only (a tied embedding's first and last pipeline stage)

    def groups(self) -> np.ndarray:
        r = np.arange(self.start, self.start + self.count)
        if self.inner > 1 or self.outer > 1:  # rows of n ranks, each laid out on its own
            r = r.reshape(self.outer, -1, self.inner).transpose(0, 2, 1).reshape(self.outer * self.inner, -1)
        else:
            r = r.reshape(1, -1)
        rows, n = r.shape
        if self.strided:
            g = r.reshape(rows, self.size, n // self.size).transpose(0, 2, 1).reshape(-1, self.size)
        else:
            g = r.reshape(-1, self.size)
        if self.ends:
            g = g[:, [0, -1]]
        return g[:, ::-1].copy() if self.reverse else g.copy()

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


def _ring_phase(
    g: LinkGraph, rings: np.ndarray, per_edge: float, steps_per_rank: int, wrap: bool = True, pairs: bool = False
) -> Phase:
    """All rings at once; every edge carries `per_edge` bytes (per byte of S). `pairs`: each edge is
    a communicator of its own two ranks (PyTorch's send / recv), not one of the ring's."""
    n = rings.shape[1]
    if n < 2 or per_edge <= 0:
        return Phase(np.zeros(0, np.int64), np.zeros(0), 0.0)
    src, dst = _ring_edges(rings, wrap)
    comms = np.stack([src, dst], axis=1) if pairs else rings
    rows = np.repeat(np.arange(comms.shape[0]), src.size // comms.shape[0])
    links, load = g.edge_loads(src, dst, per_edge / _mesh_shares(g, comms, src, dst), (comms, rows))
    return Phase(links, load, steps_per_rank * g.edge_latency(src, dst), float(src.size * per_edge))


def _mesh_shares(g: LinkGraph, groups: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray | float:
    """The share of its ports each edge (of the rows of `groups`, in order) runs at: on a node whose
    NVLinks form a mesh (`fabric.nvlink_mesh`), the rings NCCL finds over the group's GPUs there
    (module `nvlink_mesh`); 1 elsewhere."""
    inst = g.cluster.instance
    mesh = inst.fabric.nvlink_mesh
    if mesh is None:
        return 1.0
    link = nvlink_GBps(compute_capability(inst.device.model))
    return edge_shares(mesh, g.cluster.devices_per_node, link, groups, src, dst)


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


def _tree_phases(g: LinkGraph, groups: np.ndarray, comms: np.ndarray | None = None) -> list[Phase]:
    """NCCL-style tree all-reduce: intra-node chains + double binary tree over node heads, its bytes
    across nodes on the NICs of the GPUs each row of `comms` (the communicators; `groups` when None)
    holds on a node: NCCL's tree channels leave a node through every NIC its GPUs reach."""
    arr = _by_node(g, groups)
    if arr is None:
        raise ConfigError("tree all-reduce needs the same number of group ranks on every node", field="algo")
    G, m, k = arr.shape
    src_parts, dst_parts, bytes_parts, row_parts = [], [], [], []
    # chain inside each node: local i <-> i+1 carries S up (reduce) and S down (broadcast)
    if k > 1:  # on an NVLink mesh at the share of the rings over the node's group GPUs (as a ring's)
        a, b = arr[:, :, :-1].ravel(), arr[:, :, 1:].ravel()
        share = np.broadcast_to(_mesh_shares(g, arr.reshape(G * m, k), a, b), a.shape)
        src_parts += [b, a]
        dst_parts += [a, b]
        bytes_parts += [1 / share, 1 / share]
        row_parts += [np.repeat(np.arange(G), m * (k - 1))] * 2
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
            row_parts += [np.repeat(np.arange(G), m - 1)] * 2
        depth = int(math.floor(math.log2(m)))
    src = np.concatenate(src_parts)
    dst = np.concatenate(dst_parts)
    sent = np.concatenate(bytes_parts)
    rows = np.concatenate(row_parts)
    links, load = g.edge_loads(src, dst, sent, (groups if comms is None else comms, rows))
    latency = 2 * (depth * g.inter_latency_s + (k - 1) * g.intra_latency_s)
    moved = 2 * (k - 1) * G * m + (2 * G * (m - 1) if m > 1 else 0)  # S up and down each chain edge, S/2 each tree edge
    return [Phase(links, load, latency, float(moved))]


def _ring_plan(g: LinkGraph, op: str, groups: np.ndarray) -> list[Phase]:
    n = groups.shape[1]
    f = (n - 1) / n
    if op == "all_reduce":
        return [_ring_phase(g, groups, 2 * f, 2 * (n - 1))]
    if op in ("all_gather", "reduce_scatter"):
        return [_ring_phase(g, groups, f, n - 1)]
    if op == "broadcast":
        return [_ring_phase(g, groups, 1.0, n - 1, wrap=False)]
    if op == "send_recv":  # PyTorch's ProcessGroupNCCL sends over a communicator of the two peers
        return [_ring_phase(g, groups, 1.0, 1, wrap=False, pairs=True)]
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


@dataclass(frozen=True)
class Algo:
    """What a call runs: the algorithm, and NCCL's protocol ("" where NCCL's cost model does not
    apply: gloo, SageMaker's hierarchical collectives)."""

    name: str
    proto: str = ""

    def __str__(self) -> str:
        return f"{self.name}/{self.proto}" if self.proto else self.name


def _shape(groups: np.ndarray, devices_per_node: int) -> Shape:
    """A group as NCCL sees it (every group of a layout alike): its ranks and the nodes they span."""
    grp = groups[0]
    return Shape(int(grp.size), int(np.unique(grp // devices_per_node).size))


def algo_for(
    op: str,
    algo: str,
    layout: GroupLayout,
    devices_per_node: int,
    backend: str,
    g: LinkGraph | None = None,
    nbytes: float = 0.0,
    proto: str = "auto",
    mics: bool = False,
    exchange: Exchange | None = None,
) -> Algo:
    """What a call really runs. On NCCL, the algorithm and protocol NCCL's tuner picks for the
    call's size, ranks and nodes (`nccl_runs.nccl_call`), among all of them (`auto`) or only the
    one forced, as NCCL_ALGO / NCCL_PROTO would; `auto` takes SageMaker MiCS's hierarchical
    all-gather only for a group that spans nodes under SageMaker's library (`mics`). gloo has
    rings only; an algorithm that does not apply to the collective falls back to ring. All-to-all
    runs as point-to-point sends whatever `algo` (A2A_ALGOS), on NCCL with the protocol its sends
    take (`alltoall.protocol`, of `exchange`'s largest send; even when None) unless one is forced."""
    if op == "all_to_all":
        if backend != "nccl":
            return Algo(A2A_ALGOS[backend])
        if proto not in ("auto", ""):
            return Algo(A2A_ALGOS[backend], proto)
        n = layout.groups().shape[1]
        return Algo(A2A_ALGOS[backend], alltoall.protocol(float(nbytes), alltoall.shares(exchange, n)))
    if backend == "gloo":
        return Algo("ring")
    shape = _shape(layout.groups(), devices_per_node)
    hier_ops = ("all_reduce", "all_gather", "reduce_scatter")
    if algo == "hierarchical" or (algo == "auto" and mics and op == "all_gather"):
        if op in hier_ops and (algo == "hierarchical" or shape.nodes > 1):
            return Algo("hierarchical", "Simple")  # SageMaker's, over NCCL's Simple sends
        algo = "auto" if algo == "auto" else "ring"
    if algo == "tree" and op != "all_reduce":
        algo = "ring"
    if g is None:
        return Algo("ring" if algo == "auto" else algo, "Simple" if proto == "auto" else proto)
    call = nccl_call(g, op, shape, float(nbytes), algo, proto)
    if call is None:  # send/recv (outside NCCL's tuner), or a forced pair NCCL does not offer here
        fallback = nccl_call(g, op, shape, float(nbytes), "ring", proto)
        return Algo("ring", fallback.proto if fallback else ("Simple" if proto == "auto" else proto))
    return Algo(call.algo, call.proto)


def check_algo(op: str, algo: str, backend: str, proto: str = "auto") -> None:
    if op not in OPS:
        raise ConfigError(f"unknown collective {op!r}; expected one of {', '.join(OPS)}", field="op")
    if op == "all_to_all":
        _check_all_to_all(algo, backend, proto)
        return
    if algo not in ALGOS:
        raise ConfigError(f"unknown algorithm {algo!r}; expected one of {', '.join(ALGOS)}", field="algo")
    if backend not in ("nccl", "gloo"):
        raise ConfigError(f"unknown backend {backend!r}; expected nccl or gloo", field="backend")
    if backend == "gloo" and algo != "ring":
        raise ConfigError(f"gloo implements ring collectives only, not {algo}", field="algo")
    if backend == "gloo" and proto not in ("auto", ""):
        raise ConfigError(f"protocols are NCCL's; gloo has none (got {proto})", field="protocol")
    if proto not in ("auto", "", *PROTOCOLS):
        raise ConfigError(f"unknown protocol {proto!r}; expected one of {', '.join(PROTOCOLS)}", field="protocol")
    if algo == "tree" and op != "all_reduce":
        raise ConfigError(f"NCCL's tree algorithm is for all_reduce only, not {op}", field="algo")
    if algo == "nvls_tree" and op != "all_reduce":
        raise ConfigError(f"NCCL's NVLS-tree algorithm is for all_reduce only, not {op}", field="algo")
    if algo in ("nvls", "nvls_tree") and proto not in ("auto", "", "Simple"):
        raise ConfigError(f"NCCL runs {algo} with the Simple protocol only, not {proto}", field="protocol")


def _check_all_to_all(algo: str, backend: str, proto: str) -> None:
    if backend not in A2A_ALGOS:
        raise ConfigError(f"unknown backend {backend!r}; expected nccl or gloo", field="backend")
    runs = A2A_ALGOS[backend]
    if algo not in ("auto", runs):
        raise ConfigError(
            f"all_to_all runs as point-to-point sends to every peer ({runs} on {backend}), not {algo}:"
            " leave the algorithm auto",
            field="algo",
        )
    if backend == "gloo" and proto not in ("auto", ""):
        raise ConfigError(f"protocols are NCCL's; gloo has none (got {proto})", field="protocol")
    if proto not in ("auto", "", "LL", "Simple"):
        raise ConfigError(f"NCCL's point-to-point sends run LL or Simple, not {proto}", field="protocol")


# NVLink SHARP's ports run at this fraction of the rate a ring's edges get (a named choice):
# NCCL's tuner states NVLS's algorithm bandwidth as 5/6 of its bus bandwidth (tuning.cc v2.20.3-1
# line 217). With it an all-reduce over 8 H100s through NVLS comes to 480 GB/s busbw, what NCCL's
# maintainer reports on p5 against 370 GB/s for a ring (NVIDIA/nccl issue #1442; see
# p5.48xlarge.yaml's fabric.efficiency).
NVLS_EFFICIENCY = 5.0 / 6.0


def _nvls_phase(g: LinkGraph, op: str, groups: np.ndarray) -> Phase:
    """NVLink SHARP inside one node: the switch reduces what ranks load from it
    (multimem.ld_reduce) and replicates what they store to it (multimem.st). For a group of k
    ranks and S bytes, rank i reduces slice i: every rank sends S into the switch and takes S/k
    back; the all-gather half stores S/k and receives S (NCCL's nvls kernels,
    src/device/all_reduce.h `runRing`-free NVLS path)."""
    k = groups.shape[1]
    tx, rx = {"all_reduce": (1 + 1 / k, 1 + 1 / k), "all_gather": (1 / k, 1.0), "reduce_scatter": (1.0, 1 / k)}[op]
    links, load = g.port_loads(groups, tx / NVLS_EFFICIENCY, rx / NVLS_EFFICIENCY)
    return Phase(links, load, 0.0, float(groups.size * tx))


def _nvls_tree_phase(g: LinkGraph, groups: np.ndarray) -> Phase:
    """NVLS-tree all-reduce over nodes: NVLink SHARP reduces inside each node (as `_nvls_phase`),
    a double binary tree over nodes carries S per node up and down (half per tree, as
    `_tree_phases`), and NVLink SHARP replicates the result inside each node."""
    arr = _by_node(g, groups)
    if arr is None:
        raise ConfigError("NVLS-tree needs the same number of group ranks on every node", field="algo")
    G, m, k = arr.shape
    nvls = _nvls_phase(g, "all_reduce", arr.reshape(G * m, k))  # inside each node
    # the node-level trees, over one rank per node, through the NICs of every GPU of the group
    (tree,) = _tree_phases(g, arr[:, :, :1].reshape(G, m), arr.reshape(G, m * k))
    links = np.concatenate([nvls.links, tree.links])
    load = np.concatenate([nvls.load, tree.load])
    uniq, inv = np.unique(links, return_inverse=True)
    return Phase(uniq, np.bincount(inv, weights=load), 0.0, nvls.sent + tree.sent)


def _nccl_phases(g: LinkGraph, op: str, groups: np.ndarray, algo: str, proto: str, nbytes: float) -> list[Phase]:
    """One NCCL call as one phase: the algorithm's links, NCCL's latency, the protocol's factor
    and the NICs' achieved fraction at this size (module `nccl_runs`)."""
    if op == "send_recv":  # outside NCCL's tuner: the link's own latency (fabric / nic latency_us)
        ph = _ring_plan(g, op, groups)[0]
        latency = ph.latency_s
        factor = 1.0 / WIRE_BYTES[proto or "Simple"]
    else:
        call = nccl_call(g, op, _shape(groups, g.cluster.devices_per_node), float(nbytes), algo, proto)
        if call is None:
            why = " (LL128 needs NVLink inside a node and GPUDirect RDMA across nodes)" if proto == "LL128" else ""
            raise ConfigError(
                f"NCCL offers no {algo}/{proto} for {op} on {g.cluster.describe()}{why}", field="protocol"
            )
        if algo == "tree":
            (ph,) = _tree_phases(g, groups)
        elif algo == "nvls":
            ph = _nvls_phase(g, op, groups)
        elif algo == "nvls_tree":
            ph = _nvls_tree_phase(g, groups)
        else:
            (ph,) = _ring_plan(g, op, groups)
        latency, factor = call.latency_s, call.proto_factor
    if not ph.links.size:
        return []
    # the protocol's bandwidth relative to Simple (NCCL's model), then the NICs' rate by size
    return [_at_nic_rates(g, Phase(ph.links, ph.load / factor, latency, ph.sent), nbytes)]


def _at_nic_rates(g: LinkGraph, ph: Phase, nbytes: float) -> Phase:
    """`ph` with each NIC link's load divided by the fabric's achieved fraction at the bytes that
    NIC carries in this call (`NetworkFigures.factors`: EFA's rate by size), as NCCL's NICs run."""
    figures = g.cluster.instance.nic.figures
    if figures is None:
        return ph
    is_nic = g.is_nic(ph.links)
    load = ph.load.copy()
    load[is_nic] = ph.load[is_nic] / figures.factors(ph.load[is_nic] * nbytes)
    return Phase(ph.links, load, ph.latency_s, ph.sent)


def _phases(
    g: LinkGraph, op: str, layout: GroupLayout, algo: Algo, backend: str, nbytes: float, exchange: Exchange | None
) -> tuple[Phase, ...]:
    groups = layout.groups()
    if groups.shape[1] < 2:
        return ()
    if op == "all_to_all":
        ph = Phase(*alltoall.placed(g, groups, exchange, backend, algo.proto or "Simple"))
        if not ph.links.size:
            return ()
        return (_at_nic_rates(g, ph, nbytes),) if backend == "nccl" else (ph,)
    if backend == "gloo" and op == "reduce_scatter":
        op = "all_reduce"  # gloo: all-reduce of the whole tensor, then keep one chunk
    if algo.proto and backend == "nccl" and algo.name in NCCL_ALGOS:
        phases = _nccl_phases(g, op, groups, algo.name, algo.proto, nbytes)
    elif algo.name == "tree":
        phases = _tree_phases(g, groups)
    elif algo.name == "hierarchical":
        phases = _hier_plan(g, op, groups)
        if algo.proto:  # over NCCL: its NICs run as NCCL's do
            phases = [_at_nic_rates(g, ph, nbytes) for ph in phases]
    else:
        phases = _ring_plan(g, op, groups)
        if backend == "gloo" and op == "all_gather" and groups.shape[1] == 2:
            phases = [_pair_gather(g, ph) for ph in phases]
    return tuple(p for p in phases if p.links.size)


def _pair_gather(g: LinkGraph, ph: Phase) -> Phase:
    """gloo's all-gather over 2-rank groups: each NIC link's load over the NIC's measured
    `pair_gather_efficiency` (both halves of the ring run both ways on one TCP pair; on the
    emulated NICs that gets about 3/4 of what a longer ring does: a measured figure, 1.0 unless
    a profile has it)."""
    eff = g.cluster.instance.nic.pair_gather_efficiency
    if eff >= 1.0:
        return ph
    is_nic = g.is_nic(ph.links)
    load = ph.load.copy()
    load[is_nic] = ph.load[is_nic] / eff
    return Phase(ph.links, load, ph.latency_s, ph.sent)


PLAN_CACHE_BYTES = 128 * 2**20  # the planned phases' arrays a process keeps (a phase of 16,384 ranks: ~3 MB)
PLAN_CACHE_ENTRIES = 4096  # and at most this many calls' phases


class _PlanCache:
    """The phases of each (graph, collective, layout, algorithm, backend; size on NCCL's path), the least recently
    used dropped once their arrays pass PLAN_CACHE_BYTES (or PLAN_CACHE_ENTRIES): a sweep calls the same few collectives
    thousands of times, and over a big cluster every phase holds arrays as long as its links."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.nbytes = 0
        self.entries: OrderedDict[tuple, tuple[tuple[Phase, ...], int]] = OrderedDict()

    def __call__(
        self,
        g: LinkGraph,
        op: str,
        layout: GroupLayout,
        algo: Algo,
        backend: str,
        nbytes: float,
        exchange: Exchange | None = None,
    ) -> tuple[Phase, ...]:
        key = (g, op, layout, algo, backend, nbytes if algo.proto else 0.0, exchange)
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
            return hit[0]
        phases = _phases(g, op, layout, algo, backend, nbytes, exchange)
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


def plan(
    g: LinkGraph,
    op: str,
    layout: GroupLayout,
    algo: Algo | str = "ring",
    backend: str = "nccl",
    nbytes: float = 0.0,
    exchange: Exchange | None = None,
) -> tuple[Phase, ...]:
    """Per-byte phases of one SPMD collective call over all groups of `layout`: NCCL's path
    (`_nccl_phases`) for an `Algo` with a protocol, whose phases depend on the call's size
    `nbytes`; the link-latency model otherwise (gloo, hierarchical, a bare algorithm name). An
    all-to-all's sends are `exchange`'s (even when None; module `alltoall`)."""
    a = algo if isinstance(algo, Algo) else Algo(algo)
    check_algo(op, a.name, backend, a.proto or "auto")
    if exchange is not None and op != "all_to_all":
        raise ConfigError(f"per-peer bytes are all_to_all's, not {op}'s", field="exchange")
    return _plan_cached(g, op, layout, a, backend, float(nbytes), exchange)


def phase_time(g: LinkGraph, phase: Phase, nbytes: float) -> float:
    """Time of one phase alone on the network."""
    return phase.latency_s + float(np.max(phase.load * nbytes / g.capacity[phase.links]))


def call_alone_s(
    g: LinkGraph,
    op: str,
    layout: GroupLayout,
    nbytes: float,
    algo: str,
    backend: str,
    mics: bool = False,
    exchange: Exchange | None = None,
) -> float:
    """Seconds of one call of `op` over `layout` alone on the network: what the engine runs for
    it (`algo_for`, `plan`), each phase's latency then its bytes at its bottleneck
    link. Nothing in a simulation runs it faster (shared links and a host's cores only slow it).
    An all-to-all sends as `exchange` says (even when None): an uneven one waits for its busiest
    link."""
    if layout.size < 2 or nbytes <= 0:
        return 0.0
    dpn = g.cluster.devices_per_node
    used = algo_for(op, algo, layout, dpn, backend, g, nbytes, mics=mics, exchange=exchange)
    return sum(phase_time(g, ph, nbytes) for ph in plan(g, op, layout, used, backend, nbytes, exchange))


def all_to_all_v_s(g: LinkGraph, layout: GroupLayout, counts, backend: str = "nccl") -> float:
    """Seconds of an all-to-all in every group of `layout` whose rank i sends counts[i][j] bytes to
    rank j, alone on the network (`call_alone_s` of its `Exchange`)."""
    exchange, nbytes = Exchange.of_bytes(counts)
    return call_alone_s(g, "all_to_all", layout, nbytes, "auto", backend, exchange=exchange)


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
    each phase waits its latency (`Network.call_in`), then moves its bytes; `on_done()` runs when the
    last one ends (at once when there are none). Call `next()` to start."""

    net: Network
    steps: Steps
    nbytes: float
    tag: str
    on_done: Callable[[], object]
    i: int = 0  # the phase to start next
    waited: bool = False  # its latency is over

    def next(self, _arg: object = None) -> None:
        """Start the next phase (or its latency), or end the call: `on_done` of the phase before and
        what its latency's end calls (`_arg`, unused)."""
        i = self.i
        if i == len(self.steps):
            self.on_done()
            return
        latency, route = self.steps[i]
        if latency and not self.waited:
            self.waited = True
            self.net.call_in(latency, self.next)
            return
        self.i, self.waited = i + 1, False
        self.net.send(route, self.nbytes, self.tag, self.next)
