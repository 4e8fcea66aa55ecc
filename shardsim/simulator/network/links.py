"""The cluster's links as arrays: who carries which bytes from one rank to another.

Every device has a port to its node's fabric (tx and rx, each at the port rate); a PCIe
node may also have one shared resource (the host bridge) that all its intra-node traffic
crosses; every node has NICs (tx and rx). Rates are spec × efficiency, in bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from shardsim.simulator.network.members import MAX_MASK_GPUS, local_sets, node_masks
from shardsim.specs.hardware.topology import Cluster

GRAPHS_KEPT = 8  # clusters whose link graphs `links_for` keeps (a sweep visits a few)
_graphs: dict[str, LinkGraph] = {}


@dataclass(frozen=True, eq=False)  # identity hash: plans are cached per graph
class LinkGraph:
    cluster: Cluster
    capacity: np.ndarray  # bytes/s per link
    segments: tuple[tuple[str, int], ...]  # (label, count) of consecutive links: port_tx, port_rx, ...
    intra_latency_s: float
    inter_latency_s: float
    _port_tx: int
    _port_rx: int
    _bridge: int  # -1 when the node has no shared bridge
    _nic_tx: int
    _nic_rx: int

    @property
    def n_links(self) -> int:
        return len(self.capacity)

    @cached_property
    def names(self) -> tuple[str, ...]:
        """Every link's name, e.g. ``nic_tx[3]`` (made when asked: a big cluster has 10^5 links)."""
        return tuple(f"{label}[{i}]" for label, count in self.segments for i in range(count))

    def edge_loads(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        nbytes: float | np.ndarray,
        comms: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each link carries when every src[i] sends nbytes to dst[i] (vectorized).

        Returns (link indices, bytes) with indices unique. Inter-node bytes leave and enter a node
        spread evenly over the NICs of the rails (`rails`) of the GPUs the edge's communicator holds
        on that node (`nic_weights`; `comms`: the communicators as rows of ranks and the row of each
        edge; None: every NIC of the node). NCCL opens several channels (rings) whose node crossings
        use different NICs (assumption named NCCL_CHANNEL_SPREAD), each the NIC next to a GPU of the
        communicator: the search takes a NIC on the GPU's PCIe switch (path PIX) or, with PXN (NCCL
        2.12 and later unless NCCL_PXN_DISABLE=1), one next to another of the communicator's GPUs
        reached over NVLink (NCCL v2.20.3-1 paths.cc "Update paths for NICs": the relay is the GPU
        local to the NIC, on its PCIe switch and NVLink-connected, sending only, receiving locally;
        search.cc `ncclTopoCompute` raises typeInter up to PATH_PXN; a GPU outside the communicator
        is not in its system, so its NIC is not reached that way). On PCIe and loopback fabrics
        inter-node bytes also cross the device port and the host bridge (no GPUDirect RDMA
        on these instances); on NVLink/NVSwitch nodes they go GPU → PCIe switch → NIC,
        which is not modelled as a bottleneck.
        """
        c = self.cluster
        k = c.devices_per_node
        nics = c.instance.nic.count
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        b = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), src.shape)
        keep = src != dst
        src, dst, b = src[keep], dst[keep], b[keep]
        sn, dn = src // k, dst // k
        intra = sn == dn
        idx_parts = []
        byte_parts = []
        via_device = self.cluster.instance.fabric.kind in ("pcie", "loopback")
        # device ports: all intra traffic, and inter traffic on PCIe-style nodes
        use_port = intra | via_device
        idx_parts += [self._port_tx + src[use_port], self._port_rx + dst[use_port]]
        byte_parts += [b[use_port], b[use_port]]
        if self._bridge >= 0:
            # intra traffic crosses the bridge once; inter traffic once at each end
            idx_parts += [self._bridge + sn[use_port], self._bridge + dn[use_port & ~intra]]
            byte_parts += [b[use_port], b[use_port & ~intra]]
        inter = ~intra
        if inter.any():
            bi, si, di = b[inter], sn[inter], dn[inter]
            weights = None
            if comms is not None and k <= MAX_MASK_GPUS:
                groups, rows = comms
                row = np.asarray(rows, dtype=np.int64).ravel()[keep][inter]
                weights = (self.nic_weights(groups, row, si), self.nic_weights(groups, row, di))
            if weights is None or all(w is None for w in weights):  # every edge on every NIC
                share = bi / nics
                for j in range(nics):
                    idx_parts += [self._nic_tx + si * nics + j, self._nic_rx + di * nics + j]
                    byte_parts += [share, share]
            else:
                for base, node, w in ((self._nic_tx, si, weights[0]), (self._nic_rx, di, weights[1])):
                    w = np.full((bi.size, nics), 1.0 / nics) if w is None else w
                    edge, nic = np.nonzero(w)  # only the NICs each edge crosses
                    idx_parts.append(base + node[edge] * nics + nic)
                    byte_parts.append(bi[edge] * w[edge, nic])
        idx = np.concatenate(idx_parts) if idx_parts else np.zeros(0, np.int64)
        byt = np.concatenate(byte_parts) if byte_parts else np.zeros(0)
        loads = np.bincount(idx, weights=byt, minlength=self.n_links)
        nz = np.flatnonzero(loads)
        return nz, loads[nz]

    def p2p_loads(
        self, src: np.ndarray, dst: np.ndarray, nbytes: np.ndarray, pxn: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each link carries when every src[i] sends nbytes[i] to dst[i] by point-to-point
        sends on NIC rails (an all-to-all), as `edge_loads` returns them.

        Inside a node as `edge_loads`. Across nodes, GPU l of k uses the NICs of its rail (`rails`):
        the receiver always takes bytes on its own rail (NCCL receives locally, src/transport/net.cc
        recvSetup); the sender puts them on its own rail, or with `pxn` on the NIC of the receiver's
        rail, reached over NVLink through the GPU of that rail (NCCL's PXN, src/graph/search.cc
        ncclTopoGetNetDev at NCCL_P2P_PXN_LEVEL 2). On PCIe and loopback nodes the bytes also cross
        the device ports and the host bridge, as in `edge_loads`."""
        c = self.cluster
        k = c.devices_per_node
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        b = np.broadcast_to(np.asarray(nbytes, dtype=np.float64), src.shape)
        keep = (src != dst) & (b > 0)
        src, dst, b = src[keep], dst[keep], b[keep]
        sn, dn = src // k, dst // k
        inter = sn != dn
        via_device = c.instance.fabric.kind in ("pcie", "loopback")
        use_port = ~inter | via_device
        idx = [self._port_tx + src[use_port], self._port_rx + dst[use_port]]
        byt = [b[use_port], b[use_port]]
        if self._bridge >= 0:
            idx += [self._bridge + sn[use_port], self._bridge + dn[use_port & inter]]
            byt += [b[use_port], b[use_port & inter]]
        if inter.any():
            s, d, bi = src[inter], dst[inter], b[inter]
            first, per = self.rails()
            nics = c.instance.nic.count
            rail = d % k if pxn else s % k
            if pxn:  # the NVLink hop to the GPU next to the NIC of the receiver's rail
                proxy = s // k * k + self.rail_gpu(d % k)
                hop = proxy != s
                idx += [self._port_tx + s[hop], self._port_rx + proxy[hop]]
                byt += [bi[hop], bi[hop]]
            share = bi / per
            for j in range(per):
                idx += [self._nic_tx + s // k * nics + first[rail] + j, self._nic_rx + d // k * nics + first[d % k] + j]
                byt += [share, share]
        loads = np.bincount(np.concatenate(idx), weights=np.concatenate(byt), minlength=self.n_links)
        nz = np.flatnonzero(loads)
        return nz, loads[nz]

    def nic_weights(self, groups: np.ndarray, rows: np.ndarray, nodes: np.ndarray) -> np.ndarray | None:
        """(edges, NICs): the share of each edge's bytes on each NIC of its node, evenly over the NICs
        of the rails of the local GPUs that row rows[i] of `groups` holds on node nodes[i]; None
        when every edge's GPUs reach every NIC (an even spread)."""
        k, m = self.cluster.devices_per_node, self.cluster.instance.nic.count
        first, per = self.rails()
        masks, n = node_masks(groups, k)
        local, inverse = local_sets(masks[np.asarray(rows) * n + np.asarray(nodes)], k)
        weights = np.zeros((len(local), m))
        for i, gpus in enumerate(local):
            for gpu in gpus:
                weights[i, first[gpu] : first[gpu] + per] = 1.0
        if weights.all():
            return None
        return (weights / weights.sum(axis=1, keepdims=True))[inverse]

    def rails(self) -> tuple[np.ndarray, int]:
        """The first NIC of each local GPU's rail and the NICs a rail has: the NICs behind the GPU's
        PCIe switch (`nic.gpu_nics`), or where a topology does not list them, GPU l of k takes NICs
        from l·m // k, m / k of them (p5: 4 of 32), or one shared by k / m GPUs where a node has
        fewer NICs than GPUs (p4d: one of 4 a pair)."""
        nic = self.cluster.instance.nic
        k, m = self.cluster.devices_per_node, nic.count
        if nic.gpu_nics is not None:
            return np.array([row[0] for row in nic.gpu_nics[:k]]), len(nic.gpu_nics[0])
        return np.arange(k) * m // k, max(m // k, 1)

    def rail_gpu(self, local: np.ndarray) -> np.ndarray:
        """The local GPU next to the first NIC of each local GPU's rail (the first of those sharing
        it; itself where it has its own)."""
        first, _ = self.rails()
        owner = {int(f): i for i, f in reversed(list(enumerate(first)))}
        return np.array([owner[int(f)] for f in first])[np.asarray(local)]

    def port_loads(self, ranks: np.ndarray, tx: float, rx: float) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's fabric port carrying `tx` bytes out and `rx` in (per byte of S): traffic
        through the NVSwitch that is no rank-to-rank edge (NVLink SHARP's reductions, multicast)."""
        ranks = np.asarray(ranks, dtype=np.int64).ravel()
        idx = np.concatenate([self._port_tx + ranks, self._port_rx + ranks])
        byt = np.concatenate([np.full(ranks.size, float(tx)), np.full(ranks.size, float(rx))])
        loads = np.bincount(idx, weights=byt, minlength=self.n_links)
        nz = np.flatnonzero(loads)
        return nz, loads[nz]

    def is_nic(self, links: np.ndarray) -> np.ndarray:
        """Which of these link indices are NICs (tx or rx)."""
        n = self.cluster.nodes * self.cluster.instance.nic.count
        return (links >= self._nic_tx) & (links < self._nic_tx + n) | (links >= self._nic_rx) & (
            links < self._nic_rx + n
        )

    def edge_latency(self, src: np.ndarray, dst: np.ndarray) -> float:
        """The largest one-hop latency among these edges (a ring step waits for its slowest hop)."""
        k = self.cluster.devices_per_node
        src = np.asarray(src).ravel()
        dst = np.asarray(dst).ravel()
        if src.size == 0:
            return 0.0
        inter = (src // k) != (dst // k)
        return self.inter_latency_s if inter.any() else self.intra_latency_s


def build_links(cluster: Cluster) -> LinkGraph:
    inst = cluster.instance
    n, k = cluster.nodes, cluster.devices_per_node
    fab, nic = inst.fabric, inst.nic
    port = fab.port_GBps * 1e9 * fab.efficiency
    nic_rate = nic.rate_gbps * 1e9 / 8 * nic.efficiency
    caps: list[np.ndarray] = []
    segments: list[tuple[str, int]] = []
    offset = 0

    def add(count: int, rate: float, label: str) -> int:
        nonlocal offset
        start = offset
        caps.append(np.full(count, rate))
        segments.append((label, count))
        offset += count
        return start

    port_tx = add(n * k, port, "port_tx")
    port_rx = add(n * k, port, "port_rx")
    bridge = add(n, fab.shared_GBps * 1e9 * fab.efficiency, "bridge") if fab.shared_GBps else -1
    nic_tx = add(n * nic.count, nic_rate, "nic_tx")
    nic_rx = add(n * nic.count, nic_rate, "nic_rx")
    return LinkGraph(
        cluster=cluster,
        capacity=np.concatenate(caps),
        segments=tuple(segments),
        intra_latency_s=fab.latency_us * 1e-6,
        inter_latency_s=nic.latency_us * 1e-6,
        _port_tx=port_tx,
        _port_rx=port_rx,
        _bridge=bridge,
        _nic_tx=nic_tx,
        _nic_rx=nic_rx,
    )


def links_for(cluster: Cluster) -> LinkGraph:
    """build_links, once per cluster (by value: a sweep's worker receives a copy of the cluster
    with every configuration), so the collectives' phases, cached per graph, are planned once
    per cluster and not once per prediction. Its capacity array is made read-only."""
    key = repr(cluster)  # every field, floats exactly (a Cluster holds dicts: no value hash)
    g = _graphs.get(key)
    if g is None:
        if len(_graphs) >= GRAPHS_KEPT:
            del _graphs[next(iter(_graphs))]  # the oldest
        g = _graphs[key] = build_links(cluster)
        g.capacity.flags.writeable = False
    return g
