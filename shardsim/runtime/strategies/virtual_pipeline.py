"""Pipelines under PyTorch's multi-stage schedules (`PipelineScheduleMulti`: interleaved-1f1b,
looped-bfs, interleaved-zb, zbv, dualpipev): each rank builds a `PipelineStage` for each of the stages it
holds (`specs.schedules.rank_stages`, as PyTorch places them), its layers split as the
simulator splits them (`Resolved.stage_counts`), each stage plain, under DDP over its replicas,
or sharded by FSDP2, and PyTorch's schedule class drives them. The module the optimizer steps
holds every block of the rank's stages under its whole-model name. Tied embeddings: where the
last stage is on another rank than the first (the looped schedules: rank pp - 1), the two sum
their copies' gradients as a one-stage-a-rank pipeline does (`pipeline.TiedEmbedding`); a
V-shaped schedule (run with one rank a stage) holds both on rank 0, where the two stages share
the one parameter."""

from __future__ import annotations

from torch import nn

from shardsim.runtime.strategies.blocks import blocks_of
from shardsim.runtime.strategies.pipeline import (
    StageModule,
    TiedEmbedding,
    _stage_class,
    block_names,
    microbatch_loss,
    pipeline,
    restoring_shards,
    stage_batches,
    tied_parameters,
    wrap_stage,
)
from shardsim.runtime.strategies.step import AppliedStrategy, Batch, StepContext
from shardsim.runtime.strategies.tensor_parallel import local_loss, loss_context, reduce_partial_grads
from shardsim.specs.schedules import rank_stages, stage_rank
from shardsim.specs.stage_split import ranges


def schedule_class(name: str):
    """PyTorch's schedule class of a multi-stage schedule name."""
    from torch.distributed.pipelining import schedules as s

    return {
        "interleaved-1f1b": s.ScheduleInterleaved1F1B,
        "looped-bfs": s.ScheduleLoopedBFS,
        "interleaved-zb": s.ScheduleInterleavedZeroBubble,
        "zbv": s.ScheduleZBVZeroBubble,
        "dualpipev": s.ScheduleDualPipeV,
    }[name]


def any_schedule_pipeline(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy pipeline under its schedule: one stage a rank (`pipeline.pipeline`) or several."""
    return multi_stage_pipeline(model, ctx) if ctx.res.multi_stage else pipeline(model, ctx)


def multi_stage_pipeline(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy pipeline under a multi-stage schedule: this rank's stages, each wrapped as a
    single-stage pipeline wraps its one (`wrap_stage`: TP, checkpointing; FSDP2, or DDP over the
    stage's replicas), and a step of `grad_accum` schedule steps; the replicas sync their gradients only
    in the last (`AccumulatingStage.replica_sync`), then the tied embedding's copies sum theirs."""
    import torch

    cfg, res, layout, device = ctx.cfg, ctx.res, ctx.layout, ctx.device
    amp, scaler = ctx.precision.autocast, ctx.precision.scaler
    P, M, K, S = res.pp, res.microbatches, cfg.grad_accum, res.stages
    R = res.world // P
    blocks, names = blocks_of(model), block_names(model)
    spans = ranges(res.stage_counts(len(blocks)))
    held = rank_stages(res.schedule, P, res.stages_per_rank, layout.stage)
    first, last = 0 in held, S - 1 in held
    pairs = tied_parameters(model)  # before TP or FSDP2 replace the stages' parameters

    modules: list[nn.Module] = []
    shards: list = []  # LocalShards of TP stages under DDP
    for s in held:
        a, b = spans[s]
        embed = getattr(model, "embed", None) if s == 0 else None
        m = StageModule(embed, {names[i]: blocks[i] for i in range(a, b)}, model.head if s == S - 1 else None)
        modules.append(wrap_stage(ctx, m, a, shards))
    stages = [_stage_class()(m, s, S, device, group=layout.pp_group) for s, m in zip(held, modules, strict=True)]
    inner = [getattr(m, "module", m) for m in modules]  # under DDP: the stage module it wraps
    union = StageModule(
        inner[held.index(0)].embed if first else None,
        {n: blk for i in inner for n, blk in i.blocks.items()},
        inner[held.index(S - 1)].head if last else None,
    )
    apart = pairs and stage_rank(res.schedule, P, S - 1) != 0  # the same decision on every rank (new_group)
    tied = TiedEmbedding(pairs, union, res, first, last) if apart else None
    # gradients not rescaled by the schedule: the loss already divides by microbatches x steps
    schedule = schedule_class(res.schedule)(stages, M, loss_fn=microbatch_loss(ctx, M * K), scale_grads=False)
    make_batches = stage_batches(ctx, K, P, first, last)
    inv_scale = (lambda t: t / scaler.get_scale()) if scaler else (lambda t: t)

    def forward_backward(micro_batches: list[Batch]) -> torch.Tensor:
        losses: list = []
        for k, (x, y) in enumerate(micro_batches):
            for stage in stages:
                stage.replica_sync = k == K - 1
            mb: list = []  # the schedule clears the list it is given
            with amp(), loss_context(res.tp):
                args = (x,) if first else ()
                kwargs = {"target": y, "losses": mb} if last else {}
                schedule.step(*args, **kwargs)
            losses += [local_loss(t) for t in mb]
        if tied is not None:
            tied.all_reduce_grads()
        if res.tp > 1:
            for m in modules:
                reduce_partial_grads(m)
        if not losses:
            return torch.zeros((), device=device)
        return inv_scale(torch.stack([t.detach().float() for t in losses]).sum())

    weight = 1.0 / R if last else 0.0
    keeps = layout.replica == 0 and layout.tp_rank == 0  # one rank of each pipeline rank saves the full state
    step = restoring_shards(forward_backward, shards)
    return AppliedStrategy(union, step, make_batches, weight, keeps, scaler, {"stage": layout.stage})
