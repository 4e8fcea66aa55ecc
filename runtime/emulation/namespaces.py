"""Bringing an emulated cluster up and down: `up` creates its namespaces, bridge, veths, addresses and
tbf shaping; `down` kills what runs in them and deletes them; `emulated` holds it up for a block and
always tears it down, also on SIGINT and SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from shardsim.runtime.emulation.iproute import (
    EmulationError,
    check_privileges,
    existing_namespaces,
    namespace_pids,
    run_command,
)
from shardsim.runtime.emulation.plan import EmulatedCluster, EmulatedNode
from shardsim.runtime.interrupts import raise_interrupt
from shardsim.runtime.processes import alive


def _kill_pids(pids: Sequence[int], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        running = []
        for pid in pids:
            try:
                os.kill(pid, sig)
                running.append(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while running and time.monotonic() < deadline:
            running = [p for p in running if alive(p)]
            if running:
                time.sleep(0.02)
        if not running:
            return
        pids = running


def up(cluster: EmulatedCluster) -> None:
    """Create the namespaces, bridge, veths, addresses and shaping. Leftovers of the same names
    (a crashed earlier run) are removed first; on any failure, what was made is removed again."""
    check_privileges()
    down(cluster)
    br = cluster.bridge_namespace
    try:
        for ns in cluster.namespaces:
            run_command(["ip", "netns", "add", ns])
        run_command(["ip", "-n", br, "link", "add", cluster.bridge_ifname, "type", "bridge"])
        # addrgenmode none: no IPv6 link-local addresses, so the only address of a NIC is its IPv4 one
        # (what gloo binds to) and no neighbour-discovery chatter crosses the shaped links
        run_command(
            ["ip", "-n", br, "link", "set", cluster.bridge_ifname, "mtu", str(cluster.mtu), "addrgenmode", "none", "up"]
        )
        for node in cluster.nodes:
            ns = node.namespace
            # create the pair inside the bridge namespace with the node end moved straight into the
            # node namespace: no interface ever appears in the root namespace
            run_command(["ip", "-n", br, "link", "add", node.peer_ifname, "mtu", str(cluster.mtu), "type", "veth",
                         "peer", "name", node.ifname, "netns", ns])  # fmt: skip
            run_command(["ip", "-n", br, "link", "set", node.peer_ifname, "master", cluster.bridge_ifname,
                         "addrgenmode", "none", "up"])  # fmt: skip
            run_command(["ip", "-n", ns, "link", "set", "lo", "up"])
            run_command(
                ["ip", "-n", ns, "link", "set", node.ifname, "mtu", str(cluster.mtu), "addrgenmode", "none", "up"]
            )
            run_command(["ip", "-n", ns, "addr", "add", node.cidr, "dev", node.ifname])
            # egress of the node, and (bridge-side egress) ingress of the node
            run_command(["tc", "-n", ns, "qdisc", "replace", "dev", node.ifname, "root", *cluster.tbf_args()])
            run_command(["tc", "-n", br, "qdisc", "replace", "dev", node.peer_ifname, "root", *cluster.tbf_args()])
        for node in cluster.nodes:
            _wait_carrier(node)
    except BaseException:
        down(cluster)
        raise


def _wait_carrier(node: EmulatedNode, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        out = run_command(["ip", "-n", node.namespace, "-j", "link", "show", "dev", node.ifname]).stdout
        links = json.loads(out or "[]")
        if links and "LOWER_UP" in links[0].get("flags", []):
            return
        if time.monotonic() > deadline:
            raise EmulationError(f"{node.namespace}: {node.ifname} has no carrier after {timeout_s:g} s")
        time.sleep(0.02)


def down(cluster: EmulatedCluster, *, grace_s: float = 2.0) -> list[str]:
    """Kill every process left in the cluster's namespaces and delete the namespaces (their veths
    and the bridge go with them). Idempotent: a missing or half-made cluster is fine. Returns the
    namespaces that were deleted."""
    check_privileges()
    present = existing_namespaces()
    removed = []
    for ns in cluster.namespaces:
        if ns not in present:
            continue
        _kill_pids(namespace_pids(ns), grace_s)
        res = run_command(["ip", "netns", "delete", ns], check=False)
        if res.returncode != 0 and ns in existing_namespaces():
            why = (res.stderr.strip() or f"exit status {res.returncode}").splitlines()[0]
            raise EmulationError(f"cannot delete namespace {ns}: {why}")
        removed.append(ns)
    return removed


@contextmanager
def emulated(cluster: EmulatedCluster) -> Iterator[EmulatedCluster]:
    """Bring `cluster` up for the body and always tear it down: on return, on an exception, and
    on SIGINT/SIGTERM (both raise KeyboardInterrupt inside the body while it runs). The previous
    signal handlers are restored afterwards; a signal that arrives during teardown waits for it."""
    main = threading.current_thread() is threading.main_thread()
    old = {}
    if main:
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, _raise_interrupt)
    try:
        up(cluster)
        yield cluster
    finally:
        if main:
            signal.pthread_sigmask(signal.SIG_BLOCK, old.keys())
        try:
            down(cluster)
        finally:
            if main:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, old.keys())


def _raise_interrupt(signum, frame):
    raise_interrupt(signum, frame)  # SIGTERM as Terminated: the command still exits 143
