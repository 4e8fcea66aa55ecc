"""An emulated cluster's links as gloo gets them: the loopback inside a node, the NIC between
nodes, and what moving a byte costs a rank's CPU (timed by `runtime.profile.linkbench` under
torchrun inside the nodes)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from shardsim.core.errors import ConfigError


def measure_links(topology: str, nodes: int | None = None, timeout_s: float = 120.0) -> dict[str, float]:
    """Bring the emulated cluster up and measure, under torchrun in the cluster
    (`runtime.profile.linkbench`), the loopback inside a node as gloo's all-gather gets it with every
    node gathering at once, and a node's NIC as gloo's ring over all ranks gets it (`nic_Bps`,
    `nic_latency_s`, what the simulator uses), and the CPU seconds a rank spends per byte it
    sends in an all-gather and an all-reduce over all ranks (`*_cpu_s_per_B`), and what a small
    call waits while every rank alternates compute with calls (`call_wait_s`), and the NIC's
    queue they were measured with (`nic_queue_s`: `plan.QUEUE_LATENCY_S`). One TCP stream
    node 0 → node 1 and one inside node 0 are measured too (`nic_tcp_*`, `loopback_tcp_*`):
    for reference, and their latency is the least a ring step can take. Needs root."""
    import subprocess

    from shardsim.runtime.emulation.linkprobe import measure_link
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster
    from shardsim.runtime.emulation.processes import run_in_node, torchrun_argv
    from shardsim.runtime.launch import free_port
    from shardsim.runtime.processes import LAUNCHER_ENV, ProcessRef, die_with_parent

    cluster = plan_cluster(topology, nodes)
    out: dict[str, float] = {"nic_queue_s": cluster.queue_latency_s}  # the shaping the figures hold
    with emulated(cluster), tempfile.TemporaryDirectory(prefix="shardsim-linkbench-") as tmp:
        if len(cluster.nodes) > 1:
            nic = measure_link(cluster, 0, 1)
            out |= {"nic_tcp_Bps": nic.bandwidth_Bps, "nic_tcp_latency_s": nic.latency_s}
        lo = measure_link(cluster, 0, 0)
        out |= {"loopback_tcp_Bps": lo.bandwidth_Bps, "loopback_tcp_latency_s": lo.latency_s}
        result = Path(tmp) / "loopback.json"
        port = free_port()
        # TMPDIR: torchrun's torchelastic_* folders are removed with `tmp`; torchrun and its ranks
        # end with this process (a parent-death signal; the ranks watch it)
        env = {
            "OMP_NUM_THREADS": "1",
            "TORCH_CPP_LOG_LEVEL": "ERROR",
            "TMPDIR": tmp,
            LAUNCHER_ENV: str(ProcessRef.of(os.getpid())),
        }
        argv = ["-m", "shardsim.runtime.profile.linkbench", str(result)]
        procs = [
            run_in_node(
                cluster,
                i,
                torchrun_argv(cluster, i, argv, master_port=port),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=die_with_parent,
            )  # fmt: skip
            for i in range(len(cluster.nodes))
        ]
        try:
            errs = [p.communicate(timeout=timeout_s)[1] for p in procs]
        except subprocess.TimeoutExpired:
            raise ConfigError(f"timing gloo inside the nodes of {topology} took over {timeout_s:g} s") from None
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if any(p.returncode for p in procs) or not result.exists():
            why = next((e.decode(errors="replace").strip().splitlines()[-1] for e in errs if e.strip()), "no output")
            raise ConfigError(f"timing gloo inside the nodes of {topology} failed: {why}")
        lb = json.loads(result.read_text())
    return out | ring_figures(lb, lo.latency_s, out.get("nic_tcp_latency_s"))


def ring_figures(bench: dict, loopback_tcp_latency_s: float, nic_tcp_latency_s: float | None) -> dict[str, float]:
    """The link figures the simulator uses, from `runtime.profile.linkbench`'s fits. A ring step takes
    at least a one-way trip over its link, so a fit's per-step cost (clamped at 0 when the
    small size went at the full rate, as it can with tbf's bucket) is floored at the TCP probe's.
    The CPU a rank spends per byte it sends, and what a call waits for ranks not yet scheduled,
    pass through as measured."""
    out = {"loopback_Bps": bench["loopback_Bps"]}
    out |= {k: bench[k] for k in ("gather_cpu_s_per_B", "reduce_cpu_s_per_B", "call_wait_s") if k in bench}
    out["loopback_latency_s"] = max(bench["loopback_latency_s"], loopback_tcp_latency_s)
    if "nic_ring_Bps" in bench and nic_tcp_latency_s is not None:
        out |= {"nic_Bps": bench["nic_ring_Bps"], "nic_latency_s": max(bench["nic_ring_latency_s"], nic_tcp_latency_s)}
        if "nic_pair_gather_Bps" in bench:
            out["nic_pair_gather_Bps"] = bench["nic_pair_gather_Bps"]
    return out
