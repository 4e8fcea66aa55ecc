"""A TCP probe of one link of an emulated cluster that is up: latency from small ping-pongs,
bandwidth from one stream (plain Python in the two nodes, no iperf)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
from typing import NamedTuple

from shardsim.core.errors import ConfigError
from shardsim.runtime.emulation.iproute import EmulationError
from shardsim.runtime.emulation.plan import EmulatedCluster
from shardsim.runtime.emulation.processes import kill_group, run_in_node


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
