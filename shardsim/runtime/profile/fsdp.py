"""FSDP2's own work on a rank on CPU: its passes' overhead over the plain model (timed under a
fake process group whose collectives move nothing) and its sharded Adam step's overhead."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from shardsim.runtime.profile.blocks import Bench, fill_gradients, median_time, unit_speed

# the world size FSDP2's own work is timed at when no rank count is given; it changes little
# with it (small-gpt, microbatch 4: 33-45 ms forward and 41-53 ms backward at 1 to 8 ranks)
FSDP_WORLD = 8


def sharded_optimizer_step(
    model, repeats: int = 9, warmup: int = 2, speed: Callable[[], float] = unit_speed
) -> float | None:
    """Seconds of one Adam step on FSDP2's parameters on CPU at world size 1: over the same step
    on plain parameters, it is the overhead of DTensor's dispatch of every per-parameter op,
    which does not shrink with the shard. `model` is sharded in place (no copy: a large
    model's states would not fit twice). None when this process already has a process group
    (it is left alone)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from shardsim.runtime.launch import free_port
    from shardsim.runtime.strategies.fsdp import apply_fsdp

    if dist.is_initialized():
        return None
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        sharded = apply_fsdp(model, init_device_mesh("cpu", (1,)))
        fill_gradients(sharded)
        step = torch.optim.Adam(sharded.parameters()).step
        return median_time(step, repeats, warmup, lambda: None, speed)
    finally:
        dist.destroy_process_group()


def fsdp_overhead(
    ctx: Bench, batch: int, world: int, repeats: int = 9, warmup: int = 2, speed: Callable[[], float] = unit_speed
) -> tuple[float, float] | None:
    """(forward, backward) seconds of FSDP2's own work on a rank at world size `world`, one
    microbatch of `batch`: a copy of the model under FSDP2 (a unit per block, then the root)
    over the model as it is, passes alternating, the median of the differences. The
    collectives are PyTorch's fake process group's, which move nothing, so what is left is what
    FSDP2 itself does on the rank's thread: copying shards into the all-gather's buffer and the
    gathered unit out, gradients into the reduce-scatter's buffer, its hooks (CPU time of this
    thread; each pair's difference divided by `speed()` read before the pair). None when this
    process already has a process group (it is left alone).

    The fake collectives leave the gathered parameters as they found the memory: denormal
    numbers are flushed to zero meanwhile, so that garbage costs no more than numbers."""
    import copy

    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardsim.runtime.strategies.fsdp import apply_fsdp

    if dist.is_initialized():
        return None
    plain = ctx.model
    x, y = plain.sample_batch(batch, generator=torch.Generator().manual_seed(0))
    flushed = torch.set_flush_denormal(True)
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        sharded = apply_fsdp(copy.deepcopy(plain), init_device_mesh("cpu", (world,)))

        def passes(model) -> tuple[float, float]:
            t0 = time.thread_time()
            with ctx.autocast():
                loss = model.loss(model(x), y)
            t1 = time.thread_time()
            loss.backward()
            t2 = time.thread_time()
            model.zero_grad(set_to_none=True)
            return t1 - t0, t2 - t1

        for _ in range(warmup):
            passes(plain), passes(sharded)
        fwd, bwd = [], []
        for _ in range(max(2 * repeats, 15)):
            s = speed()  # one reading for the pair: the difference is not divided by two readings' noise
            (pf, pb), (sf, sb) = passes(plain), passes(sharded)
            fwd.append((sf - pf) / s)
            bwd.append((sb - pb) / s)
        return max(0.0, statistics.median(fwd)), max(0.0, statistics.median(bwd))
    finally:
        dist.destroy_process_group()
        if flushed:
            torch.set_flush_denormal(False)
