"""A measured profile (written by `shardsim profile`), as the simulator uses it.

A profile replaces model figures with measured ones:
- per-block forward/backward seconds at each measured microbatch size (the compute model);
- Adam seconds per parameter;
- per emulated topology, the achieved bandwidth and latency of a node's NIC and of the
  loopback between two ranks of one node (the links), the CPU seconds a rank spends per
  byte it sends (on one host, moving bytes takes the cores that compute needs), and what a
  call waits for ranks the host has not scheduled yet;
- how many cores the host's processes really get when N ranks compute at once
  (`effective_cores`: N processes on C cores do not each run at C/N of their speed alone,
  caches and memory bandwidth are shared too), and the hypervisor's share of their time then;
- FSDP2's own work in a forward and a backward (copies in and out of its collectives' buffers).

A block timed at another microbatch size than the one predicted is scaled linearly from the
nearest measured size (a named simplification: small microbatches run matmuls less
efficiently, so measure the sizes you predict; `shardsim validate` does).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from shardsim.core.errors import ConfigError
from shardsim.core.yamlio import load_json
from shardsim.specs.hardware.topology import Cluster

# A run whose cores the hypervisor takes more of than this is scaled as if it took this much:
# a bound on a correction, not a figure of the host (what was measured: experiments/validation/README.md)
MAX_STEAL_SHARE = 0.9


@dataclass(frozen=True)
class LinkProfile:
    """Measured links of one emulated topology (None: not measured, the topology's figure stays)."""

    nic_Bps: float | None = None  # payload bytes/s of one node's NIC, one direction
    nic_latency_s: float | None = None
    # payload bytes/s of one NIC while each of its node's ranks all-gathers with its peer on
    # another node at once (gloo's 2-rank ring: `runtime.profile.linkbench._pair_gather_Bps`)
    nic_pair_gather_Bps: float | None = None
    loopback_Bps: float | None = None  # payload bytes/s between two ranks of one node
    loopback_latency_s: float | None = None
    # core-seconds a rank spends per byte it sends in gloo's all-gather / all-reduce over all
    # ranks (process CPU time: gloo's copies and reductions, the kernel's TCP on both ends)
    gather_cpu_s_per_B: float | None = None
    reduce_cpu_s_per_B: float | None = None
    # seconds a collective call waits, beyond its latency on an idle host, for ranks the host's
    # scheduler has not run yet, when every rank alternates compute with calls and the ranks
    # outnumber the cores (`runtime.profile.linkbench._call_wait_s`; engine.simulate's `call_wait_s`)
    call_wait_s: float | None = None
    # the emulated NICs' tbf queue these figures were measured with (`runtime.emulation.plan`)
    nic_queue_s: float | None = None

    def comm_cpu(self) -> dict[str, float] | None:
        """Core-seconds per byte sent, per collective (engine.simulate's `comm_cpu`); None when
        not measured. gloo's reduce-scatter is an all-reduce; a broadcast and a pipeline's
        send move bytes as an all-gather does."""
        if self.gather_cpu_s_per_B is None or self.reduce_cpu_s_per_B is None:
            return None
        g, r = self.gather_cpu_s_per_B, self.reduce_cpu_s_per_B
        return {"all_gather": g, "broadcast": g, "send_recv": g, "all_reduce": r, "reduce_scatter": r}


@dataclass(frozen=True)
class Profile:
    path: str
    workload: str
    blocks: dict[int, dict[str, tuple[float, float]]]  # microbatch → block → (fwd_s, bwd_s) per microbatch
    optimizer_per_param_s: float | None = None
    links: dict[str, LinkProfile] = field(default_factory=dict)  # topology name → measured links
    effective_cores: dict[int, float] = field(default_factory=dict)  # ranks computing at once → cores
    # ranks computing at once → cores' worth of CPU time the host gives them together (the
    # effective cores before their work's own slowdown from sharing caches, `probe_inflation`)
    cpu_capacity: dict[int, float] = field(default_factory=dict)
    # ranks computing at once → the part of the host's cores' time the hypervisor took while the
    # two figures above were measured (time they lost, runtime.emulation.hostspeed.Steal)
    steal_share: dict[int, float] = field(default_factory=dict)
    yardstick_s: float | None = None  # the whole model's forward + backward on every core at once, when profiled
    # an Adam step on FSDP2's (DTensor) parameters over one on plain ones: per step, whatever the shard
    sharded_optimizer_overhead_s: float | None = None
    # the host-speed probe (runtime.emulation.hostspeed) at the speed every figure is stated at
    probe_s: float | None = None
    # FSDP2's own CPU work in a forward and in a backward of the whole model, one microbatch,
    # over the same passes unsharded (copies in and out of its collectives' buffers, hooks):
    # timed on this host with collectives that move nothing (runtime.profile.fsdp_overhead)
    fsdp_overhead_s: tuple[float, float] | None = None
    # a tensor-parallel rank's whole-model forward and backward over the model's, per (tp,
    # sequence_parallel), timed with collectives that move nothing (runtime.profile.tensor_parallel)
    tp_share: dict[tuple[int, bool], tuple[float, float]] = field(default_factory=dict)
    # the same per microbatch size (empty in a profile that has `tp_share` only: one size)
    tp_share_by_batch: dict[int, dict[tuple[int, bool], tuple[float, float]]] = field(default_factory=dict)

    def tp_share_at(self, tp: int, sequence_parallel: bool, batch: int) -> tuple[float, float] | None:
        """A tensor-parallel rank's measured share at microbatch `batch`: at that size, or the
        nearest measured one (by ratio), or `tp_share` (one size) when none is by size."""
        key = (tp, sequence_parallel)
        sizes = [b for b, shares in self.tp_share_by_batch.items() if key in shares]
        if not sizes:
            return self.tp_share.get(key)
        near = min(sizes, key=lambda b: (abs(math.log(b / batch)), -b))
        return self.tp_share_by_batch[near][key]

    def slowed(self, factor: float, among_ranks: bool = False, steal_share: float | None = None) -> Profile:
        """This profile on a host `factor` times slower than when it was measured: block and
        optimizer times (and the sharded optimizer's and FSDP2's own overheads, and what
        moving a byte costs the cores) scaled (a shared host's speed drifts; `validate` reads
        the factor with the profile's own probe in each run, or a yardstick around it).

        `among_ranks`: the factor was read among the ranks computing at once (the runtime's
        probe), so it holds the slowdown of their sharing caches too: the cores are then the
        CPU time the host gives them (`cpu_capacity`), not the effective cores, which hold
        that slowdown a second time.

        `steal_share`: the part of the host's cores' time the hypervisor took during the run
        (runtime.emulation.hostspeed.Steal; no probe sees it): the cores are scaled by what it left over
        what it left the core-sharing measurement."""

        def slow(v: float | None) -> float | None:
            return None if v is None else v * factor

        blocks = {b: {k: (f * factor, w * factor) for k, (f, w) in t.items()} for b, t in self.blocks.items()}
        fsdp = None if self.fsdp_overhead_s is None else tuple(v * factor for v in self.fsdp_overhead_s)
        links = {
            top: replace(
                lp, gather_cpu_s_per_B=slow(lp.gather_cpu_s_per_B), reduce_cpu_s_per_B=slow(lp.reduce_cpu_s_per_B)
            )
            for top, lp in self.links.items()
        }
        return replace(
            self,
            blocks=blocks,
            optimizer_per_param_s=slow(self.optimizer_per_param_s),
            sharded_optimizer_overhead_s=slow(self.sharded_optimizer_overhead_s),
            fsdp_overhead_s=fsdp,
            links=links,
            effective_cores=self._cores_under(
                self.cpu_capacity if among_ranks and self.cpu_capacity else self.effective_cores, steal_share
            ),
        )

    def _cores_under(self, cores: dict[int, float], steal_share: float | None) -> dict[int, float]:
        """`cores` (rank count → cores) where the hypervisor takes `steal_share` of the host's
        cores' time instead of the part it took while they were measured."""
        if steal_share is None:
            return cores
        left = 1.0 - min(max(steal_share, 0.0), MAX_STEAL_SHARE)
        return {n: c * left / (1.0 - min(self.steal_share.get(n, 0.0), MAX_STEAL_SHARE)) for n, c in cores.items()}

    def block_time(self, name: str, batch: int) -> tuple[float, float] | None:
        """(fwd_s, bwd_s) of block `name` for a microbatch of `batch` samples, or None if not profiled."""
        if batch in self.blocks and name in self.blocks[batch]:
            return self.blocks[batch][name]
        measured = [b for b, table in self.blocks.items() if name in table]
        if not measured:
            return None
        near = min(measured, key=lambda b: (abs(b - batch), -b))
        f, bw = self.blocks[near][name]
        return f * batch / near, bw * batch / near

    def cores_for(self, ranks: int, cores: float) -> float:
        """Cores that `ranks` processes computing at once really get: the figure measured for the
        nearest rank count, or `cores` when none was measured."""
        if not self.effective_cores:
            return cores
        return self.effective_cores[min(self.effective_cores, key=lambda n: (abs(n - ranks), -n))]

    def comm_cpu(self, cluster: Cluster) -> dict[str, float] | None:
        """What moving a byte costs the host's cores in this topology, if measured."""
        lp = self.links.get(cluster.instance.name)
        return None if lp is None else lp.comm_cpu()

    def call_wait_s(self, cluster: Cluster) -> float:
        """What a collective call waits for unscheduled ranks in this topology (0 if not measured)."""
        lp = self.links.get(cluster.instance.name)
        return 0.0 if lp is None or lp.call_wait_s is None else lp.call_wait_s

    def apply(self, cluster: Cluster) -> Cluster:
        """The cluster with this profile's measured links of its topology, if any."""
        lp = self.links.get(cluster.instance.name)
        if lp is None:
            return cluster
        inst = cluster.instance
        nic, fabric = inst.nic, inst.fabric
        if lp.nic_Bps:
            # the measured figure is achieved payload rate: no further efficiency applies
            nic = replace(nic, rate_gbps=lp.nic_Bps * 8 / 1e9 / nic.count, efficiency=1.0)
        if lp.nic_latency_s is not None:
            nic = replace(nic, latency_us=lp.nic_latency_s * 1e6)
        if lp.nic_Bps and lp.nic_pair_gather_Bps:
            nic = replace(nic, pair_gather_efficiency=min(1.0, lp.nic_pair_gather_Bps / lp.nic_Bps))
        if lp.loopback_Bps:
            fabric = replace(fabric, port_GBps=lp.loopback_Bps / 1e9, efficiency=1.0)
        if lp.loopback_latency_s is not None:
            fabric = replace(fabric, latency_us=lp.loopback_latency_s * 1e6)
        return replace(cluster, instance=replace(inst, nic=nic, fabric=fabric))


def parse_profile(doc: Any, where: str, workload: str) -> Profile:
    """Check a profile document (`profile_schema.ProfileDoc`) against the workload it is used for."""
    from shardsim.core.documents import checked
    from shardsim.simulator.hardware.profile_schema import HostDoc, ProfileDoc

    if not isinstance(doc, dict):
        raise ConfigError("expected a JSON object (a profile written by shardsim profile)", where=where)
    if doc.get("workload") != workload:
        raise ConfigError(f"profile is for workload {doc.get('workload')!r}, not {workload!r}", where=where)
    d = checked(ProfileDoc, doc, where)

    def pairs(table: dict[str, list[float]]) -> dict[str, tuple[float, float]]:
        return {k: (v[0], v[1]) for k, v in table.items()}

    blocks = {int(b): pairs(t) for b, t in (d.blocks_by_batch_s or {}).items()}
    if not blocks and d.blocks_per_sample_s is not None:
        blocks[1] = pairs(d.blocks_per_sample_s)
    if not blocks:
        raise ConfigError(
            "missing; expected blocks_by_batch_s (or blocks_per_sample_s)", where=where, field="blocks_by_batch_s"
        )
    host = d.host or HostDoc()

    def by_count(table: dict[str, float] | None) -> dict[int, float]:
        return {int(n): v for n, v in (table or {}).items()}

    fo = d.fsdp_overhead_s
    return Profile(
        path=where,
        workload=workload,
        blocks=blocks,
        optimizer_per_param_s=d.optimizer_per_param_s,
        links={top: LinkProfile(**lp.model_dump()) for top, lp in (d.links or {}).items()},
        effective_cores=by_count(host.effective_cores),
        cpu_capacity=by_count(host.cpu_capacity),
        steal_share=by_count(host.steal_share),
        # (a profile before the yardstick used every core wrote `yardstick_s`: not comparable, unused)
        yardstick_s=host.yardstick_all_cores_s,
        sharded_optimizer_overhead_s=d.sharded_optimizer_overhead_s,
        probe_s=d.probe_s,
        fsdp_overhead_s=None if fo is None else (fo.fwd_s, fo.bwd_s),
        tp_share={_tp_layout(k): (v[0], v[1]) for k, v in (d.tp_share or {}).items()},
        tp_share_by_batch={
            int(b): {_tp_layout(k): (v[0], v[1]) for k, v in shares.items()}
            for b, shares in (d.tp_share_by_batch or {}).items()
        },
    )


def _tp_layout(key: str) -> tuple[int, bool]:
    """A `tp_share` key (``2``, ``2+sp``) as (tp, sequence_parallel)."""
    tp, _, sp = key.partition("+")
    return int(tp), sp == "sp"


def load_profile(path: str | Path, workload: str) -> Profile:
    """Read and check a profile file (`shardsim profile`) for `workload`."""
    return parse_profile(load_json(Path(path)), str(path), workload)
