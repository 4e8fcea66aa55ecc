"""The runtime's strategies: PyTorch's own engines applied to a plain model (torchtitan style),
one module per parallelism as in simulator/strategies.

- ddp: `DistributedDataParallel` (strategy ddp);
- zero1: DDP stepped by `ZeroRedundancyOptimizer` (strategy zero1);
- fsdp: FSDP2 `fully_shard` (zero, zero2d);
- pipeline: `torch.distributed.pipelining` (pipeline), its stages plain, DDP or FSDP2;
- layout: each rank's device mesh and groups; precision: autocast, FSDP2's mixed precision and
  the fp16 scaler; checkpointing; step: the training step the data-parallel strategies share.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

import torch
from torch import nn

from shardsim.config import Resolved, RunConfig
from shardsim.runtime.strategies.ddp import ddp
from shardsim.runtime.strategies.fsdp import fsdp
from shardsim.runtime.strategies.layout import (
    Layout,
    MeshOf,
    build_layout,
    ddp_layout,
    pipeline_layout,
    zero2d_layout,
    zero_layout,
)
from shardsim.runtime.strategies.precision import precision_for
from shardsim.runtime.strategies.step import AppliedStrategy, StepContext
from shardsim.runtime.strategies.virtual_pipeline import any_schedule_pipeline
from shardsim.runtime.strategies.zero1 import zero1

__all__ = ["STRATEGIES", "AppliedStrategy", "Engine", "Layout", "StepContext", "apply_strategy", "build_layout"]


@dataclass(frozen=True)
class Engine:
    """How the runtime applies one strategy kind: its ranks' layout, then its `apply`."""

    layout: Callable[[MeshOf, Resolved, int], Layout]
    apply: Callable[[nn.Module, StepContext], AppliedStrategy]


# under the kinds' names (spec.strategies.STRATEGIES; a test checks every concern's registry holds them)
STRATEGIES: dict[str, Engine] = {
    "ddp": Engine(ddp_layout, ddp),
    "zero": Engine(zero_layout, fsdp),
    "zero2d": Engine(zero2d_layout, fsdp),
    "pipeline": Engine(pipeline_layout, any_schedule_pipeline),
    "zero1": Engine(ddp_layout, zero1),
}


def _sample_and_loss(model: nn.Module):
    """The model's batch sampler and loss, holding no reference to the whole model where it
    can be avoided: a pipeline stage frees the other stages' blocks."""
    from shardsim.runtime.models.transformer import ShardsimModel, sample_batch

    if isinstance(model, ShardsimModel):
        loss = functools.partial(ShardsimModel.loss, None)  # uses no state of the model
        return functools.partial(sample_batch, model.arch), loss
    return model.sample_batch, model.loss


def apply_strategy(
    model: nn.Module,
    cfg: RunConfig,
    res: Resolved,
    rank: int,
    device: torch.device,
    timeout: timedelta,
    data_batches: int = 0,
) -> AppliedStrategy:
    """Apply `cfg`'s strategy to `model` on this rank (all ranks call it together): its layout
    (`build_layout`, with the job's `timeout` on every group), its precision, then the
    strategy's own `apply` from `STRATEGIES`. `data_batches` as runtime.train's --data-batches."""
    engine = STRATEGIES[cfg.strategy.kind]
    layout = build_layout(engine.layout, res, rank, device.type, timeout)
    precision = precision_for(cfg, res, device)
    sample, base_loss = _sample_and_loss(model)
    loss_fn = base_loss if precision.low is None else (lambda out, y: base_loss(out.float(), y))
    ctx = StepContext(cfg, res, device, layout, precision, sample, loss_fn, data_batches)
    return engine.apply(model, ctx)
