"""The emulated cluster (runtime/emulation/), as root: namespaces up, shaped links at their rate,
no route out, and nothing left behind, also on errors and signals (its planning and refusals
without root: tests/unit/test_emulation_plan.py)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from shardsim.runtime.emulation.iproute import existing_namespaces
from shardsim.runtime.emulation.linkprobe import measure_link
from shardsim.runtime.emulation.namespaces import down, emulated, up
from shardsim.runtime.emulation.plan import plan_cluster
from shardsim.runtime.emulation.processes import run_in_node
from shardsim.runtime.emulation.status import status
from shardsim.specs.hardware.topology import load_instance
from tests.root_only import cannot_emulate, needs_root
from tests.unit.test_emulation_plan import _cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TAG = f"t{os.getpid()}"  # our own names: a cluster someone else has up on this machine is left alone


def _sh(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout


def _root_links() -> set[str]:
    return {link["ifname"] for link in json.loads(_sh("ip", "-j", "link", "show"))}


def _our_namespaces(cluster) -> set[str]:
    return {ns for ns in existing_namespaces() if ns.startswith(cluster.prefix + "-")}


@pytest.fixture
def cluster_of():
    made = []

    def make(topology: str, nodes: int | None = None):
        c = plan_cluster(load_instance(topology), nodes, tag=TAG)
        made.append(c)
        return c

    yield make
    for c in made:  # whatever a failing test left
        if cannot_emulate() is None:
            down(c)


# ---------------------------------------------------------------------------- the real thing (root)

_REACH = textwrap.dedent(
    """
    import json, socket, sys
    def reach(host, port):
        try:
            socket.create_connection((host, port), timeout=2).close()
            return "connected"
        except ConnectionRefusedError:
            return "refused"      # a host answered: reachable
        except OSError as exc:
            return f"unreachable: {exc.strerror}"
    srv = socket.create_server(("127.0.0.1", 0))
    print(json.dumps({"loopback": reach("127.0.0.1", srv.getsockname()[1]),
                      "peer": reach(sys.argv[1], 9),
                      "root": reach(sys.argv[2], int(sys.argv[3]))}))
    """
)


def _root_address() -> str:
    """An address of the root namespace (not loopback, which every namespace has its own of)."""
    for link in json.loads(_sh("ip", "-j", "-4", "addr", "show")):
        for a in link.get("addr_info", []):
            if link["ifname"] != "lo":
                return a["local"]
    return "192.0.2.1"  # none here (TEST-NET-1): still, nothing outside the subnet may be reachable


@needs_root
@pytest.mark.parametrize("topology", ["emu-2x2", "emu-4x2"])
def test_up_status_rate_isolation_down(cluster_of, topology):
    c = cluster_of(topology)
    links_before = _root_links()
    up(c)
    assert _root_links() == links_before, "nothing may be attached to the root namespace"

    st = status(c)
    assert st.is_up and _our_namespaces(c) == set(c.namespaces)
    for node, ns_st in zip(c.nodes, st.namespaces, strict=False):
        assert ns_st.addresses == (f"nic0 {node.cidr}",)
        assert ns_st.qdiscs == (f"nic0 tbf {c.rate_bps / 1e6:g} Mbit/s",)
        assert not any(r.startswith("default") for r in ns_st.routes), ns_st.routes
    assert len(st.namespaces[-1].qdiscs) == len(c.nodes)  # the ingress side of every node, in the bridge
    for ns in c.namespaces:  # no IPv6 address anywhere: nothing but the ranks' IPv4 crosses the shaped links
        assert [
            a for link in json.loads(_sh("ip", "-n", ns, "-j", "-6", "addr", "show")) for a in link["addr_info"]
        ] == []

    # a shaped link: TCP payload within 15 % of the tbf rate (it is ~95.6 %: 1448 of 1514 bytes per frame)
    shaped = c.rate_bps / 8
    m = measure_link(c)
    assert 0.85 * shaped <= m.bandwidth_Bps <= 1.15 * shaped, (m, shaped)
    assert 0 < m.latency_s < 0.005
    if len(c.nodes) == 4:
        m23 = measure_link(c, 3, 2)
        assert 0.85 * shaped <= m23.bandwidth_Bps <= 1.15 * shaped, (m23, shaped)

    # no route out: the node reaches its own loopback and a peer node, never the root namespace
    with socket.create_server(("0.0.0.0", 0)) as srv:
        root_ip, port = _root_address(), srv.getsockname()[1]
        p = run_in_node(c, 0, [sys.executable, "-c", _REACH, c.nodes[1].address, root_ip, str(port)],
                        stdout=subprocess.PIPE, text=True)  # fmt: skip
        res = json.loads(p.communicate(timeout=20)[0])
    assert res["loopback"] == "connected" and res["peer"] == "refused", res
    assert res["root"].startswith("unreachable"), res

    # GLOO_SOCKET_IFNAME names the node's NIC, which carries the node's address
    p = run_in_node(
        c, 1, ["sh", "-c", 'ip -o -4 addr show dev "$GLOO_SOCKET_IFNAME"'], stdout=subprocess.PIPE, text=True
    )
    assert c.nodes[1].cidr in p.communicate(timeout=10)[0]

    # a process still running in a node is killed by down; nothing is left
    sleeper = run_in_node(c, 1, ["sleep", "60"])
    time.sleep(0.1)
    assert sleeper.pid in status(c).namespaces[1].pids
    assert set(down(c)) == set(c.namespaces)
    assert sleeper.wait(timeout=5) is not None
    assert not _our_namespaces(c) and _root_links() == links_before
    assert status(c).is_down


@needs_root
def test_leftovers_and_idempotent_down(cluster_of):
    c = cluster_of("emu-2x2")
    up(c)
    up(c)  # as after a crashed run: the old namespaces are replaced, not an error
    assert status(c).is_up
    subprocess.run(["ip", "netns", "delete", c.nodes[0].namespace], check=True)  # half torn down
    assert set(down(c)) == {c.nodes[1].namespace, c.bridge_namespace}
    assert down(c) == [] and not _our_namespaces(c)


@needs_root
def test_context_manager_cleans_up_on_error(cluster_of):
    c = cluster_of("emu-2x2")
    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    with pytest.raises(RuntimeError, match="boom"):
        with emulated(c):
            assert status(c).is_up
            raise RuntimeError("boom")
    assert not _our_namespaces(c)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


_HOLD = textwrap.dedent(
    """
    import sys, time
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster
    with emulated(plan_cluster("emu-2x2", tag=sys.argv[1])):
        print("up", flush=True)
        time.sleep(60)
    """
)


@needs_root
@pytest.mark.parametrize(
    "sig",
    [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT],
    ids=["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT"],
)
def test_context_manager_cleans_up_on_signal(cluster_of, sig):
    c = cluster_of("emu-2x2")  # the same names the child uses, so the fixture cleans up if it fails
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, TAG], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "up"
        assert _our_namespaces(c) == set(c.namespaces)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    # SIGTERM, SIGHUP and SIGQUIT raise Terminated, a KeyboardInterrupt the CLI tells apart (143, 129, 131)
    assert proc.returncode != 0 and ("KeyboardInterrupt" if sig == signal.SIGINT else "Terminated") in err
    assert not _our_namespaces(c)


@needs_root
def test_cli_up_status_down(capsys):
    topo = os.path.join(REPO, "shardsim", "data", "topologies", "emu-2x2.yaml")
    c = plan_cluster(load_instance(topo))
    if existing_namespaces() & set(c.namespaces):
        pytest.skip("a cluster named ss-emu-2x2 is up on this machine; not touching it")
    try:
        rc, out, _ = _cli(["cluster", "up", topo], capsys)
        assert rc == 0 and "emu-2x2: up" in out and "ss-emu-2x2-n1" in out and "10.213.0.2/24" in out
        rc, out, _ = _cli(["cluster", "status", topo], capsys)
        assert rc == 0 and out.count("tbf 200 Mbit/s") == 4
    finally:
        rc, out, _ = _cli(["cluster", "down", topo], capsys)
    assert rc == 0 and "3 namespaces removed" in out
    assert not existing_namespaces() & set(c.namespaces)
