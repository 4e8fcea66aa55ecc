"""Data parallelism with `DistributedDataParallel`: every rank holds the whole model and
all-reduces gradient buckets as backward produces them."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn

from shardsim.runtime.strategies.checkpointing import apply_checkpointing
from shardsim.runtime.strategies.step import AppliedStrategy, StepContext, data_parallel_step

COMPRESS_HOOKS = {"fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}  # reduce dtype → default_hooks


def apply_ddp(model: nn.Module, device: torch.device, process_group=None, reduce_dtype: str = "fp32") -> nn.Module:
    """`DistributedDataParallel` with its default buckets (25 MiB, first bucket 1 MiB) over
    `process_group` (None: the world); with `reduce_dtype` fp16 / bf16 PyTorch's own
    compression hook (fp16_compress_hook / bf16_compress_hook: each bucket cast, all-reduced in
    that dtype, copied back into the fp32 gradients)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=ids, process_group=process_group)
    hook = COMPRESS_HOOKS.get(reduce_dtype)
    if hook is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(process_group, getattr(default_hooks, hook))
    return ddp


def ddp_replica_sync(module: nn.Module, sync: bool) -> AbstractContextManager:
    """DDP's `no_sync` before the accumulation boundary: gradients accumulate locally, the
    all-reduce runs in the boundary's backward."""
    return contextlib.nullcontext() if sync else module.no_sync()


def ddp(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy ddp: checkpointing if configured, the model on the device under DDP over the world."""
    apply_checkpointing(model, ctx.cfg.checkpointing, ctx.cfg.selective_ac_option)
    module = apply_ddp(model.to(ctx.device), ctx.device, reduce_dtype=ctx.cfg.ddp_reduce_dtype)
    return data_parallel_step(module, ctx, ddp_replica_sync)
