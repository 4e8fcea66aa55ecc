"""Processes in an emulated node: its environment, starting a command in its namespace (in a process
group of its own), torchrun's command line for a node, and stopping a process group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

from shardsim.runtime.emulation.plan import EmulatedCluster
from shardsim.simulator.errors import ConfigError


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
