"""One rank of a real training run: ``python -m shardsim.runtime.train [CONFIG.yaml] [flags]``.

Launched by torchrun, one process per device: by ``shardsim run`` on one machine, or by you
under multi-node torchrun or Slurm (see docs/runtime.md). Reads the same configuration as the
simulator (under ``shardsim run``: the JSON file the launcher wrote in the run folder, or
``--config-json``; run by you: a file and flags), builds the same model, applies the strategy with PyTorch's own engines
(`runtime.strategies`), trains on seeded synthetic data and measures each step between two
synchronization points (cuda.synchronize + dist.barrier): a `runtime.trainer.Trainer` with its
observers. Rank 0 writes the results.

Under ``shardsim run`` a rank ends with the run: when torchrun (its parent) dies, and when the
``shardsim`` process that launched the job is gone; it never writes the result of a run whose
launcher has ended, nor reports a failure to nobody (`follow_launcher`, `check_launcher`).

A rank that returns (finished, or bad input) ends its process without finalizing the
interpreter (`runtime.processes.exit_now`): gloo's worker threads can still be letting go of the
last collective then, and would abort the process (a finished run reported as failed).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shardsim.config import RunConfig, add_config_arguments, config_from_args
from shardsim.config.flags import overrides_from_args
from shardsim.config.load import load_config_json
from shardsim.core.errors import ConfigError, WriteError
from shardsim.core.flagtypes import Count, Real
from shardsim.runtime import processes
from shardsim.runtime.launch import CONFIG_FILE
from shardsim.runtime.processes import launcher
from shardsim.runtime.records import RunRecord, step_time_stats, write_run
from shardsim.runtime.trainer import CpuTimes, ExpertTokens, Measured, Observer, PeakMemory, Trainer
from shardsim.simulator.results import KEY_FIELDS, result_key
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.load import spec_name

DEFAULT_TIMEOUT_S = 30.0
# bounds of a run's flags, checked as they are parsed
MAX_STEPS = 100_000  # measured steps, warm-up steps, distinct data batches
MAX_TIMEOUT_S = 86_400.0  # a collective's wait for its peers: a day
MAX_THREADS = 1_024  # torch threads of one rank


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of a run shared by `shardsim run` and `python -m shardsim.runtime.train`."""
    p.add_argument(
        "--steps", type=Count(MAX_STEPS), default=5, help="measured steps, after the warm-up (default: %(default)s)"
    )
    p.add_argument(
        "--warmup", type=Count(MAX_STEPS, 0), default=1, help="warm-up steps, not measured (default: %(default)s)"
    )
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--out", default="results/runs", help="folder for <run_id>.json and runs.csv (default: %(default)s)")
    p.add_argument(
        "--timeout",
        type=Real(0.0, MAX_TIMEOUT_S),
        default=DEFAULT_TIMEOUT_S,
        help="seconds a rank waits for its peers in a collective before the job fails (default: %(default)s)",
    )
    p.add_argument(
        "--threads", type=Count(MAX_THREADS), default=1, help="torch threads per rank on CPU (default: %(default)s)"
    )
    p.add_argument(
        "--data-batches",
        type=Count(MAX_STEPS, 0),
        default=0,
        metavar="N",
        help="cycle through N distinct global batches (default 0: a new one every step, as FakeDataset); "
        "1 repeats one batch, so the loss falls visibly",
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m shardsim.runtime.train", description=__doc__.splitlines()[0])
    add_config_arguments(p)
    p.add_argument(
        "--config-json",
        metavar="PATH",
        help="the configuration as RunConfig JSON, in place of CONFIG and its flags (default: none; under shardsim "
        f"run, the run folder's {CONFIG_FILE})",
    )
    add_run_arguments(p)
    p.add_argument("--run-id", help="name of the result file (default: time + strategy)")
    p.add_argument("--no-write", action="store_true", help="do not write result files")
    return p


def rank_config(ns: argparse.Namespace) -> RunConfig:
    """The configuration this rank runs: ``--config-json``; else CONFIG and flags when any is
    given; else the launcher's JSON in the run folder (``$SHARDSIM_RUN_DIR``); else the defaults."""
    given = ns.config is not None or any(v is not None for v in overrides_from_args(ns).values())
    if ns.config_json is not None:
        if given:
            raise ConfigError("give --config-json or a config file and flags, not both", field="config_json")
        return load_config_json(ns.config_json)
    run_dir = os.environ.get("SHARDSIM_RUN_DIR")
    if not given and run_dir and (Path(run_dir) / CONFIG_FILE).exists():
        return load_config_json(Path(run_dir) / CONFIG_FILE)
    return config_from_args(ns)


def wants_cuda(cfg: RunConfig) -> bool:
    """nccl on CUDA devices when there are any and the topology's devices are GPUs; gloo on CPU."""
    import torch

    if not torch.cuda.is_available():
        return False
    from shardsim.specs.hardware.topology import load_instance

    return load_instance(cfg.topology).device.kind != "cpu"


def default_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    label = cfg.strategy.label().replace(" ", "-").replace("=", "")
    return f"{stamp}-{spec_name(cfg.workload).replace(':', '.').replace('/', '.')}-{label}-{os.getpid()}"


def follow_launcher() -> None:
    """Under ``shardsim run``: end this rank with torchrun and with the launcher
    (`runtime.processes.follow_launcher`); the run's status folder goes with the last rank."""
    run_dir = os.environ.get("SHARDSIM_RUN_DIR")
    processes.follow_launcher(cleanup=(lambda: shutil.rmtree(run_dir, ignore_errors=True)) if run_dir else None)


def check_launcher() -> None:
    """Raise RuntimeError when the ``shardsim`` process that launched this run has ended: nobody
    waits for its result, which the user was told failed (not written)."""
    parent = launcher()
    if parent is not None and not parent.alive():
        raise RuntimeError(
            f"the shardsim process that launched this run (pid {parent.pid}) has ended; no result is written"
        )


class StatusSteps(Observer):
    """Keeps this rank's status file at the step it is in (`runtime.status.RankStatus`)."""

    def __init__(self, status):
        self.status = status

    def before_step(self, i: int) -> None:
        self.status.step(i)

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        self.status.step(trainer.steps_taken)
        return {}


def init_process_group(cfg: RunConfig, threads: int, local_rank: int, timeout: timedelta):
    """This rank's device and backend, its process group initialized: nccl (or the configured
    backend) on this rank's GPU, gloo on CPU with `threads` torch threads."""
    import torch
    import torch.distributed as dist

    if wants_cuda(cfg):
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = cfg.backend
    else:
        device = torch.device("cpu")
        backend = "gloo"
        torch.set_num_threads(max(1, threads))
    init_kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if device.type == "cuda" and backend == "nccl":
        init_kwargs["device_id"] = device
    dist.init_process_group(**init_kwargs)
    return device, backend


def run(ns: argparse.Namespace, status) -> int:
    import torch.distributed as dist

    from shardsim.runtime import testing
    from shardsim.runtime.emulation.readings import lab_observers

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = rank_config(ns)
    timeout = timedelta(seconds=ns.timeout)
    device, backend = init_process_group(cfg, ns.threads, int(os.environ.get("LOCAL_RANK", "0")), timeout)
    unwritten: WriteError | None = None
    try:
        trainer = Trainer.build(cfg, rank, world, device, backend, timeout, ns.data_batches)
        observers = [
            StatusSteps(status),
            PeakMemory(device),
            CpuTimes(ns.warmup),
            ExpertTokens(ns.warmup),
            *lab_observers(device, ns.warmup, ns.steps),  # the emulated CPU lab's readings: CPU only
            *testing.observers(rank, ns.warmup),  # none unless a test's environment asks
        ]
        measured = trainer.measure(ns.warmup, ns.steps, observers)
        if rank == 0:
            unwritten = _report(ns, _record(ns, trainer, measured))
        dist.barrier()
        if unwritten is None:
            status.finished()  # the last collective: the run's result is complete on every rank
    finally:
        dist.destroy_process_group()
    if unwritten is not None:  # reported once the job has ended cleanly: nothing is killed for it
        status.failed(unwritten)
    return 0


def _report(ns: argparse.Namespace, record: RunRecord) -> WriteError | None:
    """Write the record (unless --no-write) and print it; the WriteError of files that could not be
    written (the record is printed all the same, and the launcher names what is missing)."""
    check_launcher()
    record_path, unwritten = None, None
    try:
        record_path = None if ns.no_write else str(write_run(record, ns.out))
    except WriteError as exc:
        unwritten = exc
    if ns.json:
        print(record.to_json())
    else:
        print(_summary_text(record, record_path), flush=True)
    return unwritten


def _record(ns: argparse.Namespace, trainer: Trainer, measured: Measured) -> RunRecord:
    """Rank 0's record of the run: what ran, the steps' times and losses, the observers' fields."""
    import torch

    cfg, res, device = trainer.cfg, trainer.job.res, trainer.device
    stats = step_time_stats(measured.step_times_s)
    world = trainer.world
    nproc_per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    topology = make_cluster(cfg.topology, cfg.nodes).instance.name
    key = result_key(cfg, topology=topology, nodes=world // nproc_per_node, world=world, device=device_name)
    return RunRecord(
        run_id=ns.run_id or default_run_id(cfg),
        finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
        config={**cfg.to_dict(), "backend": trainer.backend},  # what ran: gloo on CPU whatever was asked
        **{name: getattr(key, name) for name in KEY_FIELDS},
        nproc_per_node=nproc_per_node,
        global_batch=res.global_batch,
        steps=ns.steps,
        warmup=ns.warmup,
        **stats,
        step_times_s=measured.step_times_s,
        warmup_times_s=measured.warmup_times_s,
        samples_per_s=res.global_batch / stats["step_time_s"],
        backend=trainer.backend,
        losses=measured.losses,
        loss_first=measured.losses[0],
        loss_last=measured.losses[-1],
        torch_version=torch.__version__,
        hostname=socket.gethostname(),
        **measured.fields,
    )


def _summary_text(r: RunRecord, path: str | None) -> str:
    from shardsim.core.units import format_rate_unit, format_seconds

    lines = [
        f"{r.workload}: {r.label} on {r.world} ranks ({r.device}, {r.backend}), global batch {r.global_batch}",
        f"  step time   {format_seconds(r.step_time_s)} median of {r.steps} "
        f"(min {format_seconds(r.step_time_min_s)}, max {format_seconds(r.step_time_max_s)}), "
        f"{format_rate_unit(r.samples_per_s, 'samples')}",
        f"  memory      {r.memory_allocated_gib:.3f} GiB per rank ({r.memory_measure})"
        + ("" if r.memory_reserved_gib is None else f", {r.memory_reserved_gib:.3f} GiB reserved")
        + ("" if r.memory_process_gib is None else f", {r.memory_process_gib:.3f} GiB process (nvidia-smi)"),
        f"  loss        {r.loss_first:.4f} -> {r.loss_last:.4f}",
    ]
    if r.lab is not None and r.lab.host_probe_s:
        host = f"  host        speed probe {format_seconds(r.lab.host_probe_s)}"
        if r.lab.host_steal_cores is not None:
            host += f"; the hypervisor took {r.lab.host_steal_cores:.2f} cores' worth of the steps' time"
        lines.append(host)
    if r.expert_imbalance:
        busiest = ", ".join(f"{v:.2f}" for v in r.expert_imbalance)
        lines.append(f"  experts     busiest over mean {busiest} (each MoE layer)")
    if path:
        lines.append(f"  written     {path}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from shardsim.runtime.status import RankStatus, describe

    ns = build_parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    status = RankStatus(os.environ.get("SHARDSIM_RUN_DIR"), rank)
    try:
        code = run(ns, status)
    except ConfigError as exc:
        status.failed(exc)
        print(f"shardsim: error: {exc}", file=sys.stderr)
        return 2
    except BaseException as exc:
        parent = launcher()
        if parent is not None and not parent.alive():  # its peers lost it too: end quietly, as they will
            os.kill(os.getpid(), signal.SIGKILL)
        status.failed(exc)
        kind, message = describe(exc)
        print(f"shardsim: rank {rank} failed at step {status.step_no}: {kind}: {message[:300]}", file=sys.stderr)
        raise
    return code


if __name__ == "__main__":
    follow_launcher()  # before torch loads (seconds): a rank of a launcher that is gone ends at once
    from torch.distributed.elastic.multiprocessing.errors import record

    processes.exit_now(record(main)())  # gloo's threads may outlive the process group: no finalization
