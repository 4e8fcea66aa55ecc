"""Data parallelism with `DistributedDataParallel`: every rank holds the whole model and
all-reduces gradient buckets as backward produces them.

With tensor parallelism (ddp + tp) DDP itself runs over the data-parallel group on each rank's
local shards (`LocalShards`: PyTorch's TP + DDP composition, made to work with activation
checkpointing and tied embeddings), not FSDP2."""

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


class LocalShards:
    """TP + DDP: each DTensor parameter becomes its local shard (an nn.Parameter DDP buckets and
    all-reduces over the data-parallel group); before each forward of the root module the
    DTensors are rebuilt from them (`DTensor.from_local`, a view: gradients reach the local shard,
    pending sums over the TP group reduced on the way) and left in place until `restore` puts the
    local parameters back (after the step's backward), so that activation checkpointing's
    recomputation in backward sees the same DTensors. PyTorch's own
    `tensor.parallel.ddp._pre_dp_module_transform` localizes right after forward, which breaks
    checkpointing, and rebuilds a tied parameter on one of its modules only; this does both."""

    def __init__(self, model: nn.Module):
        from torch.distributed.tensor import DTensor

        self.entries: list[tuple[nn.Module, str, nn.Parameter, tuple]] = []
        local: dict[int, nn.Parameter] = {}
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if not isinstance(p, DTensor):
                    continue
                if id(p) not in local:
                    shard = nn.Parameter(p.to_local().detach().clone(), requires_grad=p.requires_grad)
                    shard._tp_spec = (p.device_mesh, tuple(p.placements), p.shape, p.stride())  # type: ignore[attr-defined]
                    local[id(p)] = shard
                mod._parameters[name] = local[id(p)]
                self.entries.append((mod, name, local[id(p)], local[id(p)]._tp_spec))  # type: ignore[attr-defined]
        model.register_forward_pre_hook(self.rebuild)

    def rebuild(self, *_) -> None:
        from torch.distributed.tensor import DTensor

        self.restore()
        for mod, name, shard, (mesh, placements, shape, stride) in self.entries:
            del mod._parameters[name]
            setattr(mod, name, DTensor.from_local(shard, mesh, placements, run_check=False, shape=shape, stride=stride))

    def restore(self) -> None:
        for mod, name, shard, _ in self.entries:
            if mod._parameters.get(name) is not shard:
                mod.__dict__.pop(name, None)
                mod._parameters[name] = shard


def localize_tp(model: nn.Module) -> tuple[nn.Module, LocalShards]:
    """`model` (tensor parallel) with local-shard parameters for DDP, and their `LocalShards`."""
    return model, LocalShards(model)


def restoring(applied: AppliedStrategy, shards: LocalShards) -> AppliedStrategy:
    """`applied` whose step puts the local parameters back when it ends (for the optimizer's and
    the state's view of the module)."""
    step = applied.forward_backward

    def forward_backward(micro_batches):
        try:
            return step(micro_batches)
        finally:
            shards.restore()

    applied.forward_backward = forward_backward
    return applied


def ddp(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy ddp: checkpointing if configured, the model on the device under DDP over the world.
    With tensor parallelism: TP first (`fsdp.parallelize`), then DDP over the layout's "dp_replicate" group
    on the local shards (`localize_tp`)."""
    if ctx.res.tp > 1:
        from shardsim.runtime.strategies.fsdp import parallelize

        model, shards = localize_tp(parallelize(model, ctx.cfg, ctx.res, ctx.layout, shard=False).to(ctx.device))
        group = ctx.layout.dp_group
        module = apply_ddp(model, ctx.device, process_group=group, reduce_dtype=ctx.cfg.ddp_reduce_dtype)
        return restoring(data_parallel_step(module, ctx, ddp_replica_sync), shards)
    apply_checkpointing(model, ctx.cfg.checkpointing, ctx.cfg.selective_ac_option)
    module = apply_ddp(model.to(ctx.device), ctx.device, reduce_dtype=ctx.cfg.ddp_reduce_dtype)
    return data_parallel_step(module, ctx, ddp_replica_sync)
