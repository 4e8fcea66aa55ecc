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
from pathlib import Path

from shardsim.cli.inputs import config_inputs
from shardsim.config import add_config_arguments, config_from_args
from shardsim.core.errors import ConfigError
from shardsim.core.files import check_not_input, check_output_dir, output_folder
from shardsim.core.flagtypes import Count
from shardsim.runtime.plan import CPU_RANKS_PER_CORE, MAX_CPU_RANKS, RunPlan, plan_run, run_flags, run_planned
from shardsim.runtime.records import CSV_NAME, check_runs_csv, load_run
from shardsim.specs.bounds import MAX_WORLD
from shardsim.specs.model.load import spec_name

log = logging.getLogger("shardsim")


def main_run(ns: argparse.Namespace) -> int:
    from shardsim.core.torch_required import require_torch

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
    out = check_output_dir(Path(ns.out).resolve(), "out")
    check_not_input([out / CSV_NAME], config_inputs(ns, cfg), "out")
    with _holding(plan, ns.wait), output_folder(out, "out"):  # a busy topology is refused before anything is made
        return _run(ns, plan, out)


def _holding(plan: RunPlan, wait: bool):
    """Hold the emulated cluster a run will use for the whole command (`emulation.namespaces.held`);
    nothing to hold over loopback."""
    if not plan.emulate:
        return contextlib.nullcontext()
    from shardsim.runtime.emulation.namespaces import held
    from shardsim.runtime.emulation.plan import plan_cluster

    return held([plan_cluster(plan.resolved_cfg.topology, plan.resolved_cfg.nodes)], wait=wait)


def _run(ns: argparse.Namespace, plan: RunPlan, out: Path) -> int:
    from shardsim.runtime.train import default_run_id

    check_runs_csv(out)  # its row is added at the end: a torn one is named now, not after the run
    run_id = default_run_id(plan.resolved_cfg)
    worker_args = run_flags(ns.steps, ns.warmup, out, ns.timeout, ns.threads, ns.data_batches, run_id)
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
