"""All-to-all as NCCL and gloo run it: point-to-point sends from every rank to every other rank
of its group, all in flight at once, placed on the cluster's links.

Sizes follow nccl-tests' alltoall_perf: S is a rank's whole send buffer; evenly, each rank sends
S/n to each of the n - 1 others and keeps S/n (busbw = algbw × (n - 1)/n, nccl-tests
doc/PERFORMANCE.md). An uneven all-to-all (all_to_all_v, an MoE dispatch or combine) is an
`Exchange`: the share of S each rank sends each other rank.

NCCL (v2.20.3-1, the version of `nccl_model`), named choices:
- The call: ncclGroupStart, then ncclSend / ncclRecv to and from every peer (nccl-tests
  src/alltoall.cu; PyTorch's all_to_all_single on NCCL likewise; NCCL 2.28's ncclAlltoAll appends
  the same send and receive tasks, src/enqueue.cc taskAppend). No ring, no tuner: NCCL's tuner has
  no entry for them (src/include/nccl_common.h).
- Concurrency: every peer's transfer moves at once, sharing links max-min fairly (the fluid
  network). NCCL spreads the peers over its p2p channels, up to 8 sends and 8 receives a work
  (NCCL_MAX_WORK_ELEMENTS_P2P 16, src/include/device.h; channel base = node delta + local step / 8,
  src/include/channel.h ncclChannelComputeBase): where the peers' channel bases outnumber the p2p
  channels, works on one channel run one after another (`rounds`), which adds their latency; the
  bandwidth a channel's thread block can move is not a limit here (the links are).
- Channels (src/graph/paths.cc ncclTopoComputeP2pChannels): p2pnChannels is the communicator's
  channels (`nccl_runs.channels`) rounded up to a power of two, at most MAXCHANNELS 32.
- Paths: NVLink / NVSwitch or PCIe inside a node; across nodes the NICs of each GPU's rail, with
  PXN where NCCL uses it (`LinkGraph.p2p_loads`; `pxn`).
- Protocol: LL for a send of at most NCCL_P2P_LL_THRESHOLD 16 KiB, else Simple (src/enqueue.cc
  addP2pToPlan); LL moves 8 bytes of data in 16 on the wire (`nccl_runs.WIRE_BYTES`).
- Latency: NCCL states none for send / receive, so the call's is taken from its tuner's ring
  figures for the protocol (src/graph/tuning.cc v2.20.3-1, lines 54-78 and 229-230): the base
  latency (the kernel's launch) plus, for each round, one hop's (NVLink, PCIe, or the network's
  with the plugin's latencyInter, twice for Simple, as the tuner adds it to a network hop).
- The NICs run at the fabric's achieved fraction by the bytes each carries in the call
  (`NetworkFigures.factors`), as every NCCL call here.

gloo (gloo/alltoall.cc): the local chunk copied, then a send to and a receive from every peer
posted at once ((rank ± i) mod n) and all waited for: the same concurrent transfers, one hop's
latency (the link's own, `LinkGraph.edge_latency`), no protocol; inter-node bytes on the node's
own rails (no PXN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from shardsim.core.errors import ConfigError
from shardsim.simulator.network import nccl_model as nm
from shardsim.simulator.network.links import LinkGraph
from shardsim.simulator.network.nccl_runs import WIRE_BYTES, channels

P2P_LL_THRESHOLD = 16384  # src/enqueue.cc NCCL_P2P_LL_THRESHOLD: a send of at most this many bytes goes by LL
P2P_WORK_PEERS = 8  # src/include/device.h NCCL_MAX_WORK_ELEMENTS_P2P / 2: sends of one work on one channel
MAXCHANNELS = 32  # src/include/device.h


@dataclass(frozen=True)
class Exchange:
    """What each rank of a group sends each rank of it, as shares of S (row i: rank i's sends; the
    diagonal stays local). The rows average 1: S is the mean send buffer. The same in every group
    of a layout."""

    shares: tuple[tuple[float, ...], ...]

    @cached_property
    def _hash(self) -> int:
        return hash(self.shares)

    def __hash__(self) -> int:  # once per exchange: the engine looks its ops' phases up by it
        return self._hash

    @property
    def n(self) -> int:
        return len(self.shares)

    @classmethod
    def even(cls, n: int) -> Exchange:
        """S/n to every rank: nccl-tests' alltoall, an MoE dispatch with perfect balance."""
        return cls(tuple(tuple(1.0 / n for _ in range(n)) for _ in range(n)))

    @classmethod
    @lru_cache(maxsize=256)  # one object per (n, factor, rank): a plan asks for it every MoE layer and microbatch
    def busiest(cls, n: int, factor: float, rank: int = 0) -> Exchange:
        """Every rank sends `rank` factor × S/n and the others the rest evenly: `rank` receives
        `factor` times the mean (an MoE dispatch whose busiest expert rank takes `factor` × the mean
        tokens; its combine is `transposed`). 1 ≤ factor ≤ n."""
        if n < 1 or not 1.0 <= factor <= n or not 0 <= rank < n:
            raise ConfigError(
                f"a busiest-rank factor is from 1 to the group's {n} ranks, not {factor:g}", field="imbalance"
            )
        hot = factor / n
        rest = (1.0 - hot) / (n - 1) if n > 1 else 0.0
        return cls(tuple(tuple(hot if j == rank else rest for j in range(n)) for _ in range(n)))

    @classmethod
    def of_bytes(cls, counts) -> tuple[Exchange, float]:
        """The exchange of per-pair byte counts (counts[i][j]: rank i to rank j) and its S, the
        mean bytes a rank sends (the diagonal included)."""
        a = np.asarray(counts, dtype=np.float64)
        if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] < 1:
            raise ConfigError(f"per-peer bytes are a square table, not of shape {a.shape}", field="exchange")
        if not np.isfinite(a).all() or (a < 0).any():
            raise ConfigError("per-peer bytes are finite numbers >= 0", field="exchange")
        s = float(a.sum(axis=1).mean())
        if s <= 0:
            raise ConfigError("per-peer bytes are all 0: nothing moves", field="exchange")
        return cls(tuple(tuple(float(x) for x in row) for row in a / s)), s

    def transposed(self) -> Exchange:
        """The reverse exchange (an MoE combine returns what its dispatch sent)."""
        return self._transposed

    @cached_property
    def _transposed(self) -> Exchange:  # one object: the engine hashes each exchange once
        return Exchange(tuple(zip(*self.shares, strict=True)))

    def matrix(self) -> np.ndarray:
        return np.asarray(self.shares, dtype=np.float64)


def shares(exchange: Exchange | None, n: int) -> np.ndarray:
    """The (n, n) shares of `exchange` (even when None), checked against the group's size."""
    ex = exchange or Exchange.even(n)
    if ex.n != n:
        raise ConfigError(f"an exchange of {ex.n} ranks over groups of {n}", field="exchange")
    return ex.matrix()


def pxn(g: LinkGraph) -> bool:
    """Does NCCL send to another node's GPU through the NVLink-local GPU on the NIC of the peer's
    rail (PXN)? At NCCL_P2P_PXN_LEVEL 2 (the default, src/graph/search.cc) where that GPU reaches
    the sender over NVLink and the NIC over PCIe, with GPUDirect RDMA (src/graph/paths.cc
    ncclTopoGetPxnRanks): NVSwitch nodes with GPUDirect RDMA and more than one NIC (p4d, p5). On
    NVLink without a switch (p3dn) not every GPU pair has a direct path: left out."""
    inst = g.cluster.instance
    return inst.fabric.kind == "nvswitch" and inst.nic.gpudirect_rdma and inst.nic.count > 1


def pairs(groups: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, share of S) of every send between two ranks of a group, every group alike."""
    i, j = np.nonzero(weights * (1 - np.eye(len(weights))))
    return groups[:, i].ravel(), groups[:, j].ravel(), np.tile(weights[i, j], groups.shape[0])


def protocol(nbytes: float, weights: np.ndarray) -> str:
    """NCCL's protocol for the call: LL where its largest send is at most P2P_LL_THRESHOLD."""
    off = weights * (1 - np.eye(len(weights)))
    return "LL" if nbytes * float(off.max(initial=0.0)) <= P2P_LL_THRESHOLD else "Simple"


def p2p_channels(g: LinkGraph) -> int:
    """NCCL's p2pnChannels: the communicator's channels rounded up to a power of two (paths.cc)."""
    return min(MAXCHANNELS, 1 << (channels(g.cluster) - 1).bit_length())


def rounds(g: LinkGraph, groups: np.ndarray) -> int:
    """The works one p2p channel runs one after another: the peers' channel bases (one a remote
    node and group of 8 local ranks; one a local rank inside a node) over the p2p channels."""
    k = g.cluster.devices_per_node
    nodes = np.unique(groups[0] // k).size
    local = int(np.max(np.unique(groups[0] // k, return_counts=True)[1]))
    bases = nodes + math.ceil(local / P2P_WORK_PEERS) - 1 if nodes > 1 else local
    return max(1, math.ceil(bases / p2p_channels(g)))


def nccl_latency_s(g: LinkGraph, groups: np.ndarray, proto: str) -> float:
    """The call's latency (see the module's docstring): the base, then a hop a round."""
    p = nm.PROTOS.index(proto)
    k = g.cluster.devices_per_node
    inter = np.unique(groups[0] // k).size > 1
    if inter:
        figures = g.cluster.instance.nic.figures
        lat_inter = figures.latency_inter_us if figures else 0.0
        hop = nm.HW_LAT["net"]["ring"][p] + lat_inter * (2 if proto == "Simple" else 1)
    else:
        hop = nm.HW_LAT["nvlink" if g.cluster.instance.fabric.kind in ("nvlink", "nvswitch") else "pci"]["ring"][p]
    return (nm.BASE_LAT["ring"][p] + rounds(g, groups) * hop) * 1e-6


def placed(
    g: LinkGraph, groups: np.ndarray, exchange: Exchange | None, backend: str, proto: str
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """One all-to-all over every group at once: (links, bytes on each per byte of S, latency in
    seconds, bytes all ranks send per byte of S). On NCCL the bytes are those on the wire of
    `proto` (LL's flags included)."""
    w = shares(exchange, groups.shape[1])
    src, dst, share = pairs(groups, w)
    nccl = backend == "nccl"
    links, load = g.p2p_loads(src, dst, share, pxn(g) if nccl else False)
    if nccl:
        load = load * WIRE_BYTES[proto]
        latency = nccl_latency_s(g, groups, proto)
    else:
        latency = g.edge_latency(src, dst)
    return links, load, latency, float(share.sum())
