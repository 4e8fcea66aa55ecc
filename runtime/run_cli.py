"""`shardsim run`: execute a configuration for real on this machine and measure it.

Checks everything that can be checked before a process is spawned (the configuration, the
world size against the strategy's degrees, ranks against devices, the model), then
launches torchrun (`runtime.launch`) with one rank per device: nccl on GPUs, gloo on CPU.
Bad input is one line on stderr and exit status 2; a failed run is one line naming the
rank and exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from shardsim.runtime.records import check_runs_csv, load_run
from shardsim.simulator.config import Resolved, RunConfig, add_config_arguments, config_from_args, resolve
from shardsim.simulator.errors import ConfigError
from shardsim.simulator.files import check_output_dir
from shardsim.simulator.flagtypes import Count
from shardsim.simulator.scale import MAX_WORLD
from shardsim.simulator.workload.load import spec_name

log = logging.getLogger("shardsim")

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
    from shardsim.simulator.sweep.execute import default_workers

    return max(MAX_CPU_RANKS, CPU_RANKS_PER_CORE * default_workers())


def plan_run(cfg: RunConfig, nproc: int | None, emulate: bool | None = None) -> RunPlan:
    """Ranks on this machine and the resolved configuration, or ConfigError.

    `emulate` (default: whenever the topology is an emulated one and the run is on CPU) runs
    the ranks in the emulated cluster: every node a network namespace, links shaped by tc."""
    from shardsim.runtime.models.build import n_blocks
    from shardsim.simulator.hardware.topology import make_cluster

    cluster = make_cluster(cfg.topology, cfg.nodes)
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
    resolved, res = resolve(cfg, n, n_blocks(cfg.workload, cfg.shape, pipeline=cfg.strategy.spec.is_pipeline))
    return RunPlan(cfg, resolved, res, n, on_gpu, emulate)


def main_run(ns: argparse.Namespace) -> int:
    from shardsim.simulator.torch_required import require_torch

    require_torch("shardsim run")
    cfg = config_from_args(ns)
    for key in ("profile", "calibration"):  # inputs of a prediction: a run would ignore them
        if getattr(cfg, key) is not None:
            raise ConfigError(
                f"a run measures; a {key} is an input of a prediction (predict, sweep, validate): leave it out",
                where=cfg.source,
                field=key,
            )
    plan = plan_run(cfg, ns.nproc, ns.emulate)
    with _holding(plan, ns.wait):  # a busy topology is refused before anything is made or said
        return _run(ns, plan)


def _holding(plan: RunPlan, wait: bool):
    """Hold the emulated cluster a run will use for the whole command (`emulation.namespaces.held`);
    nothing to hold over loopback."""
    if not plan.emulate:
        return contextlib.nullcontext()
    from shardsim.runtime.emulation.namespaces import held
    from shardsim.runtime.emulation.plan import plan_cluster

    return held([plan_cluster(plan.resolved_cfg.topology, plan.resolved_cfg.nodes)], wait=wait)


def _run(ns: argparse.Namespace, plan: RunPlan) -> int:
    from shardsim.runtime.train import default_run_id

    out = check_output_dir(Path(ns.out).resolve(), "out")
    check_runs_csv(out)  # its row is added at the end: a torn one is named now, not after the run
    run_id = default_run_id(plan.resolved_cfg)
    worker_args = run_flags(plan.cfg, ns.steps, ns.warmup, out, ns.timeout, ns.threads, ns.data_batches, run_id)
    if getattr(ns, "save_params", None):
        worker_args += ["--save-params", str(Path(ns.save_params).resolve())]
    where = "GPU" if plan.on_gpu else "CPU"
    inside = f" in the emulated cluster {plan.resolved_cfg.topology}" if plan.emulate else ""
    log.info(
        "running %s, %s, on %d %s ranks%s (%d warm-up + %d measured steps)",
        spec_name(plan.resolved_cfg.workload),
        plan.resolved_cfg.strategy.label(),
        plan.nproc,
        where,
        inside,
        ns.warmup,
        ns.steps,
    )
    result = run_planned(plan, worker_args, ns.timeout, ns.threads, stdout=2 if ns.json else None, wait=ns.wait)
    if not result.ok:
        log.error("run failed: %s", result.message)
        return 1
    path = out / f"{run_id}.json"
    if ns.json:
        try:
            print(load_run(path).to_json())
        except (OSError, ValueError) as exc:
            log.error("run finished but its result %s is unreadable: %s", path, exc)
            return 1
    return 0


def run_flags(
    cfg: RunConfig, steps: int, warmup: int, out: Path, timeout_s: float, threads: int, data_batches: int, run_id: str
) -> list[str]:
    """The arguments of runtime.train for one run of `cfg` (the configuration as explicit flags)."""
    from shardsim.runtime.launch import config_flags

    return config_flags(cfg) + [
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
        return launch(plan.nproc, worker_args, timeout_s=timeout_s, threads=threads, stdout=stdout)
    from shardsim.runtime.emulation.namespaces import emulated
    from shardsim.runtime.emulation.plan import plan_cluster

    cluster = plan_cluster(plan.resolved_cfg.topology, plan.resolved_cfg.nodes)
    with emulated(cluster, wait=wait):
        return launch(plan.nproc, worker_args, timeout_s=timeout_s, threads=threads, stdout=stdout, cluster=cluster)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from shardsim.runtime.train import add_run_arguments

    add_config_arguments(p)
    add_run_arguments(p)
    p.add_argument(
        "--nproc",
        type=Count(MAX_WORLD),
        help="ranks on this machine (default: the topology's devices per node on a GPU machine; "
        f"on CPU the cluster's world size if at most {MAX_CPU_RANKS}); at most one per GPU, or on CPU "
        f"{CPU_RANKS_PER_CORE} per core (at least {MAX_CPU_RANKS})",
    )
    p.add_argument(
        "--emulate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run in the emulated cluster (a network namespace per node, tc-shaped NICs; needs root); "
        "default: yes for an emulated topology on CPU with its own world size. --no-emulate runs every "
        "rank in this namespace over loopback",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="when another job holds the emulated topology, wait for it (default: refuse, exit 2)",
    )
    p.add_argument("--save-params", help=argparse.SUPPRESS)


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "run",
        help="run the configuration for real (torchrun; FSDP2, pipelining, DDP) and measure step time",
        description="Run the configuration for real with PyTorch's own engines (FSDP2, pipelining, DDP) under "
        "torchrun — nccl on GPUs, gloo on CPU, in the emulated cluster for an emulated topology — and "
        "measure step time and peak memory.",
    )
    add_arguments(p)
    p.set_defaults(func=main_run)
