"""`shardsim cluster up|down|status TOPOLOGY`: the emulated cluster by hand (see runtime/emulation/).

``up`` leaves the cluster up, and the topology held (`ownership.keep`), until ``down``; a job
(``shardsim run``, ``profile``, ``validate``) brings its own up and down and is refused meanwhile.
``down`` kills only what shardsim started in the nodes, unless ``--kill``; ``status --measure``
also measures the link between node 0 and node 1.
"""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

from shardsim.config.flags import setting_type

log = logging.getLogger("shardsim")


def down_command(topology: str, nodes: int | None) -> str:
    """The ``shardsim cluster down`` of a cluster brought up as ``cluster up TOPOLOGY [--nodes N]``,
    as it runs from any folder: a shipped topology by name, a file by its absolute path, quoted."""
    from shardsim.specs.hardware.topology import builtin_topologies

    where = topology if topology in builtin_topologies() else str(Path(topology).resolve())
    return shlex.join(["shardsim", "cluster", "down", where, *(["--nodes", str(nodes)] if nodes else [])])


def _cmd_cluster(ns: argparse.Namespace) -> int:
    from shardsim.runtime.emulation.iproute import EmulationError
    from shardsim.runtime.emulation.linkprobe import measure_link
    from shardsim.runtime.emulation.namespaces import down, foreign_processes, held, up
    from shardsim.runtime.emulation.ownership import keep
    from shardsim.runtime.emulation.plan import plan_cluster
    from shardsim.runtime.emulation.status import format_status, status
    from shardsim.specs.hardware.topology import load_instance

    cluster = plan_cluster(load_instance(ns.topology), ns.nodes)
    if ns.action == "up":
        down_cmd = down_command(ns.topology, ns.nodes)
        with held([cluster], wait=ns.wait):
            up(cluster)
            keep(cluster.prefix, down_cmd)  # held after this process ends, until `cluster down`
        print(format_status(status(cluster)))
        node = shlex.quote(f"{cluster.prefix}-nI")
        ifname = cluster.nodes[0].ifname
        print(f"run CMD on node I: GLOO_SOCKET_IFNAME={ifname} ip netns exec {node} CMD; then: {down_cmd}")
    elif ns.action == "down":
        with held([cluster], wait=ns.wait, take_kept=True):
            foreign = foreign_processes(cluster)
            if foreign and not ns.kill:
                more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
                raise EmulationError(
                    f"{cluster.topology} still runs {foreign[0].describe()}{more}, which shardsim did not start; "
                    "stop it, or pass --kill to kill it with the cluster"
                )
            removed = down(cluster, kill_foreign=ns.kill)
        if foreign:
            log.warning("killed %s", "; ".join(p.describe() for p in foreign))
        print(f"{cluster.topology}: down ({len(removed)} namespaces removed)")
    else:
        st = status(cluster)
        print(format_status(st))
        if ns.measure:
            if not st.is_up:
                print("  (not measured: the cluster is not up)")
            elif len(cluster.nodes) >= 2:
                m = measure_link(cluster)
                print(
                    f"  link n0 -> n1: {m.bandwidth_Bps * 8 / 1e6:.1f} Mbit/s TCP payload "
                    f"({m.bandwidth_Bps * 8 / cluster.rate_bps:.1%} of the shaped rate), "
                    f"latency {m.latency_s * 1e6:.0f} us one way"
                )
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "cluster",
        help="bring an emulated cluster (network namespaces + tc) up or down, or show it (needs root)",
        description="Nodes of an emulated topology as network namespaces joined by a bridge, "
        "each NIC shaped with tc tbf in both directions.",
    )
    p.add_argument("action", choices=("up", "down", "status"), help="bring it up, take it down, or show it")
    p.add_argument("topology", help="an emulated topology (emu-2x2, emu-4x2) or a YAML path")
    p.add_argument(
        "--nodes",
        type=setting_type("nodes"),
        default=None,
        help="number of nodes (default: the topology's emulated count)",
    )
    p.add_argument("--measure", action="store_true", help="status: also measure bandwidth and latency n0 -> n1")
    p.add_argument(
        "--wait",
        action="store_true",
        help="up, down: wait while another job holds the topology (default: refuse, exit 2)",
    )
    p.add_argument(
        "--kill",
        action="store_true",
        help="down: also kill processes in the nodes that shardsim did not start (default: refuse while any run)",
    )
    p.set_defaults(func=_cmd_cluster)
