"""The plan of an emulated cluster: its namespaces, links, addresses and shaping, named (creates nothing).

Layout, for a topology named ``emu-2x2`` (prefix ``ss-emu-2x2``)::

    ss-emu-2x2-n0: lo, nic0 10.213.0.1/24 --veth-- vb0 \\
    ss-emu-2x2-n1: lo, nic0 10.213.0.2/24 --veth-- vb1 -- br0   (in ss-emu-2x2-br)

* One network namespace per node. Ranks of one node talk over that namespace's loopback
  (traffic to the node's own address is local), so only traffic between nodes crosses a NIC.
* The nodes are joined by a Linux bridge that lives in a namespace of its own, so nothing is
  created in the root namespace. The node addresses are in the topology's ``emulated.subnet``;
  a node gets only the on-link route of that subnet: no default route, no route out.
* Every node's NIC is shaped in both directions with ``tc`` tbf at ``nic.rate_gbps x nic.count``:
  on ``nic0`` (the node's egress) and on its bridge-side peer ``vbI`` (whose egress is the
  node's ingress), like a full-duplex NIC. There is no netem on these kernels: latency is
  what the kernel path gives, measured with `linkprobe.measure_link`, never imposed.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from shardsim.core.errors import ConfigError
from shardsim.specs.hardware.topology import InstanceType, load_instance

MTU = 1500
NODE_IFNAME = "nic0"  # the node's NIC, inside its own namespace (what GLOO_SOCKET_IFNAME names)
BRIDGE_IFNAME = "br0"  # the switch, inside the bridge namespace
# tbf bucket (burst): the tokens of BURST_S of traffic at the line rate, and never fewer than
# BURST_MIN_MTUS frames. A smaller bucket runs the link below its rate whenever the host stalls
# for a moment; a larger one lets a message after an idle moment arrive sooner than the rate
# says (readings: experiments/readings/emulated-nics.md).
BURST_S = 4e-3
BURST_MIN_MTUS = 8
# tbf queue (latency): frames worth this much time at the rate wait in the queue before tbf drops.
# Deep enough that two or three TCP flows sharing a NIC rarely lose a frame: a loss at the end of
# a message stalls its collective for a retransmission, which the simulator's lossless links do
# not hold (readings: experiments/readings/emulated-nics.md).
QUEUE_LATENCY_S = 0.050
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass(frozen=True)
class EmulatedNode:
    index: int
    namespace: str  # e.g. ss-emu-2x2-n0
    ifname: str  # the node's veth end, inside `namespace` (GLOO_SOCKET_IFNAME)
    peer_ifname: str  # the bridge-side veth end, inside the bridge namespace
    address: str  # IPv4 address of `ifname`
    prefixlen: int

    @property
    def cidr(self) -> str:
        return f"{self.address}/{self.prefixlen}"


@dataclass(frozen=True)
class EmulatedCluster:
    """Everything `up` creates, named and addressed; plan it with :func:`plan_cluster`."""

    topology: str  # the instance type's name
    prefix: str  # every namespace's name starts with it
    bridge_namespace: str
    bridge_ifname: str
    nodes: tuple[EmulatedNode, ...]
    subnet: str
    ranks_per_node: int
    rate_bps: int  # tbf rate of each node's NIC, per direction, in bits/s
    burst_bytes: int
    queue_latency_s: float
    mtu: int = MTU

    @property
    def master_addr(self) -> str:
        """Node 0's address: where torchrun's rendezvous store listens."""
        return self.nodes[0].address

    @property
    def namespaces(self) -> tuple[str, ...]:
        return tuple(n.namespace for n in self.nodes) + (self.bridge_namespace,)

    @property
    def world(self) -> int:
        return len(self.nodes) * self.ranks_per_node

    def tbf_args(self) -> list[str]:
        """The tbf qdisc options used on every shaped veth end."""
        return [
            "tbf", "rate", f"{self.rate_bps}bit", "burst", str(self.burst_bytes),
            "latency", f"{self.queue_latency_s * 1e3:g}ms",
        ]  # fmt: skip


def plan_cluster(instance: InstanceType | str, nodes: int | None = None, *, tag: str | None = None) -> EmulatedCluster:
    """Name and address the namespaces, links and shaping of an emulated topology (creates nothing).

    `nodes` defaults to the topology's ``emulated.nodes``. `tag` goes into every name, so that
    two clusters of one topology can exist at once (tests use it); without it the names are
    ``ss-<name>-n<i>`` and ``ss-<name>-br``.
    """
    inst = load_instance(instance) if isinstance(instance, str) else instance
    if inst.emulated is None:
        raise ConfigError(
            f"topology {inst.name!r} is not emulated (it has no 'emulated:' block); "
            "only an emulated topology such as emu-2x2 can be brought up on this machine",
            where=inst.path,
        )
    if nodes is None:
        nodes = inst.emulated.nodes
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise ConfigError(f"expected a node count >= 1, got {nodes!r}", field="nodes")
    try:
        net = ipaddress.ip_network(inst.emulated.subnet, strict=True)
    except ValueError as exc:
        raise ConfigError(f"not a subnet: {exc}", where=inst.path, field="emulated.subnet") from None
    if net.version != 4:
        raise ConfigError("expected an IPv4 subnet", where=inst.path, field="emulated.subnet")
    hosts = list(net.hosts()) if net.num_addresses <= 65536 else None
    if hosts is not None and len(hosts) < nodes:
        raise ConfigError(
            f"subnet {net} has {len(hosts)} host addresses, too few for {nodes} nodes",
            where=inst.path,
            field="emulated.subnet",
        )
    name = _SAFE_NAME.sub("-", inst.name).strip("-") or "cluster"
    prefix = f"ss-{_SAFE_NAME.sub('-', tag)}-{name}" if tag else f"ss-{name}"
    rate_bps = int(round(inst.nic.rate_gbps * inst.nic.count * 1e9))
    if rate_bps < 8 * MTU:
        raise ConfigError(f"NIC rate {rate_bps} bit/s is too low to emulate", where=inst.path, field="nic.rate_gbps")
    burst = max(int(rate_bps / 8 * BURST_S), BURST_MIN_MTUS * (MTU + 14))
    plan = tuple(
        EmulatedNode(
            index=i,
            namespace=f"{prefix}-n{i}",
            ifname=NODE_IFNAME,
            peer_ifname=f"vb{i}",
            address=str(hosts[i] if hosts is not None else net.network_address + 1 + i),
            prefixlen=net.prefixlen,
        )
        for i in range(nodes)
    )
    return EmulatedCluster(
        topology=inst.name,
        prefix=prefix,
        bridge_namespace=f"{prefix}-br",
        bridge_ifname=BRIDGE_IFNAME,
        nodes=plan,
        subnet=str(net),
        ranks_per_node=inst.device.count,
        rate_bps=rate_bps,
        burst_bytes=burst,
        queue_latency_s=QUEUE_LATENCY_S,
    )
