"""Bringing an emulated cluster up and down: `up` creates its namespaces, bridge, veths, addresses and
tbf shaping; `down` kills what shardsim started in them and deletes them; `held` holds the names of
clusters for a job (`ownership`); `emulated` holds a cluster and keeps it up for a block, and always
tears it down, also on SIGINT, SIGTERM, SIGHUP and SIGQUIT."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from shardsim.core import interrupts
from shardsim.core.interrupts import SIGNALS, raise_interrupt
from shardsim.runtime.emulation.iproute import (
    EmulationError,
    check_privileges,
    existing_namespaces,
    run_command,
)
from shardsim.runtime.emulation.ownership import Holder, owning
from shardsim.runtime.emulation.plan import EmulatedCluster, EmulatedNode
from shardsim.runtime.emulation.processes import NodeProcess, node_processes
from shardsim.runtime.processes import alive

log = logging.getLogger("shardsim")
# set in every namespace before any link is made: no interface gets an IPv6 address, so nothing
# (router solicitations, MLD, DAD) crosses the shaped links but the ranks' own IPv4 traffic
_NO_IPV6 = "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6 && echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"


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


def label(cluster: EmulatedCluster) -> str:
    """The cluster's name in messages: its topology's, or its prefix when it is a tagged one."""
    return cluster.topology if cluster.prefix == f"ss-{cluster.topology}" else cluster.prefix


def up(cluster: EmulatedCluster) -> None:
    """Create the namespaces, bridge, veths, addresses and shaping. Leftovers of the same names
    (a crashed earlier run) are removed first, with a note; on any failure, what was made is
    removed again. Does not hold the names: `emulated` and ``shardsim cluster up`` do."""
    check_privileges()
    removed = down(cluster)
    if removed:
        log.warning("%s: removed the leftovers of an earlier cluster (%s)", label(cluster), ", ".join(removed))
    br = cluster.bridge_namespace
    try:
        for ns in cluster.namespaces:
            run_command(["ip", "netns", "add", ns])
            if os.path.exists("/proc/sys/net/ipv6"):  # else IPv6 is off in this kernel altogether
                run_command(["ip", "netns", "exec", ns, "sh", "-c", _NO_IPV6])
        run_command(["ip", "-n", br, "link", "add", cluster.bridge_ifname, "type", "bridge"])
        # addrgenmode none as well: no IPv6 link-local address even where IPv6 stays on
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


def down(cluster: EmulatedCluster, *, grace_s: float = 2.0, kill_foreign: bool = False) -> list[str]:
    """Kill the processes shardsim started in the cluster's namespaces (`processes.node_processes`)
    and delete the namespaces (their veths and the bridge go with them). A process shardsim did not
    start is killed only with `kill_foreign`; otherwise it is left running, in a namespace that no
    longer has a name, with a note. Idempotent: a missing or half-made cluster is fine. Returns the
    namespaces that were deleted."""
    check_privileges()
    present = existing_namespaces()
    removed: list[str] = []
    left: list[NodeProcess] = []
    for ns in cluster.namespaces:
        if ns not in present:
            continue
        procs = node_processes(cluster, ns)
        _kill_pids([p.pid for p in procs if p.ours or kill_foreign], grace_s)
        left += [p for p in procs if not p.ours and not kill_foreign]
        res = run_command(["ip", "netns", "delete", ns], check=False)
        if res.returncode != 0 and ns in existing_namespaces():
            why = (res.stderr.strip() or f"exit status {res.returncode}").splitlines()[0]
            raise EmulationError(f"cannot delete namespace {ns}: {why}")
        removed.append(ns)
    if left := [p for p in left if alive(p.pid)]:
        log.warning(
            "%s: left running %s, which shardsim did not start (their namespace has no name now)",
            label(cluster),
            "; ".join(p.describe() for p in left),
        )
    return removed


def foreign_processes(cluster: EmulatedCluster) -> list[NodeProcess]:
    """The processes in the cluster's namespaces that shardsim did not start."""
    check_privileges()
    present = existing_namespaces()
    return [p for ns in cluster.namespaces if ns in present for p in node_processes(cluster, ns) if not p.ours]


def _exists(cluster: EmulatedCluster) -> bool:
    return bool(existing_namespaces() & set(cluster.namespaces))


def _clean_stale(cluster: EmulatedCluster, stale: Holder) -> None:
    if stale.kept:
        log.warning("%s: the cluster %s brought up is gone; its hold is dropped", label(cluster), stale.describe())
        return
    removed = down(cluster)
    left = f"removed its {len(removed)} namespaces" if removed else "it left no namespaces"
    log.warning("%s: %s ended without taking its cluster down; %s", label(cluster), stale.describe(), left)


@contextmanager
def held(clusters: Sequence[EmulatedCluster], *, wait: bool = False, take_kept: bool = False) -> Iterator[None]:
    """Hold the names of `clusters` for the block (`ownership.owning`): another job that holds one
    of them, or a cluster of those names up by hand, is refused (`TopologyBusy`, exit 2), or
    waited for with `wait`. What a killed earlier holder left is removed, with a note. Taken in
    the order of their names, so that two jobs waiting for the same clusters cannot deadlock."""
    with ExitStack() as stack:
        for c in sorted({c.prefix: c for c in clusters}.values(), key=lambda c: c.prefix):
            stack.enter_context(
                owning(
                    c.prefix,
                    label=label(c),
                    wait=wait,
                    present=lambda c=c: _exists(c),
                    clean=lambda stale, c=c: _clean_stale(c, stale),
                    take_kept=take_kept,
                )
            )
        yield


@contextmanager
def emulated(cluster: EmulatedCluster, *, wait: bool = False) -> Iterator[EmulatedCluster]:
    """Hold `cluster`'s names (`held`; `wait` for them), bring it up for the body and always tear
    it down: on return, on an exception, and on SIGINT, SIGTERM, SIGHUP and SIGQUIT (each raises
    KeyboardInterrupt inside the body while it runs: `interrupts.SIGNALS`). The previous signal
    handlers are restored afterwards; a signal that arrives during teardown waits for it."""
    with held([cluster], wait=wait), interrupts.guarded(cluster.prefix), _up_for_block(cluster):
        yield cluster


@contextmanager
def _up_for_block(cluster: EmulatedCluster) -> Iterator[None]:
    main = threading.current_thread() is threading.main_thread()
    old = {}
    if main:
        for sig in SIGNALS:
            old[sig] = signal.signal(sig, _raise_interrupt)
    try:
        up(cluster)
        yield
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
    raise_interrupt(signum, frame)  # SIGTERM, SIGHUP, SIGQUIT as Terminated: the command exits 143, 129, 131
