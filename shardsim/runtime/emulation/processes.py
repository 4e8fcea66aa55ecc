"""Processes in an emulated node: its environment, starting a command in its namespace (in a process
group of its own), torchrun's command line for a node, stopping a process group, and telling the
processes shardsim started in a namespace from those it did not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardsim.core.errors import ConfigError
from shardsim.runtime.emulation.iproute import namespace_pids
from shardsim.runtime.emulation.plan import EmulatedCluster

# in the environment of every process `run_in_node` starts (and so of its children): the cluster's
# prefix. Teardown kills what carries its cluster's mark, and nothing else unless told to.
MARK = "SHARDSIM_CLUSTER"


def node_env(cluster: EmulatedCluster, node: int, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a process on `node`: this one's, then `env`, then the socket interface and
    the cluster's mark (`MARK`)."""
    out = dict(os.environ)
    out.update(env or {})
    out[MARK] = cluster.prefix
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


@dataclass(frozen=True)
class NodeProcess:
    """A process in one of a cluster's namespaces."""

    pid: int
    namespace: str
    command: str
    ours: bool  # started by shardsim in this cluster (carries its `MARK`)

    def describe(self) -> str:
        return f"pid {self.pid} ({self.command}) in {self.namespace}"


def node_processes(cluster: EmulatedCluster, namespace: str) -> list[NodeProcess]:
    """The processes in `namespace` now (one that ends meanwhile is left out), each with whether
    shardsim started it in `cluster`: whether its environment carries the cluster's mark."""
    mark = f"{MARK}={cluster.prefix}".encode()
    out = []
    for pid in namespace_pids(namespace):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        cmd = cmd if len(cmd) <= 60 else cmd[:57] + "..."
        out.append(NodeProcess(pid, namespace, cmd or "?", mark in env))
    return out
