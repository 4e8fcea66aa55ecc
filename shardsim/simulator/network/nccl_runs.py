"""Collectives as NCCL runs them: the algorithm and protocol NCCL's tuner picks for a call
(`nccl_model.py`, NCCL v2.20.3-1), placed on the cluster's links.

For one call of S bytes over a group layout:
- **What NCCL knows** (`nccl_system`): ranks and nodes of a group, the GPU generation, the CPU
  vendor, NVLink or PCIe inside a node, NVLink SHARP, GPUDirect RDMA, and the fabric's
  `latencyInter` (`NicSpec.figures`). Channels and per-channel bandwidth stand in for NCCL's
  topology search (`search.cc`, not run here), named NCCL_CHANNELS below.
- **The choice**: `nccl_model.choose` over the algorithms and protocols allowed (all, or those
  a user forces as NCCL_ALGO / NCCL_PROTO would).
- **The time**: NCCL's latency for that (algorithm, protocol) (`latency_bandwidth`), plus the
  bytes on the links of the algorithm's pattern (ring edges, trees, the NVSwitch's
  multicast), each link at its rate. Two factors bend the links' rates, both named where
  they are applied: the protocol's bandwidth relative to Simple as NCCL's model states it
  (LL's and LL128's factors and caps; the tree correction by size), and the NIC's achieved
  fraction by the bytes it carries in the call (`NetworkFigures.factors`). Contention with
  other calls goes through the max-min fair network as every phase does.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from shardsim.simulator.network import nccl_model as nm
from shardsim.simulator.network.links import LinkGraph
from shardsim.specs.hardware.topology import Cluster

# NCCL_CHANNELS (assumption, not NCCL's search): the rings NCCL opens per communicator. On
# NVLink / NVSwitch nodes 16 (MAXCHANNELS/2; NCCL's log on p5 shows rings of 16 channels,
# awslabs/awsome-distributed-ai issue #386 "Channel 12/16"; assumed on every NVLink node); on
# PCIe nodes 2 (NCCL's search finds one PCIe path per GPU and duplicates it). The
# per-channel bandwidth is the GPU's share of the slower of the fabric and the node's NICs,
# not quantized to search.cc's speed arrays.
CHANNELS_NVLINK = 16
CHANNELS_PCIE = 2

# Compute capability by GPU model (NVIDIA CUDA GPUs list); NCCL's tables are indexed by it.
COMPUTE_CAPABILITY = (
    ("H200", 90),
    ("H100", 90),
    ("A100", 80),
    ("A10G", 86),
    ("L40S", 89),
    ("L4", 89),
    ("V100", 70),
    ("T4", 75),
)

# Bytes on the wire per byte of data, by protocol (NCCL's device code): LL sends 8 bytes of
# data with 8 of flags in each 16-byte line (src/device/prims_ll.h), LL128 120 of every 128
# (src/include/device.h NCCL_LL128_DATAELEMS 14 of NCCL_LL128_LINEELEMS 16 eight-byte words),
# Simple none. Used only where NCCL's model states no bandwidth of its own (send/recv).
WIRE_BYTES = {"LL": 2.0, "LL128": 16.0 / 15.0, "Simple": 1.0}

NCCL_ALGOS = ("ring", "tree", "nvls", "nvls_tree")  # the flat algorithms this module places


@dataclass(frozen=True)
class Shape:
    """A group as NCCL's tuner sees it: ranks, and nodes they span."""

    ranks: int
    nodes: int


def channels(cluster: Cluster) -> int:
    """The channels NCCL opens on `cluster`'s nodes (NCCL_CHANNELS): one CTA each while it runs."""
    return CHANNELS_NVLINK if cluster.instance.fabric.kind in ("nvlink", "nvswitch") else CHANNELS_PCIE


def compute_capability(model: str) -> int:
    """The GPU's compute capability ×10 (0 for a device not listed: no LL128, Volta's tables)."""
    for name, cc in COMPUTE_CAPABILITY:
        if name in model:
            return cc
    return 0


def nccl_system(cluster: Cluster, shape: Shape) -> nm.NcclSystem:
    """What NCCL's tuner knows about a communicator of `shape` on `cluster`."""
    inst = cluster.instance
    fab, nic = inst.fabric, inst.nic
    nvlink = fab.kind in ("nvlink", "nvswitch")
    nch = channels(cluster)
    k = cluster.devices_per_node
    intra = fab.port_GBps * fab.efficiency  # one GPU's share of the fabric, GB/s
    inter = nic.count * nic.rate_gbps / 8 * nic.efficiency  # the node's NICs, GB/s
    bw_intra = intra / nch
    bw_inter = inter / nch
    # search.cc (v2.20.3-1, ncclTopoSearchRecNet): a balanced tree counts half of a NIC's
    # bandwidth on each of the two GPUs next to it (the tree's traffic up and down shares it),
    # so the tree graph settles at up to twice the per-channel speed of the ring graph where the
    # NICs bound it: a tree moves S per node across the network, a ring 2(n-1)/n × S.
    tree_inter = 2 * bw_inter
    multi = shape.nodes > 1
    lat_inter = nic.figures.latency_inter_us if nic.figures else 0.0
    cc = compute_capability(inst.device.model)

    def graph(net_bw: float) -> nm.Graph:
        return nm.Graph(
            nchannels=nch,
            bw_intra=min(bw_intra, net_bw) if multi else bw_intra,  # a channel crosses its NIC once per node
            bw_inter=net_bw,
            latency_inter_us=lat_inter,
            intra_nvlink=nvlink,
            # LL128 needs NVLink inside and, across nodes, the NIC next to the GPU (GPUDirect RDMA)
            ll128_paths_ok=nvlink and (nic.gpudirect_rdma or not multi),
        )

    ring, tree = graph(bw_inter), graph(tree_inter)
    nvls = ring if (fab.nvls and cc >= 90 and k > 1) else None
    return nm.NcclSystem(
        nranks=shape.ranks,
        nnodes=shape.nodes,
        compute_capability=cc,
        ring=ring,
        tree=tree,
        nvls=nvls,
        cpu_vendor=inst.host.cpu_vendor,
    )


@dataclass(frozen=True)
class NcclCall:
    """What one call runs and what NCCL's model says of it."""

    algo: str
    proto: str
    latency_s: float
    proto_factor: float  # the protocol's bandwidth relative to Simple (NCCL's model), ≤ 1


@functools.lru_cache(maxsize=4096)
def nccl_call(g: LinkGraph, coll: str, shape: Shape, nbytes: float, algo: str, proto: str) -> NcclCall | None:
    """The (algorithm, protocol) NCCL picks for the call, restricted to `algo` and `proto`
    unless "auto", with its latency and the protocol factor; None when NCCL has nothing for it
    (send/recv, which its tuner does not cover, or a forced pair it does not offer)."""
    if coll not in nm.COLLS:
        return None
    system = nccl_system(g.cluster, shape)
    algos = nm.ALGOS if algo == "auto" else (algo,)
    protos = nm.PROTOS if proto == "auto" else (proto,)
    size = int(nbytes)
    choice = nm.choose(coll, size, system, algos, protos)
    if choice is None:
        return None
    table = nm.tuned(system)
    lb = nm.latency_bandwidth(system, table, coll, choice.algo, choice.proto, size)
    if lb is None:  # one rank: nothing moves
        return NcclCall(choice.algo, choice.proto, 0.0, 1.0)
    lat, bw = lb
    # the protocol's bandwidth (with the tree's correction by size) over Simple's uncorrected
    # entry: how much slower than the links' rate NCCL's model says this pair moves bytes
    simple = table[coll, choice.algo, "Simple"].bandwidth_GBps
    factor = bw / simple if simple > 0 else 1.0
    return NcclCall(choice.algo, choice.proto, lat * 1e-6, min(factor, 1.0))
