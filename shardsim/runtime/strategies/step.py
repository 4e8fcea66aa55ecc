"""What a strategy's training step works with, what applying a strategy gives the rank, and
the step the data-parallel strategies share (DDP and FSDP2: gradient accumulation with the
replica sync at the last micro-step)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from shardsim.config import Resolved, RunConfig
from shardsim.runtime import data
from shardsim.runtime.strategies.layout import Layout
from shardsim.runtime.strategies.precision import Precision

Batch = tuple[Any, Any]  # (inputs, targets) of one micro-step; None where a pipeline stage needs neither
ReplicaSync = Callable[[nn.Module, bool], AbstractContextManager]  # (module, sync on?) around a micro-step


@dataclass(frozen=True)
class StepContext:
    """Everything a strategy's step trains with besides the model."""

    cfg: RunConfig
    res: Resolved
    device: torch.device
    layout: Layout
    precision: Precision
    sample: data.Sampler  # sample_batch(n, generator) -> (inputs, targets)
    loss_fn: Callable[[torch.Tensor, Any], torch.Tensor]  # (output, targets) -> mean loss, in fp32
    data_batches: int  # runtime.train's --data-batches

    def batch(self, step: int, micro: int, chunks: int) -> Batch:
        """This rank's replica's samples of micro-step `micro` of step `step`, on the device."""
        c = self.cfg
        ds = data.data_step(step, self.data_batches)
        x, y = data.local_batch(self.sample, c.batch_per_device, chunks, c.seed, ds, micro, self.layout.replica)
        return x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)


@dataclass
class AppliedStrategy:
    """A strategy applied on this rank: the module it trains and the step that trains it."""

    module: nn.Module  # what the step runs and the optimizer steps (DDP / FSDP / stage module)
    forward_backward: Callable[[list[Batch]], torch.Tensor]  # micro-batches -> this rank's loss of the step
    make_batches: Callable[[int], list[Batch]]  # step -> this rank's micro-batches
    loss_weight: float  # this rank's loss x weight, summed over ranks = the global loss
    keeps_state: bool  # this rank keeps the full parameters and gradients (runtime.testing.SaveParams)
    scaler: Any  # ShardedGradScaler for fp16, else None
    notes: dict = field(default_factory=dict)
    # (parameters, optimizer name, implementation) -> the optimizer; None: `optimizer.build_optimizer` (zero1: its own)
    build_optimizer: Callable[[Any, str, str], Any] | None = None


def data_parallel_step(module: nn.Module, ctx: StepContext, replica_sync: ReplicaSync) -> AppliedStrategy:
    """Every rank runs the whole model on its own chunk of the global batch, accumulating
    `grad_accum` micro-steps; `replica_sync(module, k == K - 1)` wraps each micro-step, so
    gradients are synchronized across replicas only at the accumulation boundary. With tensor
    parallelism the ranks of a group run the same samples: the loss is vocabulary-parallel
    (`loss_parallel`) and each rank's loss, repeated over its group, weighs 1 / world all the same
    (the sum over ranks is the mean over data-parallel ranks)."""
    from shardsim.runtime.strategies.tensor_parallel import local_loss, loss_context, reduce_partial_grads

    K = ctx.cfg.grad_accum
    tp = ctx.res.tp
    inv_k = 1.0 / K
    amp, scaler, loss_fn = ctx.precision.autocast, ctx.precision.scaler, ctx.loss_fn

    def make_batches(step: int) -> list[Batch]:
        return [ctx.batch(step, k, 1) for k in range(K)]

    def forward_backward(micro_batches: list[Batch]) -> torch.Tensor:
        total = None
        for k, (x, y) in enumerate(micro_batches):
            sync = replica_sync(module, k == K - 1) if K > 1 else contextlib.nullcontext()
            with sync, loss_context(tp):
                with amp():
                    loss = loss_fn(module(x), y)
                if K > 1:
                    loss = loss * inv_k
                (scaler.scale(loss) if scaler else loss).backward()
            loss = local_loss(loss.detach())
            total = loss if total is None else total + loss
        if tp > 1:
            reduce_partial_grads(module)
        return total

    keeps = ctx.layout.replica == 0 and ctx.layout.tp_rank == 0  # one rank saves the full state
    return AppliedStrategy(module, forward_backward, make_batches, 1.0 / ctx.res.world, keeps, scaler)
