"""Sharded data parallelism with FSDP2 (`fully_shard`): ZeRO over the world, ZeRO-2D
(MiCS / HSDP) sharded within groups and replicated across them.

`apply_fsdp` touches no process group except through FSDP2, so it also runs under PyTorch's
fake process group (the simulator's collective trace and runtime.profile use it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from shardsim.config import Resolved, RunConfig
from shardsim.runtime.strategies.blocks import blocks_of
from shardsim.runtime.strategies.checkpointing import apply_checkpointing
from shardsim.runtime.strategies.layout import Layout
from shardsim.runtime.strategies.step import AppliedStrategy, StepContext, data_parallel_step


def apply_fsdp(
    model: nn.Module, mesh, *, mp_policy=None, reshard_after_forward: bool = True, experts=None
) -> nn.Module:
    """FSDP2 `fully_shard`: one unit per block (``reshard_after_forward``: free the gathered
    parameters after forward, gather again in backward), then the root (embedding + head and
    anything left; FSDP2's default keeps the root gathered after forward). A 1-D mesh shards over all its ranks (ZeRO);
    a 2-D ("dp_replicate", "dp_shard") mesh shards within dim 1 and replicates across dim 0 (HSDP).
    `experts`: (mesh, data-parallel ranks) under expert parallelism: the MoE layers' experts a unit of
    their own over that mesh (`expert_parallel.shard_experts`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = mp_policy or MixedPrecisionPolicy()
    for block in blocks_of(model):
        if experts is not None:
            from shardsim.runtime.strategies.expert_parallel import shard_experts

            shard_experts(block, *experts, reshard_after_forward=reshard_after_forward, mp_policy=mp)
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


@contextlib.contextmanager
def fsdp_replica_sync(module: nn.Module, sync: bool) -> Iterator[None]:
    """FSDP2 reduce-scatters within the shard group on every micro-step; the all-reduce across
    replicas (2-D mesh) only where `sync` (`set_requires_all_reduce`)."""
    module.set_requires_all_reduce(sync)
    yield


def parallelize(
    model: nn.Module, cfg: RunConfig, res: Resolved, layout: Layout, *, mp_policy=None, first: int = 0, shard: bool
) -> nn.Module:
    """In torchtitan's order: tensor parallelism over the layout's "tp" mesh (tp > 1), expert
    parallelism over its "ep" mesh (ep > 1), activation checkpointing as configured (`first`: the
    model's first block's index in the whole model), then FSDP2 over the layout's data-parallel
    mesh where `shard` (ZeRO-2: the blocks not resharded after forward; under EP the experts over
    the data-parallel ranks left after EP, their gradients averaged over all of them)."""
    s = cfg.strategy
    if res.tp > 1:
        from shardsim.runtime.strategies.tensor_parallel import apply_tp

        apply_tp(model, layout.tp_mesh, sequence_parallel=s.sequence_parallel, async_tp=s.async_tp)
    experts = None
    if res.ep > 1:
        from shardsim.runtime.strategies.expert_parallel import apply_ep

        apply_ep(model, layout.ep_mesh)
        experts = (layout.expert_fsdp_mesh, res.dims.dp * res.ep)
    apply_checkpointing(model, cfg.checkpointing, cfg.selective_ac_option, first)
    if not shard:
        return model
    rest = getattr(s, "reshard_after_forward", True)
    return apply_fsdp(model, layout.fsdp_mesh, mp_policy=mp_policy, reshard_after_forward=rest, experts=experts)


def fsdp(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategies zero and zero2d: `parallelize` (TP, checkpointing, FSDP2 over the layout's mesh)."""
    module = parallelize(model, ctx.cfg, ctx.res, ctx.layout, mp_policy=ctx.precision.mp_policy, shard=True)
    return data_parallel_step(module, ctx, fsdp_replica_sync)
