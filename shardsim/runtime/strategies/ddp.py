"""Data parallelism with `DistributedDataParallel`: every rank holds the whole model and
all-reduces gradient buckets as backward produces them."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

import torch
from torch import nn

from shardsim.runtime.strategies.checkpointing import apply_checkpointing
from shardsim.runtime.strategies.step import AppliedStrategy, StepContext, data_parallel_step


def apply_ddp(model: nn.Module, device: torch.device, process_group=None) -> nn.Module:
    """`DistributedDataParallel` with its default buckets (25 MiB, first bucket 1 MiB) over
    `process_group` (None: the world)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids, process_group=process_group)


def ddp_replica_sync(module: nn.Module, sync: bool) -> AbstractContextManager:
    """DDP's `no_sync` before the accumulation boundary: gradients accumulate locally, the
    all-reduce runs in the boundary's backward."""
    return contextlib.nullcontext() if sync else module.no_sync()


def ddp(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy ddp: checkpointing if configured, the model on the device under DDP over the world."""
    apply_checkpointing(model, ctx.cfg.checkpointing, ctx.cfg.selective_ac_option)
    return data_parallel_step(apply_ddp(model.to(ctx.device), ctx.device), ctx, ddp_replica_sync)
