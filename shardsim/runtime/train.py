"""One rank of a real training run: ``python -m shardsim.runtime.train [CONFIG.yaml] [flags]``.

Launched by torchrun, one process per device: by ``shardsim run`` on one machine, or by you
under multi-node torchrun or Slurm (see docs/runtime.md). Reads the same configuration as the
simulator (under ``shardsim run``: the JSON file the launcher wrote in the run folder, or
``--config-json``; run by you: a file and flags), builds the same model, applies the strategy with PyTorch's own engines
(`runtime.strategies`), trains on seeded synthetic data and measures each step between two
synchronization points (cuda.synchronize + dist.barrier). Rank 0 writes the results.

Under ``shardsim run`` a rank ends with the run: when torchrun (its parent) dies, and when the
``shardsim`` process that launched the job is gone; it never writes the result of a run whose
launcher has ended, nor reports a failure to nobody (`follow_launcher`, `check_launcher`).

A rank that returns (finished, or bad input) ends its process without finalizing the
interpreter (`runtime.processes.exit_now`): gloo's worker threads can still be letting go of the
last collective then, and would abort the process (a finished run reported as failed).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from shardsim.config import RunConfig, add_config_arguments, config_from_args, resolve
from shardsim.config.flags import overrides_from_args
from shardsim.config.load import load_config_json
from shardsim.core.errors import ConfigError, WriteError
from shardsim.core.flagtypes import Count, Real
from shardsim.runtime import processes
from shardsim.runtime.launch import CONFIG_FILE
from shardsim.runtime.processes import launcher
from shardsim.runtime.records import RunRecord, step_time_stats, write_run
from shardsim.simulator.workload.load import spec_name

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
    p.add_argument("--save-params", metavar="DIR", help="save the final parameters (full tensors) per stage, for tests")
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
    from shardsim.simulator.hardware.topology import load_instance

    return load_instance(cfg.topology).device.kind != "cpu"


def default_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    label = cfg.strategy.label().replace(" ", "-").replace("=", "")
    return f"{stamp}-{spec_name(cfg.workload).replace(':', '.').replace('/', '.')}-{label}-{os.getpid()}"


@dataclass
class Job:
    """Everything one rank trains with."""

    cfg: RunConfig
    res: Any  # simulator.config.Resolved
    rank: int
    device: Any  # torch.device
    model: Any  # the module the step runs (DDP / FSDP / stage module)
    optimizer: Any
    forward_backward: Any  # callable(micro_batches) -> this rank's loss of the step (a tensor)
    optimizer_step: Any  # callable(): step the optimizer, zero the gradients
    make_batches: Any  # callable(step) -> list of micro-batches for this rank
    state: Any  # callable() -> {"params": {...}, "grads": {...}} full tensors, or None (see _full_state)
    loss_weight: float = 1.0  # this rank's loss x weight, summed over ranks = the global loss
    notes: dict = field(default_factory=dict)


def _canonical(name: str) -> str:
    for part in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name.removeprefix("module.")


def _stepper(optimizer, scaler):
    def step():
        if scaler is not None:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _full_state(module, keep: bool):
    """A function returning {name: full tensor} of parameters and gradients; every rank
    calls it (gathers of sharded tensors), ranks with `keep` get the dict."""

    def full(t):
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        return t.detach().float().cpu()

    def state():
        params, grads = {}, {}
        for name, p in module.named_parameters():
            params[_canonical(name)] = full(p)
            if p.grad is not None:
                grads[_canonical(name)] = full(p.grad)
        return {"params": params, "grads": grads} if keep else None

    return state


def setup(cfg: RunConfig, rank: int, world: int, device, timeout: timedelta, data_batches: int = 0) -> Job:
    """Build the configured model, apply its strategy (`runtime.strategies.apply_strategy`) and
    an Adam optimizer: everything this rank trains with."""
    from shardsim.runtime.models import build as workloads
    from shardsim.runtime.optimizer import build_adam
    from shardsim.runtime.strategies import apply_strategy

    model = workloads.build(cfg.workload, cfg.seed, cfg.shape)
    cfg, res = resolve(cfg, world, len(model.blocks))
    if cfg.strategy.spec.is_pipeline:
        workloads.check_model(model, spec_name(cfg.workload), pipeline=True)
    applied = apply_strategy(model, cfg, res, rank, device, timeout, data_batches)
    del model  # a pipeline stage keeps only its own blocks
    module = applied.module
    optimizer = build_adam(module.parameters(), cfg.optimizer_impl)
    return Job(
        cfg,
        res,
        rank,
        device,
        module,
        optimizer,
        applied.forward_backward,
        _stepper(optimizer, applied.scaler),
        applied.make_batches,
        _full_state(module, applied.keeps_state),
        applied.loss_weight,
        applied.notes,
    )


def _peak_memory_gib(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def _reset_peak_memory(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM) to the current one


@contextlib.contextmanager
def _recording(enabled: bool):
    """The collectives issued inside (runtime.collective_trace), or None when not tracing."""
    if not enabled:
        yield None
        return
    from shardsim.runtime.collective_trace import record_collectives

    with record_collectives() as calls:
        yield calls


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


def run(ns: argparse.Namespace, status) -> int:
    import torch
    import torch.distributed as dist

    from shardsim.runtime.collective_trace import save_rank_trace, trace_dir
    from shardsim.runtime.hostspeed import Probe, StealClock
    from shardsim.runtime.status import Fault

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cfg = rank_config(ns)
    use_cuda = wants_cuda(cfg)
    if use_cuda:
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = cfg.backend
    else:
        device = torch.device("cpu")
        backend = "gloo"
        torch.set_num_threads(max(1, ns.threads))
    timeout = timedelta(seconds=ns.timeout)
    init_kwargs: dict[str, Any] = {"backend": backend, "timeout": timeout}
    if use_cuda and backend == "nccl":
        init_kwargs["device_id"] = device
    dist.init_process_group(**init_kwargs)
    unwritten: WriteError | None = None
    try:
        job = setup(cfg, rank, world, device, timeout, ns.data_batches)
        fault = Fault(os.environ.get("SHARDSIM_FAULT"), rank)

        def sync():
            if use_cuda:
                torch.cuda.synchronize(device)
            dist.barrier(device_ids=[local_rank] if use_cuda and backend == "nccl" else None)

        total = ns.warmup + ns.steps
        times: list[float] = []
        losses: list = []
        # the host's speed before each step, outside its timing (its 12 MB of weights stay
        # resident: about 2 % of a small-gpt rank's peak resident set)
        probe = None if use_cuda else Probe()
        probes: list[float] = []
        steal, steals = StealClock(), []  # the hypervisor's share of the host's cores in each step
        _reset_peak_memory(device)
        cpu_times: list[float] = []  # this process' CPU seconds in the step (barriers excluded)
        perf, cpu = time.perf_counter, time.process_time
        tracing = trace_dir()
        traced: list[list] = []  # collectives of each measured step (SHARDSIM_TRACE_COLLECTIVES)
        for i in range(total):
            batches = job.make_batches(i)
            status.step(i)
            fault.check(i)
            if probe is not None:
                probes.append(probe())
            sync()
            t0 = perf()
            c0 = cpu()
            steal.start()
            with _recording(tracing is not None and i >= ns.warmup) as calls:
                loss = job.forward_backward(batches)
                job.optimizer_step()
            c1 = cpu()
            sync()
            if calls is not None:
                traced.append(calls)
            times.append(perf() - t0)
            steals.append(steal.stop())
            cpu_times.append(c1 - c0)
            losses.append(loss)
        status.step(total)
        peak = _peak_memory_gib(device)
        if tracing is not None:
            save_rank_trace(tracing, rank, traced)
        # one exchange after timing: global losses per step and every rank's peak memory
        local = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in losses]) * job.loss_weight
        dist.all_reduce(local)

        def every_rank(values: list[float] | None, n: int):
            return _every_rank(values, n, rank, world, device)

        mem = every_rank([peak], 1)[:, 0]
        cpu_all = every_rank(cpu_times[ns.warmup :], ns.steps)  # every rank's CPU per step
        probe_all = every_rank(probes[ns.warmup :] or None, ns.steps)
        measured_steal = steals[ns.warmup :]
        has_steal = all(v is not None for v in measured_steal)
        steal_cores = every_rank([v.cores for v in measured_steal] if has_steal else None, ns.steps)
        steal_share = every_rank([v.share for v in measured_steal] if has_steal else None, ns.steps)
        if ns.save_params:
            # final parameters, then the gradients of one more step's batches (not applied):
            # with Adam the parameters hide a wrongly scaled gradient, the gradients do not
            params = job.state()
            job.forward_backward(job.make_batches(total))
            grads = job.state()
            if params is not None:
                os.makedirs(ns.save_params, exist_ok=True)
                saved = {"params": params["params"], "grads": grads["grads"]}
                torch.save(saved, os.path.join(ns.save_params, f"stage{job.notes.get('stage', 0)}.pt"))
        if rank == 0:
            measured = times[ns.warmup :]
            stats = step_time_stats(measured)
            step_losses = [float(v) for v in local.cpu()]
            mem_list = [float(v) for v in mem.cpu()]
            record = RunRecord(
                run_id=ns.run_id or default_run_id(job.cfg),
                finished_at=datetime.now(UTC).isoformat(timespec="seconds"),
                config={**job.cfg.to_dict(), "backend": backend},  # what ran: gloo on CPU whatever was asked
                workload=spec_name(job.cfg.workload),
                topology=job.cfg.topology,
                nodes=job.cfg.nodes,
                strategy=job.cfg.strategy.label(),
                world=world,
                nproc_per_node=int(os.environ.get("LOCAL_WORLD_SIZE", world)),
                global_batch=job.res.global_batch,
                steps=ns.steps,
                warmup=ns.warmup,
                **stats,
                step_times_s=measured,
                warmup_times_s=times[: ns.warmup],
                step_cpu_times_s=cpu_times[ns.warmup :],
                step_cpu_times_by_rank_s=cpu_all.cpu().tolist(),
                host_probe_s=float(probe_all.mean()) if probes else None,
                host_probe_by_step_s=probe_all.mean(0).tolist() if probes else None,
                host_steal_cores_by_step=steal_cores.mean(0).tolist() if has_steal else None,
                host_steal_share_by_step=steal_share.mean(0).tolist() if has_steal else None,
                host_steal_cores=float(steal_cores.mean()) if has_steal else None,
                host_steal_share=float(steal_share.mean()) if has_steal else None,
                samples_per_s=job.res.global_batch / stats["step_time_s"],
                memory_per_rank_gib=max(mem_list),
                memory_by_rank_gib=mem_list,
                memory_measure="cuda_max_memory_allocated" if use_cuda else "cpu_peak_rss",
                device=torch.cuda.get_device_name(device) if use_cuda else "cpu",
                backend=backend,
                threads_per_rank=None if use_cuda else torch.get_num_threads(),
                losses=step_losses,
                loss_first=step_losses[0],
                loss_last=step_losses[-1],
                torch_version=torch.__version__,
                hostname=socket.gethostname(),
            )
            check_launcher()
            record_path = None
            try:
                record_path = None if ns.no_write else str(write_run(record, ns.out))
            except WriteError as exc:  # measured all the same: printed, and the launcher names what is missing
                unwritten = exc
            if ns.json:
                print(record.to_json())
            else:
                print(_summary_text(record, record_path), flush=True)
        dist.barrier()
        if unwritten is None:
            status.finished()  # the last collective: the run's result is complete on every rank
    finally:
        dist.destroy_process_group()
    if unwritten is not None:  # reported once the job has ended cleanly: nothing is killed for it
        status.failed(unwritten)
    return 0


def _every_rank(values: list[float] | None, n: int, rank: int, world: int, device):
    """Every rank's `values` (n of them) as the rows of one [world, n] tensor, by one all-reduce;
    a rank with None leaves its row zero. Every rank calls it, in the same order."""
    import torch
    import torch.distributed as dist

    out = torch.zeros(world, n, dtype=torch.float64, device=device)
    if values is not None:
        out[rank] = torch.as_tensor(values, dtype=torch.float64)
    dist.all_reduce(out)
    return out


def _summary_text(r: RunRecord, path: str | None) -> str:
    from shardsim.core.units import format_seconds

    lines = [
        f"{r.workload}: {r.strategy} on {r.world} ranks ({r.device}, {r.backend}), global batch {r.global_batch}",
        f"  step time   {format_seconds(r.step_time_s)} median of {r.steps} "
        f"(min {format_seconds(r.step_time_min_s)}, max {format_seconds(r.step_time_max_s)}), "
        f"{r.samples_per_s:.1f} samples/s",
        f"  memory      {r.memory_per_rank_gib:.3f} GiB per rank ({r.memory_measure})",
        f"  loss        {r.loss_first:.4f} -> {r.loss_last:.4f}",
    ]
    if r.host_probe_s:
        host = f"  host        speed probe {format_seconds(r.host_probe_s)}"
        if r.host_steal_cores is not None:
            host += f"; the hypervisor took {r.host_steal_cores:.2f} cores' worth of the steps' time"
        lines.append(host)
    if path:
        lines.append(f"  written     {path}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from shardsim.runtime.status import RankStatus

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
        first = " ".join(str(exc).split())[:300] or type(exc).__name__
        print(f"shardsim: rank {rank} failed at step {status.step_no}: {type(exc).__name__}: {first}", file=sys.stderr)
        raise
    return code


if __name__ == "__main__":
    follow_launcher()  # before torch loads (seconds): a rank of a launcher that is gone ends at once
    from torch.distributed.elastic.multiprocessing.errors import record

    processes.exit_now(record(main)())  # gloo's threads may outlive the process group: no finalization
