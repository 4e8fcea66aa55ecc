"""One rank's training, apart from where its figures go: a `Trainer` is set up (the configured
model, its strategy applied with PyTorch's own engines, Adam, the seeded synthetic data), takes
a `step`, and `measure`s warm-up and measured steps, each timed between two synchronization
points (cuda.synchronize + dist.barrier). What else a run reads about its steps is an
`Observer`'s: the peak memory and the CPU time here, the status files (`runtime.status`), the
emulated CPU lab's host readings (`runtime.emulation.readings`), and the hooks tests install
(`runtime.testing`). ::

    trainer = Trainer.build(cfg, rank, world, device, backend, timeout)
    measured = trainer.measure(warmup=1, steps=5, observers=[PeakMemory(device), CpuTimes()])
    measured.losses, measured.step_times_s, measured.fields   # fields: the observers' record fields

Every rank builds the same observers in the same order: an observer's `after_steps` may call
collectives.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from shardsim.config import RunConfig, resolve
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.specs.model.load import spec_name


class Observer:
    """Hooks the measure loop calls around each step; each does nothing unless overridden."""

    def begin(self, trainer: Trainer) -> None:
        """Before the first step."""

    def before_step(self, i: int) -> None:
        """Before step `i`'s opening synchronization: outside its timed span."""

    def step_started(self, i: int) -> None:
        """Step `i`'s timed span has begun (after the opening synchronization)."""

    def step_computed(self, i: int) -> None:
        """Step `i`'s work is issued and done on this rank, before the closing synchronization."""

    def step_ended(self, i: int) -> None:
        """Step `i`'s timed span has ended (after the closing synchronization)."""

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        """After the last step, on every rank in the same order (collectives allowed): the
        `RunRecord` fields this observer measured (rank 0's are recorded)."""
        return {}


@dataclass
class Job:
    """Everything one rank trains with."""

    cfg: RunConfig
    res: Any  # config.Resolved
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

    def full(t, spec=None):
        if spec is not None:  # a DTensor's local shard under DDP (tensor parallel + ddp: LocalShards)
            from torch.distributed.tensor import DTensor

            mesh, placements, shape, stride = spec
            t = DTensor.from_local(t.detach(), mesh, placements, run_check=False, shape=shape, stride=stride)
        t = t.full_tensor() if hasattr(t, "full_tensor") else t
        return t.detach().float().cpu()

    def state():
        params, grads = {}, {}
        for name, p in module.named_parameters():
            spec = getattr(p, "_tp_spec", None)
            params[_canonical(name)] = full(p, spec)
            if p.grad is not None:
                grads[_canonical(name)] = full(p.grad, spec)
        return {"params": params, "grads": grads} if keep else None

    return state


def setup(cfg: RunConfig, rank: int, world: int, device, timeout: timedelta, data_batches: int = 0) -> Job:
    """Build the configured model, apply its strategy (`runtime.strategies.apply_strategy`) and
    an Adam optimizer (the strategy's own where it has one: zero1's ZeroRedundancyOptimizer): everything
    this rank trains with."""
    from shardsim.runtime.models import build as workloads
    from shardsim.runtime.optimizer import build_optimizer
    from shardsim.runtime.stack import (
        apply_device_settings,
        apply_model_settings,
        check_runtime_stack,
        compile_blocks,
    )
    from shardsim.runtime.strategies import apply_strategy

    stack_notes = apply_device_settings(cfg, device)
    model = workloads.build(cfg.workload, cfg.seed, cfg.shape, tp=cfg.strategy.tp)
    apply_model_settings(model, cfg)
    arch = getattr(model, "arch", None)
    tied = bool(getattr(arch, "tied_embeddings", False))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 0)) or None  # torchrun's ranks on this node
    cfg, res = resolve(cfg, world, len(model.blocks), tied_embeddings=tied, arch=arch, devices_per_node=local)
    check_runtime_stack(cfg, device.type == "cuda", PLANNERS[cfg.strategy.kind].sharded(res))
    if cfg.strategy.spec.is_pipeline:
        workloads.check_model(model, spec_name(cfg.workload), pipeline=True)
    compile_blocks(model, cfg)  # before the strategy wraps the blocks (torchtitan's order for FSDP2)
    applied = apply_strategy(model, cfg, res, rank, device, timeout, data_batches)
    del model  # a pipeline stage keeps only its own blocks
    module = applied.module
    optimizer = (applied.build_optimizer or build_optimizer)(module.parameters(), cfg.optimizer, cfg.optimizer_impl)
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
        {**applied.notes, **stack_notes},
    )


@dataclass(frozen=True)
class Measured:
    """What `Trainer.measure` measured: every step's time and global loss (warm-up first), and
    the observers' record fields."""

    warmup: int
    step_times: list[float]  # seconds, every step
    losses: list[float]  # the global loss of every step
    fields: dict[str, Any]

    @property
    def step_times_s(self) -> list[float]:
        return self.step_times[self.warmup :]

    @property
    def warmup_times_s(self) -> list[float]:
        return self.step_times[: self.warmup]


class Trainer:
    """One rank's `Job` in its process group (initialized by the caller): steps, timed."""

    def __init__(self, job: Job, world: int, backend: str):
        self.job = job
        self.rank = job.rank
        self.world = world
        self.device = job.device
        self.backend = backend
        self.steps_taken = 0  # optimizer steps taken

    @classmethod
    def build(
        cls, cfg: RunConfig, rank: int, world: int, device, backend: str, timeout: timedelta, data_batches: int = 0
    ) -> Trainer:
        return cls(setup(cfg, rank, world, device, timeout, data_batches), world, backend)

    @property
    def cfg(self) -> RunConfig:
        """The resolved configuration that runs."""
        return self.job.cfg

    def sync(self) -> None:
        """Every rank's work done: the device's queue drained, then a barrier."""
        import torch
        import torch.distributed as dist

        cuda = self.device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(self.device)
        dist.barrier(device_ids=[self.device.index] if cuda and self.backend == "nccl" else None)

    def step(self, batches) -> Any:
        """One optimizer step on this rank's micro-batches (`job.make_batches(i)`); returns its
        loss share (a tensor: x `job.loss_weight`, summed over ranks, is the global loss)."""
        loss = self.job.forward_backward(batches)
        self.job.optimizer_step()
        self.steps_taken += 1
        return loss

    def measure(self, warmup: int, steps: int, observers: list[Observer]) -> Measured:
        """Run `warmup` + `steps` steps, each timed between two synchronizations, the observers
        called around each; then the global loss of every step (one all-reduce, after the
        observers' `after_steps`)."""
        import torch
        import torch.distributed as dist

        perf = time.perf_counter
        times: list[float] = []
        losses: list = []
        for o in observers:
            o.begin(self)
        for i in range(warmup + steps):
            batches = self.job.make_batches(i)
            for o in observers:
                o.before_step(i)
            self.sync()
            t0 = perf()
            for o in observers:
                o.step_started(i)
            loss = self.step(batches)
            for o in observers:
                o.step_computed(i)
            self.sync()
            times.append(perf() - t0)
            for o in observers:
                o.step_ended(i)
            losses.append(loss)
        fields: dict[str, Any] = {}
        for o in observers:
            fields |= o.after_steps(self)
        local = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.device) for v in losses])
        local = local * self.job.loss_weight
        dist.all_reduce(local)
        return Measured(warmup, times, [float(v) for v in local.cpu()], fields)

    def every_rank(self, values: list[float] | None, n: int):
        """Every rank's `values` (n of them) as the rows of one [world, n] tensor, by one
        all-reduce; a rank with None leaves its row zero. Every rank calls it, in the same order."""
        import torch
        import torch.distributed as dist

        out = torch.zeros(self.world, n, dtype=torch.float64, device=self.device)
        if values is not None:
            out[self.rank] = torch.as_tensor(values, dtype=torch.float64)
        dist.all_reduce(out)
        return out


# -- observers every run has -------------------------------------------------------------------


def peak_memory_gib(device) -> float:
    """This process' peak since the last `reset_peak_memory`: CUDA's allocated bytes on a GPU, the
    resident set (VmHWM; ru_maxrss where /proc is missing) on CPU."""
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


def smi_process_mib(text: str, pid: int) -> float | None:
    """MiB of `pid`'s entries in ``nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits``
    output (summed over the GPUs it appears on); None when it is not listed."""
    total, seen = 0.0, False
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 2 and cells[0] == str(pid):
            try:
                total += float(cells[1])
            except ValueError:
                continue
            seen = True
    return total if seen else None


def process_memory_gib(device) -> float | None:
    """This process' GPU memory as nvidia-smi shows it (its compute-app entries): pynvml when it
    imports, else ``nvidia-smi --query-compute-apps``; None on CPU, or where neither answers (no
    driver tools, or a container whose process ids the driver does not see). Read after the steps,
    before anything is freed: the caching allocator keeps its segments, so it is the step's peak."""
    if device.type != "cuda":
        return None
    pid = os.getpid()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            used = [
                p.usedGpuMemory
                for i in range(pynvml.nvmlDeviceGetCount())
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))
                if p.pid == pid and p.usedGpuMemory is not None
            ]
        finally:
            pynvml.nvmlShutdown()
        if used:
            return sum(used) / 2**30
    except Exception:  # noqa: BLE001 - no pynvml, no driver library, or a query it does not support
        pass
    import subprocess

    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    mib = smi_process_mib(out, pid)
    return None if mib is None else mib / 1024


def reset_peak_memory(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    with contextlib.suppress(OSError):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the peak resident set (VmHWM) to the current one


class PeakMemory(Observer):
    """Every rank's peak memory over the steps (`peak_memory_gib`), and on a GPU the caching
    allocator's reserved peak and the process total as nvidia-smi shows it (`process_memory_gib`)."""

    def __init__(self, device):
        self.device = device

    def begin(self, trainer: Trainer) -> None:
        reset_peak_memory(self.device)

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        import torch

        cuda = self.device.type == "cuda"
        peak = peak_memory_gib(self.device)
        by_rank = [float(v) for v in trainer.every_rank([peak], 1)[:, 0].cpu()]
        # the caching allocator's peak (a GPU's; CPU memory has no such allocator)
        reserved = process = None
        if cuda:
            reserved = float(trainer.every_rank([torch.cuda.max_memory_reserved(self.device) / 2**30], 1).max())
            # the process total as nvidia-smi shows it; -1 where a rank cannot read it, absent if none can
            mine = process_memory_gib(self.device)
            process = float(trainer.every_rank([-1.0 if mine is None else mine], 1).max())
            process = None if process < 0 else process
        return {
            "memory_allocated_gib": max(by_rank),
            "memory_reserved_gib": reserved,
            "memory_process_gib": process,
            "memory_allocated_by_rank_gib": by_rank,
            "memory_measure": "cuda_max_memory_allocated" if cuda else "cpu_peak_rss",
        }


class CpuTimes(Observer):
    """This process' CPU seconds in each measured step's work (the synchronizations excluded):
    rank 0's, and every rank's."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.times: list[float] = []
        self._c0 = 0.0

    def step_started(self, i: int) -> None:
        self._c0 = time.process_time()

    def step_computed(self, i: int) -> None:
        self.times.append(time.process_time() - self._c0)

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        measured = self.times[self.warmup :]
        return {
            "step_cpu_times_s": measured,
            "step_cpu_times_by_rank_s": trainer.every_rank(measured, len(measured)).cpu().tolist(),
        }


class ExpertTokens(Observer):
    """The tokens each expert of every MoE layer was routed in each measured step (every rank's
    micro-batches summed: `models.moe.MoE.tokens_per_expert`), and each layer's imbalance over the
    measured steps: its busiest expert's tokens over the mean. Nothing for a model without experts."""

    def __init__(self, warmup: int):
        self.warmup = warmup
        self.steps: list[dict[int, list[int]]] = []  # per measured step: {layer index: tokens per expert}
        self.layers: list = []

    def begin(self, trainer: Trainer) -> None:
        from shardsim.runtime.models.moe import moe_layers

        self.layers = moe_layers(trainer.job.model)

    def before_step(self, i: int) -> None:
        for m in self.layers:
            m.tokens_per_expert.zero_()

    def step_ended(self, i: int) -> None:
        if i >= self.warmup:
            self.steps.append({m.layer: m.tokens_per_expert.tolist() for m in self.layers})

    def after_steps(self, trainer: Trainer) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        from shardsim.specs.model.load import resolve_arch

        arch = resolve_arch(trainer.cfg.workload, trainer.cfg.shape)[1]
        if arch is None or not arch.experts:
            return {}
        moe = [i for i in range(arch.layers) if arch.is_moe_layer(i)]  # every rank's, whatever its stage holds
        counts = torch.zeros(len(self.steps), len(moe), arch.experts, dtype=torch.float64, device=trainer.device)
        for s, held in enumerate(self.steps):
            for layer, tokens in held.items():
                counts[s, moe.index(layer)] = torch.tensor(tokens, dtype=torch.float64)
        dist.all_reduce(counts)
        total = counts.sum(0)
        imbalance = total.max(1).values / total.mean(1)
        return {
            "expert_tokens": [[[int(v) for v in layer] for layer in step] for step in counts.cpu().tolist()],
            "expert_imbalance": [float(v) for v in imbalance.cpu()],
        }
