"""Timing a workload's model on a device: each block's forward and backward, the whole
model's, and an Adam step, every timed pass divided by the host's speed read just before it."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardsim.core.errors import ConfigError


def unit_speed() -> float:
    """The speed of a pass timed in plain seconds (no probe)."""
    return 1.0


def median_time(fn, repeats: int, warmup: int, sync, speed: Callable[[], float] = unit_speed) -> float:
    """Median seconds of `fn()`, each timing divided by `speed()` read just before it (a
    SpeedLog: the host's speed then, in probe seconds; 1 by default)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        s = speed()
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t) / s)
    return statistics.median(times)


def _fwd_bwd_times(
    forward, repeats: int, warmup: int, sync, speed: Callable[[], float] = unit_speed
) -> tuple[float, float]:
    """Median forward and median backward seconds, each timed on its own in the same iteration
    (`forward()` returns the scalar to differentiate): no difference of two noisy medians.
    Each iteration is divided by `speed()` read just before it (see median_time)."""
    for _ in range(warmup):
        forward().backward()
    fwd, bwd = [], []
    for _ in range(repeats):
        s = speed()
        sync()
        t0 = time.perf_counter()
        loss = forward()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        fwd.append((t1 - t0) / s)
        bwd.append((time.perf_counter() - t1) / s)
    return statistics.median(fwd), statistics.median(bwd)


@dataclass
class Bench:
    """A workload's model set up on a device for timing, its modules in the simulator's block order."""

    model: object
    spec: object
    modules: list
    names: list[str]
    device: object
    sync: object
    autocast: object


def setup_bench(workload: str, device: str, threads: int, precision: str) -> Bench:
    """The workload's model built on `device` (`threads` torch threads on CPU), in training mode,
    with its autocast at `precision`; its modules matched to the simulator's blocks."""
    import torch

    from shardsim.runtime.models.build import resolve_builder
    from shardsim.simulator.workload.resolve import load_workload

    torch.manual_seed(0)
    if device == "cpu":
        torch.set_num_threads(threads)
    dev = torch.device(device)
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    spec = load_workload(workload)
    model = resolve_builder(workload)().to(dev)
    model.train()
    dtype = {"fp32": None, "tf32": None, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    if precision == "tf32" and dev.type == "cuda":  # fp32 storage, TF32 matmuls (`runtime.stack`)
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    autocast = (lambda: torch.autocast(dev.type, dtype=dtype)) if dtype else contextlib.nullcontext
    modules = ([model.embed] if getattr(model, "embed", None) is not None else []) + list(model.blocks) + [model.head]
    names = [b.name for b in spec.blocks]
    if len(names) != len(modules):
        raise ConfigError(f"workload {workload!r}: {len(modules)} modules but the simulator sees {len(names)} blocks")
    return Bench(model, spec, modules, names, dev, sync, autocast)


def block_times(
    ctx: Bench, batch: int, repeats: int, warmup: int, speed: Callable[[], float] = unit_speed
) -> dict[str, list[float]]:
    """[fwd_s, bwd_s] of every block for one microbatch of `batch` samples (a block's backward
    is seeded with a random output gradient; the head's with the loss)."""
    import torch

    g = torch.Generator().manual_seed(0)
    x, y = ctx.model.sample_batch(batch, generator=g)
    x, y = x.to(ctx.device), y.to(ctx.device)
    out: dict[str, list[float]] = {}
    act = x
    for name, mod in zip(ctx.names, ctx.modules, strict=True):
        inp = act.detach().requires_grad_(act.is_floating_point())
        with ctx.autocast():
            result = mod(inp)
        is_head = mod is ctx.model.head
        grad_out = None if is_head else torch.randn(result.shape, generator=g).to(ctx.device)

        def forward(inp=inp, is_head=is_head, mod=mod, grad_out=grad_out):
            with ctx.autocast():
                r = mod(inp)
                return ctx.model.loss(r, y) if is_head else (r.float() * grad_out).sum()

        out[name] = list(_fwd_bwd_times(forward, repeats, warmup, ctx.sync, speed))
        act = result.detach()
    return out


def whole_times(
    ctx: Bench, batch: int, repeats: int, warmup: int, speed: Callable[[], float] = unit_speed
) -> tuple[float, float]:
    """(forward with the loss, backward) seconds of the whole model for one microbatch."""
    import torch

    x, y = ctx.model.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    x, y = x.to(ctx.device), y.to(ctx.device)
    model = ctx.model

    def forward():
        with ctx.autocast():
            return model.loss(model(x), y)

    times = _fwd_bwd_times(forward, repeats, warmup, ctx.sync, speed)
    model.zero_grad(set_to_none=True)
    return times


def fill_gradients(model, autocast=None) -> None:
    """Real gradients in every parameter (one sample's backward), for an optimizer step to be
    timed on: Adam on zero gradients runs far slower than on real ones (2.6 times, small-gpt on
    a CPU), which would put its step well over what the ranks of a run spend on it."""
    import torch

    model.zero_grad(set_to_none=True)
    x, y = model.sample_batch(1, generator=torch.Generator().manual_seed(1))
    with autocast() if autocast else contextlib.nullcontext():
        loss = model.loss(model(x), y)
    loss.backward()


def optimizer_step(ctx: Bench, repeats: int, warmup: int, speed: Callable[[], float] = unit_speed) -> float:
    """Median seconds of one Adam step on the model's parameters, on real gradients; the
    optimizer's states and the gradients are freed after (a sharded optimizer timed next needs
    the memory: vit-630m's states are 5 GB)."""
    import torch

    model = ctx.model
    opt = torch.optim.Adam(model.parameters())
    fill_gradients(model, ctx.autocast)
    t_opt = median_time(opt.step, repeats, warmup, ctx.sync, speed)
    del opt
    for p in model.parameters():
        p.grad = None
    return t_opt
