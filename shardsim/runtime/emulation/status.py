"""What of an emulated cluster exists now, read from `ip` and `tc`, and its one-screen summary."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from shardsim.runtime.emulation.iproute import check_privileges, existing_namespaces, namespace_pids, run_command
from shardsim.runtime.emulation.ownership import Holder, held_by, holder_of
from shardsim.runtime.emulation.plan import EmulatedCluster
from shardsim.runtime.processes import alive


@dataclass(frozen=True)
class NamespaceStatus:
    namespace: str
    exists: bool
    addresses: tuple[str, ...] = ()  # "ifname cidr" of IPv4 addresses, loopback left out
    qdiscs: tuple[str, ...] = ()  # "ifname tbf <rate> Mbit/s" of the tbf qdiscs present
    routes: tuple[str, ...] = ()
    pids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ClusterStatus:
    cluster: EmulatedCluster
    namespaces: tuple[NamespaceStatus, ...] = field(default_factory=tuple)
    holder: Holder | None = None  # who holds the topology (`ownership`), as far as its record says

    @property
    def is_up(self) -> bool:
        """Every namespace present and every veth end shaped (two tbf per node)."""
        if not all(s.exists for s in self.namespaces):
            return False
        return sum(len(s.qdiscs) for s in self.namespaces) == 2 * len(self.cluster.nodes)

    @property
    def is_down(self) -> bool:
        return not any(s.exists for s in self.namespaces)


def status(cluster: EmulatedCluster) -> ClusterStatus:
    """What of `cluster` exists now: namespaces, addresses, routes, tbf rates, processes."""
    check_privileges()
    present = existing_namespaces()
    out = []
    for ns in cluster.namespaces:
        if ns not in present:
            out.append(NamespaceStatus(ns, False))
            continue
        addrs = []
        for link in json.loads(run_command(["ip", "-n", ns, "-j", "-4", "addr", "show"]).stdout or "[]"):
            for a in link.get("addr_info", []):
                if link.get("ifname") != "lo":
                    addrs.append(f"{link['ifname']} {a['local']}/{a['prefixlen']}")
        qdiscs = []
        for q in json.loads(run_command(["tc", "-n", ns, "-j", "qdisc", "show"]).stdout or "[]"):
            if q.get("kind") == "tbf":
                rate_bytes = q.get("options", {}).get("rate", 0)
                qdiscs.append(f"{q.get('dev', '?')} tbf {int(rate_bytes) * 8 / 1e6:g} Mbit/s")
        routes = [r for r in run_command(["ip", "-n", ns, "route", "show"]).stdout.splitlines() if r.strip()]
        out.append(NamespaceStatus(ns, True, tuple(addrs), tuple(qdiscs), tuple(routes), tuple(namespace_pids(ns))))
    holder = holder_of(cluster.prefix)
    if holder is not None and not (any(s.exists for s in out) if holder.kept else alive(holder.pid)):
        holder = None  # stale: the next holder cleans it up
    return ClusterStatus(cluster, tuple(out), holder)


def format_status(st: ClusterStatus) -> str:
    c = st.cluster
    state = "up" if st.is_up else ("down" if st.is_down else "partly up")
    lines = [
        f"{c.topology}: {state}; {len(c.nodes)} nodes x {c.ranks_per_node} ranks, subnet {c.subnet}, "
        f"NIC {c.rate_bps / 1e6:g} Mbit/s each way (tbf burst {c.burst_bytes} B), master {c.master_addr}"
    ]
    for s in st.namespaces:
        if not s.exists:
            lines.append(f"  {s.namespace:24s} absent")
            continue
        parts = list(s.addresses) + list(s.qdiscs)
        if s.pids:
            parts.append(f"{len(s.pids)} processes")
        lines.append(f"  {s.namespace:24s} " + ("; ".join(parts) if parts else "-"))
    if st.holder is not None:
        lines.append(f"  {held_by(c.topology, st.holder)}")
    return "\n".join(lines)
