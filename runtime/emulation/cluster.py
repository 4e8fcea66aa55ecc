"""The emulated cluster: the nodes of an ``emulated:`` topology as network namespaces on this machine.

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
  what the kernel path gives, measured with :func:`measure_link`, never imposed.

Use::

    cluster = plan_cluster(load_instance("emu-2x2"))
    with emulated(cluster):                      # up; always down, also on error/SIGINT/SIGTERM
        procs = [run_in_node(cluster, i, torchrun_argv(cluster, i, ["-m", "shardsim.runtime.train", ...]))
                 for i in range(len(cluster.nodes))]
        ...
        for p in procs:
            kill_group(p)

Needs root and iproute2 (``ip``, ``tc``); everything else is the standard library.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from shardsim.runtime.processes import alive
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.hardware.topology import InstanceType, load_instance

MTU = 1500
NODE_IFNAME = "nic0"  # the node's NIC, inside its own namespace (what GLOO_SOCKET_IFNAME names)
BRIDGE_IFNAME = "br0"  # the switch, inside the bridge namespace
# tbf bucket (burst): the tokens of BURST_S of traffic at the line rate, and never fewer than
# BURST_MIN_MTUS frames. A bucket smaller than one frame drops every full-size frame, and one
# smaller than what the rate earns between two wake-ups of the qdisc throws tokens away, so the
# link runs below its rate whenever the host stalls for a moment (tbf wakes on an hrtimer; on
# this shared VM the vCPU itself is sometimes late). Measured here (2026-11-22, emu-4x2, 16
# single TCP streams per setting, nothing else running): a 1 ms bucket gave 66-96 % of the
# rate (median 88 % in one minute, 96 % in the next), 2 ms 93-96 %, 4 and 8 ms 95-97 % every
# time (95.6 % is the 1448/1514 payload share of a frame). 4 ms is 100 kB at 200 Mbit/s: a
# message after an idle moment gets that much at once (a pipeline's 512 kB activation arrives
# ~20 % sooner than the rate says; the simulator does not model the bucket), small next to the
# MB-sized collectives of a training step.
BURST_S = 4e-3
BURST_MIN_MTUS = 8
# tbf queue (latency): frames worth this much time at the rate wait in the queue before tbf drops
# (250 kB at 200 Mbit/s): enough for TCP to keep the link busy (several flows into one node drop,
# as at a real switch port), without the seconds of bufferbloat a real NIC does not have.
QUEUE_LATENCY_S = 0.010
_CMD_TIMEOUT_S = 30.0
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")


class EmulationError(ConfigError):
    """The emulated cluster cannot be set up, torn down or measured (one line, CLI exit 2)."""


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


# ---------------------------------------------------------------------------- commands


def check_privileges() -> None:
    """Refuse (ConfigError, one line) unless this process is root and has `ip` and `tc`."""
    if os.geteuid() != 0:
        raise EmulationError("the emulated cluster needs root (network namespaces and tc); run as root")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise EmulationError(f"the emulated cluster needs `{tool}` (iproute2) on PATH; install iproute2")


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    try:
        res = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise EmulationError(f"`{' '.join(argv)}` did not finish in {_CMD_TIMEOUT_S:g} s") from None
    if check and res.returncode != 0:
        why = (res.stderr.strip() or res.stdout.strip() or f"exit status {res.returncode}").splitlines()[0]
        raise EmulationError(f"`{' '.join(argv)}` failed: {why}")
    return res


def existing_namespaces() -> set[str]:
    """Names of the named network namespaces on this machine (``ip netns list``)."""
    out = _run(["ip", "netns", "list"]).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def namespace_pids(namespace: str) -> list[int]:
    res = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(tok) for tok in res.stdout.split() if tok.isdigit()] if res.returncode == 0 else []


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
            _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", br, "link", "add", cluster.bridge_ifname, "type", "bridge"])
        # addrgenmode none: no IPv6 link-local addresses, so the only address of a NIC is its IPv4 one
        # (what gloo binds to) and no neighbour-discovery chatter crosses the shaped links
        _run(
            ["ip", "-n", br, "link", "set", cluster.bridge_ifname, "mtu", str(cluster.mtu), "addrgenmode", "none", "up"]
        )
        for node in cluster.nodes:
            ns = node.namespace
            # create the pair inside the bridge namespace with the node end moved straight into the
            # node namespace: no interface ever appears in the root namespace
            _run(["ip", "-n", br, "link", "add", node.peer_ifname, "mtu", str(cluster.mtu), "type", "veth",
                  "peer", "name", node.ifname, "netns", ns])  # fmt: skip
            _run(["ip", "-n", br, "link", "set", node.peer_ifname, "master", cluster.bridge_ifname,
                  "addrgenmode", "none", "up"])  # fmt: skip
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "set", node.ifname, "mtu", str(cluster.mtu), "addrgenmode", "none", "up"])
            _run(["ip", "-n", ns, "addr", "add", node.cidr, "dev", node.ifname])
            # egress of the node, and (bridge-side egress) ingress of the node
            _run(["tc", "-n", ns, "qdisc", "replace", "dev", node.ifname, "root", *cluster.tbf_args()])
            _run(["tc", "-n", br, "qdisc", "replace", "dev", node.peer_ifname, "root", *cluster.tbf_args()])
        for node in cluster.nodes:
            _wait_carrier(node)
    except BaseException:
        down(cluster)
        raise


def _wait_carrier(node: EmulatedNode, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        out = _run(["ip", "-n", node.namespace, "-j", "link", "show", "dev", node.ifname]).stdout
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
        res = _run(["ip", "netns", "delete", ns], check=False)
        if res.returncode != 0 and ns in existing_namespaces():
            why = (res.stderr.strip() or f"exit status {res.returncode}").splitlines()[0]
            raise EmulationError(f"cannot delete namespace {ns}: {why}")
        removed.append(ns)
    return removed


# ---------------------------------------------------------------------------- status


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
        for link in json.loads(_run(["ip", "-n", ns, "-j", "-4", "addr", "show"]).stdout or "[]"):
            for a in link.get("addr_info", []):
                if link.get("ifname") != "lo":
                    addrs.append(f"{link['ifname']} {a['local']}/{a['prefixlen']}")
        qdiscs = []
        for q in json.loads(_run(["tc", "-n", ns, "-j", "qdisc", "show"]).stdout or "[]"):
            if q.get("kind") == "tbf":
                rate_bytes = q.get("options", {}).get("rate", 0)
                qdiscs.append(f"{q.get('dev', '?')} tbf {int(rate_bytes) * 8 / 1e6:g} Mbit/s")
        routes = [r for r in _run(["ip", "-n", ns, "route", "show"]).stdout.splitlines() if r.strip()]
        out.append(NamespaceStatus(ns, True, tuple(addrs), tuple(qdiscs), tuple(routes), tuple(namespace_pids(ns))))
    return ClusterStatus(cluster, tuple(out))


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
    return "\n".join(lines)


# ---------------------------------------------------------------------------- lifetime


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
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


# ---------------------------------------------------------------------------- processes


def node_env(cluster: EmulatedCluster, node: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on `node`: this one's, then `env`, then the socket interface."""
    out = dict(os.environ)
    out.update(env or {})
    ifname = cluster.nodes[node].ifname
    out["GLOO_SOCKET_IFNAME"] = ifname  # gloo's data connections go over the shaped NIC
    out["TP_SOCKET_IFNAME"] = ifname  # tensorpipe (torch.distributed.rpc), for completeness
    return out


def run_in_node(
    cluster: EmulatedCluster, node: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **popen_kwargs
) -> subprocess.Popen:
    """Start `argv` inside node `node`'s namespace (``ip netns exec``) in a new process group,
    with GLOO_SOCKET_IFNAME set to the node's NIC. Stop it with :func:`kill_group`. Extra keyword
    arguments go to ``subprocess.Popen`` (stdout=, cwd=, ...)."""
    if not 0 <= node < len(cluster.nodes):
        raise ConfigError(f"node {node} is not in the cluster (0..{len(cluster.nodes) - 1})")
    popen_kwargs.setdefault("start_new_session", True)
    full = ["ip", "netns", "exec", cluster.nodes[node].namespace, *argv]
    return subprocess.Popen(full, env=node_env(cluster, node, env), **popen_kwargs)


def torchrun_argv(
    cluster: EmulatedCluster,
    node: int,
    script_argv: Sequence[str],
    *,
    master_port: int = 29500,
    nproc_per_node: int | None = None,
    python: str = sys.executable,
    extra: Sequence[str] = (),
) -> list[str]:
    """``python -m torch.distributed.run`` (torchrun) for node `node` of `cluster`; `script_argv` is
    the script and its arguments (or ``["-m", "module", ...]``, with ``--module`` added for you);
    `extra` are further torchrun flags (the launcher passes its own, `launch.TORCHRUN_FLAGS`)."""
    script = list(script_argv)
    module = []
    if script[:1] == ["-m"]:
        module, script = ["--module"], script[1:]
    return [
        python, "-m", "torch.distributed.run",
        "--nnodes", str(len(cluster.nodes)), "--node_rank", str(node),
        "--nproc_per_node", str(nproc_per_node or cluster.ranks_per_node),
        "--master_addr", cluster.master_addr, "--master_port", str(master_port),
        *extra, *module, *script,
    ]  # fmt: skip


def kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
    """Stop `proc` and its whole process group: SIGTERM, then SIGKILL after `grace_s`. Returns the
    exit status. Only signals the group when `proc` leads one of its own (``start_new_session``)."""
    own_group = False
    try:
        own_group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            if own_group:
                os.killpg(proc.pid, sig)
            elif proc.poll() is None:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass
        try:
            return proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


# ---------------------------------------------------------------------------- measuring a link


class LinkMeasurement(NamedTuple):
    bandwidth_Bps: float  # TCP payload bytes per second, node src -> node dst, after the first MB
    latency_s: float  # one way: half the median round trip of a small message over TCP


# One script, two roles; runs in a namespace with this interpreter and the standard library only.
_PROBE = r"""
import json, socket, sys, time
role, host, port, pings, size, warm, timeout = sys.argv[1:8]
port, pings, size, warm, timeout = int(port), int(pings), int(size), int(warm), float(timeout)
def exact(c, n):
    b = bytearray()
    while len(b) < n:
        r = c.recv(n - len(b))
        if not r:
            raise ConnectionError("peer closed")
        b += r
    return bytes(b)
if role == "recv":
    s = socket.create_server((host, 0))
    s.settimeout(timeout)
    print(s.getsockname()[1], flush=True)
    c, _ = s.accept()
    c.settimeout(timeout)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for _ in range(pings):
        c.sendall(exact(c, 8))
    got, t_warm, buf = 0, None, bytearray(1 << 20)
    while got < size:
        n = c.recv_into(buf)
        if not n:
            raise ConnectionError("peer closed")
        got += n
        if t_warm is None and got >= warm:
            t_warm, at_warm = time.perf_counter(), got
    t_end = time.perf_counter()
    c.sendall(b"done0000")
    print(json.dumps({"bandwidth": (got - at_warm) / max(t_end - t_warm, 1e-9)}), flush=True)
else:
    deadline = time.monotonic() + timeout
    while True:
        try:
            c = socket.create_connection((host, port), timeout=timeout)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for i in range(pings):
        t = time.perf_counter()
        c.sendall(i.to_bytes(8, "little"))
        exact(c, 8)
        rtts.append(time.perf_counter() - t)
    chunk, left = bytes(1 << 16), size
    while left > 0:
        left -= c.send(chunk[: min(left, len(chunk))])
    exact(c, 8)
    print(json.dumps({"rtts": rtts}), flush=True)
"""


def measure_link(
    cluster: EmulatedCluster,
    src: int = 0,
    dst: int = 1,
    *,
    size_bytes: int = 5_000_000,
    warmup_bytes: int = 1_000_000,
    pings: int = 200,
    timeout_s: float = 30.0,
) -> LinkMeasurement:
    """Achieved bandwidth and latency from node `src` to node `dst` of a cluster that is up;
    `src == dst` measures the loopback between two processes of one node (how its ranks talk).

    A TCP receiver in `dst` and a sender in `src` (plain Python, no iperf): first `pings`
    8-byte ping-pongs (latency = median round trip / 2), then `size_bytes` in one stream
    (bandwidth = bytes after the first `warmup_bytes` over the time they took, which leaves out
    TCP's start and the tbf bucket's initial burst). Bounded by `timeout_s`."""
    if src != dst and len(cluster.nodes) < 2:
        raise ConfigError("measuring a link needs at least 2 emulated nodes")
    warmup_bytes = min(warmup_bytes, size_bytes // 2)
    args = [str(pings), str(size_bytes), str(warmup_bytes), str(timeout_s)]
    host = cluster.nodes[dst].address
    recv = run_in_node(cluster, dst, [sys.executable, "-c", _PROBE, "recv", host, "0", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    send = None
    try:
        port = _read_line(recv, timeout_s)
        send = run_in_node(cluster, src, [sys.executable, "-c", _PROBE, "send", host, port, *args],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        s_out, s_err = send.communicate(timeout=timeout_s)
        r_out, r_err = recv.communicate(timeout=timeout_s)
        if send.returncode != 0 or recv.returncode != 0:
            err = (s_err.strip() or r_err.strip() or "no message").splitlines()[-1]
            raise EmulationError(f"measuring {cluster.nodes[src].namespace} -> {cluster.nodes[dst].namespace}: {err}")
        rtts = json.loads(s_out.strip().splitlines()[-1])["rtts"]
        bandwidth = json.loads(r_out.strip().splitlines()[-1])["bandwidth"]
    except subprocess.TimeoutExpired:
        raise EmulationError(f"measuring the link between nodes {src} and {dst} took over {timeout_s:g} s") from None
    finally:
        for p in (send, recv):
            if p is not None and p.poll() is None:
                kill_group(p, grace_s=1.0)
    return LinkMeasurement(bandwidth, statistics.median(rtts) / 2 if rtts else float("nan"))


def _read_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first stdout line of `proc`, waiting at most `timeout_s` (a thread does the blocking read)."""
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0].strip():
        kill_group(proc, grace_s=1.0)
        err = (proc.stderr.read() if proc.stderr else "").strip()
        raise EmulationError(f"link probe did not start: {err.splitlines()[-1] if err else 'no output'}")
    return box[0].strip()
