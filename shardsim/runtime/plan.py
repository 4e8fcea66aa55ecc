"""A run's plan: the resolved configuration, how many ranks, GPU or CPU, emulated cluster or
loopback (checked before a process is spawned), the flags each rank receives, and its launch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shardsim.config import Resolved, RunConfig, resolve
from shardsim.core.errors import ConfigError

MAX_CPU_RANKS = 8  # default world on a CPU machine when --nproc is not given


CPU_RANKS_PER_CORE = 4  # a CPU run takes at most this many ranks per core (and at least MAX_CPU_RANKS)


@dataclass(frozen=True)
class RunPlan:
    cfg: RunConfig  # as given (workers resolve it again against their world)
    resolved_cfg: RunConfig
    res: Resolved
    nproc: int
    on_gpu: bool
    emulate: bool  # run inside the emulated cluster (a namespace per node, shaped links)


def gpu_count() -> int:
    """CUDA devices visible here; torch is imported only when a driver is present."""
    if not os.path.isdir("/proc/driver/nvidia/gpus") and not any(Path("/dev").glob("nvidia[0-9]*")):
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_rank_limit() -> int:
    """The most ranks a CPU run starts on this machine: `CPU_RANKS_PER_CORE` per core it may run
    on, and never fewer than `MAX_CPU_RANKS`."""
    from shardsim.sweep.task import default_workers

    return max(MAX_CPU_RANKS, CPU_RANKS_PER_CORE * default_workers())


def plan_run(cfg: RunConfig, nproc: int | None, emulate: bool | None = None) -> RunPlan:
    """Ranks on this machine and the resolved configuration, or ConfigError.

    `emulate` (default: whenever the topology is an emulated one and the run is on CPU) runs
    the ranks in the emulated cluster: every node a network namespace, links shaped by tc."""
    from shardsim.runtime.models.build import n_blocks
    from shardsim.runtime.models.checks import check_runtime_tp
    from shardsim.specs.hardware.topology import make_cluster
    from shardsim.specs.model.load import resolve_arch

    cluster = make_cluster(cfg.topology, cfg.nodes, cfg.gpus_per_node)
    gpus = gpu_count() if cluster.instance.device.kind != "cpu" else 0
    on_gpu = gpus > 0
    if on_gpu:
        n = nproc or cluster.devices_per_node
        if n > gpus:
            raise ConfigError(
                f"{n} ranks on this machine but it has {gpus} GPU(s): one rank per device (lower --nproc)",
                field="nproc",
            )
    else:
        n = nproc or cluster.world
        if nproc is None and n > MAX_CPU_RANKS:
            raise ConfigError(
                f"{cluster.describe()} is {n} ranks; a CPU run here defaults to at most {MAX_CPU_RANKS} "
                "(pass --nproc N, or fewer --nodes)",
                field="nproc",
            )
        if n > (limit := cpu_rank_limit()):
            raise ConfigError(
                f"{n:,} CPU ranks is more than this machine runs: at most {limit} "
                f"({CPU_RANKS_PER_CORE} per core, at least {MAX_CPU_RANKS}; lower --nproc)",
                field="nproc",
            )
    is_emulated = cluster.instance.emulated is not None
    if emulate is None:  # --nproc other than the cluster's world size means: all ranks here, over loopback
        emulate = is_emulated and not on_gpu and n == cluster.world
    if emulate:
        if not is_emulated:
            raise ConfigError(
                f"topology {cluster.instance.name!r} is not emulated; --emulate needs one such as emu-2x2",
                field="emulate",
            )
        if n != cluster.world:
            raise ConfigError(
                f"the emulated cluster {cluster.describe()} runs {cluster.world} ranks, not --nproc {n} "
                "(pass --no-emulate to run any number of ranks over loopback)",
                field="nproc",
            )
        from shardsim.runtime.emulation.iproute import check_privileges

        try:
            check_privileges()
        except ConfigError as exc:
            raise ConfigError(f"{exc} (or pass --no-emulate to run every rank over loopback)") from None
    arch = resolve_arch(cfg.workload, cfg.shape)[1]
    blocks = n_blocks(cfg.workload, cfg.shape, pipeline=cfg.strategy.spec.is_pipeline)
    tied = bool(arch and arch.tied_embeddings)
    per_node = cluster.devices_per_node if emulate else n  # without emulation every rank runs on this machine
    resolved, res = resolve(cfg, n, blocks, tied_embeddings=tied, arch=arch, devices_per_node=per_node)
    check_runtime_tp(arch, res.tp, resolved.strategy.async_tp)
    from shardsim.runtime.schedule_checks import check_runtime_pipeline

    check_runtime_pipeline(resolved.strategy, res.dp > 1)
    from shardsim.runtime.stack import check_runtime_stack
    from shardsim.simulator.strategies.planners import PLANNERS
    from shardsim.specs.model.blocks import check_mlm

    check_runtime_stack(resolved, on_gpu, PLANNERS[resolved.strategy.kind].sharded(res))
    check_mlm(arch, resolved.mlm_fraction)
    return RunPlan(cfg, resolved, res, n, on_gpu, emulate)


def run_flags(
    steps: int, warmup: int, out: Path, timeout_s: float, threads: int, data_batches: int, run_id: str
) -> list[str]:
    """The arguments of runtime.train for one run (its configuration goes as JSON: `launch.write_config`)."""
    return [
        "--steps", str(steps),
        "--warmup", str(warmup),
        "--out", str(out),
        "--timeout", str(timeout_s),
        "--threads", str(threads),
        "--data-batches", str(data_batches),
        "--run-id", run_id,
    ]  # fmt: skip


def run_planned(plan: RunPlan, worker_args: list[str], timeout_s: float, threads: int, stdout=None, wait: bool = False):
    """Launch the ranks of `plan`: over loopback, or in the emulated cluster, held for this run
    (refused while another job holds it, or waited for with `wait`), brought up and always torn
    down (also on error and Ctrl-C)."""
    from shardsim.runtime.launch import launch

    if not plan.emulate:
        return launch(plan.nproc, worker_args, timeout_s=timeout_s, threads=threads, stdout=stdout, config=plan.cfg)
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster

    cluster = plan_cluster(plan.resolved_cfg.topology, plan.resolved_cfg.nodes)
    with emulated(cluster, wait=wait):
        return launch(
            plan.nproc,
            worker_args,
            timeout_s=timeout_s,
            threads=threads,
            stdout=stdout,
            cluster=cluster,
            config=plan.cfg,
        )
