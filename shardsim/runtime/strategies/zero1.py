"""ZeRO-1 (strategy zero1): `DistributedDataParallel` as strategy ddp runs it, stepped by
`torch.distributed.optim.ZeroRedundancyOptimizer` wrapping the configured Adam: each rank
keeps Adam's state for its partition of the parameters (PyTorch's greedy split of whole
tensors, largest first), steps it, and broadcasts it to the data-parallel group's other ranks."""

from __future__ import annotations

from torch import nn

from shardsim.runtime.strategies.ddp import ddp
from shardsim.runtime.strategies.step import AppliedStrategy, StepContext


def zero1(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy zero1: ddp's module and step; the optimizer partitioned over DDP's group (the
    world; with tensor parallelism the layout's "dp_replicate" group, over the local shards)."""
    from shardsim.runtime.optimizer import build_zero_redundancy

    applied = ddp(model, ctx)
    group = ctx.layout.dp_group if ctx.res.tp > 1 else None
    applied.build_optimizer = lambda params, name, impl: build_zero_redundancy(params, name, impl, group)
    return applied
