"""The cluster's links as arrays: who carries which bytes from one rank to another.

Every device has a port to its node's fabric (tx and rx, each at the port rate); a PCIe
node may also have one shared resource (the host bridge) that all its intra-node traffic
crosses; every node has NICs (tx and rx). Rates are spec × efficiency, in bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

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

    def edge_loads(self, src: np.ndarray, dst: np.ndarray, nbytes: float | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each link carries when every src[i] sends nbytes to dst[i] (vectorized).

        Returns (link indices, bytes) with indices unique. Inter-node bytes are spread evenly
        over the node's NICs: NCCL opens several channels (rings) whose node crossings use
        different NICs (assumption named NCCL_CHANNEL_SPREAD). On PCIe and loopback fabrics
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
            share = b[inter] / nics
            for j in range(nics):
                idx_parts += [self._nic_tx + sn[inter] * nics + j, self._nic_rx + dn[inter] * nics + j]
                byte_parts += [share, share]
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

    def rails(self) -> tuple[np.ndarray, int]:
        """The first NIC of each local GPU's rail and the NICs a rail has: GPU l of k takes NICs from
        l·m // k, m / k of them (p5: 4 of 32), or one shared by k / m GPUs where a node has fewer NICs
        than GPUs (p4d: one of 4 a pair), as the instance's PCIe switches pair them."""
        k, m = self.cluster.devices_per_node, self.cluster.instance.nic.count
        return np.arange(k) * m // k, max(m // k, 1)

    def rail_gpu(self, local: np.ndarray) -> np.ndarray:
        """The local GPU next to the first NIC of each local GPU's rail (itself where it has its own)."""
        k, m = self.cluster.devices_per_node, self.cluster.instance.nic.count
        first = np.asarray(local) * m // k
        return -(-first * k // m)

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
