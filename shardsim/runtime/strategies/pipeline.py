"""Pipeline parallelism with `torch.distributed.pipelining`: each rank runs one stage (a run of
consecutive blocks, split as the simulator splits them) in a manual `PipelineStage`, driven by
`ScheduleGPipe` or `Schedule1F1B`; a stage's replicas are plain, under DDP, or sharded by FSDP2.
With tensor parallelism each stage's module is TP'd first (`fsdp.parallelize`); the stages send
each other their local activations (a sequence shard under sequence parallelism). Tied
embeddings (Megatron-LM's way): the last stage keeps its own copy of the embedding as its output
projection, and each rank of the first stage and its peer of the last (the same data- and
tensor-parallel coordinates: the embedding group) all-reduce (sum) their shard of that parameter's
gradient before the optimizer step (`TiedEmbedding`): the vocabulary rows of its tensor-parallel
rank, FSDP2's shard of those on a sharded stage; the two ends shard the copy alike."""

from __future__ import annotations

import torch
from torch import nn

from shardsim.runtime.strategies.blocks import blocks_of
from shardsim.runtime.strategies.checkpointing import apply_checkpointing
from shardsim.runtime.strategies.ddp import apply_ddp, localize_tp
from shardsim.runtime.strategies.fsdp import apply_fsdp, parallelize
from shardsim.runtime.strategies.step import AppliedStrategy, Batch, StepContext
from shardsim.runtime.strategies.tensor_parallel import local_loss, loss_context, reduce_partial_grads
from shardsim.specs.model.workload import stage_ranges
from shardsim.specs.stage_split import ranges


class StageModule(nn.Module):
    """The piece of a model one pipeline stage runs: embed (stage 0), a run of consecutive
    blocks, head (last stage). Blocks keep their global index as key, so parameter names
    equal the whole model's."""

    def __init__(self, embed: nn.Module | None, blocks: dict[str, nn.Module], head: nn.Module | None):
        super().__init__()
        self.embed = embed
        self.blocks = nn.ModuleDict(blocks)
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for block in self.blocks.values():
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def block_names(model: nn.Module) -> list[str]:
    """The keys of the model's blocks (a ModuleDict's, else their indices)."""
    if isinstance(model.blocks, nn.ModuleDict):
        return list(model.blocks.keys())
    return [str(i) for i in range(len(blocks_of(model)))]


def split_stage(model: nn.Module, pp_rank: int, pp: int, spans: list[tuple[int, int]] | None = None) -> StageModule:
    """Stage `pp_rank` of `pp`: blocks [start, end) of `spans` (default
    `specs.model.workload.stage_ranges`, as the simulator splits them), the embedding on the
    first stage, the head on the last."""
    if not hasattr(model, "head"):
        raise ValueError("a pipeline needs a model with embed (or None), blocks and head")
    blocks = blocks_of(model)
    start, end = (spans or stage_ranges(len(blocks), pp))[pp_rank]
    names = block_names(model)
    embed = getattr(model, "embed", None) if pp_rank == 0 else None
    head = model.head if pp_rank == pp - 1 else None
    return StageModule(embed, {names[i]: blocks[i] for i in range(start, end)}, head)


def tied_parameters(model: nn.Module) -> list[tuple[str, str]]:
    """(name in `model.embed`, name in `model.head`) of each parameter the two share (tied
    embeddings: the token embedding is the LM head's output projection)."""
    embed, head = getattr(model, "embed", None), getattr(model, "head", None)
    if embed is None or head is None:
        return []
    names = {id(p): n for n, p in embed.named_parameters()}
    return [(names[id(p)], n) for n, p in head.named_parameters() if id(p) in names]


class TiedEmbedding:
    """The tied parameters (`pairs`: `tied_parameters` of the whole model) of this rank's stage
    (the embedding where it holds the `first` stage, the copy in its head where the `last`; none
    on the stages between) and the group of this rank and its peer on the other end: the first and last rank of its "pp"
    group (the same dp / tp coordinates). Every rank creates every pair's group (new_group is
    collective), in the same order."""

    def __init__(self, pairs: list[tuple[str, str]], stage: nn.Module, res, first: bool, last: bool):
        import torch.distributed as dist

        rank = dist.get_rank()
        self.group = None
        for ranks in res.dims.groups("pp") if pairs else []:  # in rank order of the first stage's
            members = [ranks[0], ranks[-1]]
            group = dist.new_group(members)
            if rank in members:
                self.group = group
        inner = getattr(stage, "module", stage)  # under DDP: the stage module it wraps
        if first:
            self.params = [inner.embed.get_parameter(e) for e, _ in pairs]
        elif last:
            self.params = [inner.head.get_parameter(h) for _, h in pairs]
        else:
            self.params = []

    def all_reduce_grads(self) -> None:
        """Sum the two copies' gradients (each already synced over its stage's replicas), each
        rank its local shard (a DTensor's local tensor is its gradient's storage)."""
        import torch.distributed as dist

        for p in self.params:
            grad = p.grad
            dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=self.group)


def _stage_class():
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.pipelining import PipelineStage
    from torch.nn.parallel import DistributedDataParallel

    class AccumulatingStage(PipelineStage):
        """A PipelineStage whose data-parallel sync across replicas can wait for the
        gradient-accumulation boundary. Pipelining syncs in every schedule step: DDP on the
        last microbatch, FSDP2 in its post-backward (which turns the replica all-reduce back
        on). With ``replica_sync = False`` DDP runs under no_sync and FSDP2 reduce-scatters
        but skips the replica all-reduce (``set_requires_all_reduce(False)``)."""

        replica_sync = True

        def _compute_outputs(self, *args, module, **kwargs):
            # Shape inference (first step) runs the stage outside the schedule; a DDP
            # stage must not arm its reducer there (its backward only asks input grads).
            if isinstance(module, DistributedDataParallel):
                with module.no_sync():
                    return module(*args, **kwargs)
            return module(*args, **kwargs)

        def backward_maybe_with_nosync(self, backward_type, bwd_kwargs, last_backward=False):
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward and self.replica_sync)

        def perform_reduce_grad(self, grad_scale_factor):
            mod = self.submod
            if self.replica_sync or not isinstance(mod, FSDPModule):
                return super().perform_reduce_grad(grad_scale_factor)
            enable = mod.set_requires_gradient_sync

            def reduce_scatter_only(flag: bool, *, recurse: bool = True) -> None:
                enable(flag, recurse=recurse)
                mod.set_requires_all_reduce(False, recurse=recurse)

            mod.set_requires_gradient_sync = reduce_scatter_only
            try:
                return super().perform_reduce_grad(grad_scale_factor)
            finally:
                del mod.set_requires_gradient_sync

    return AccumulatingStage


def build_pipeline_stage(
    model: nn.Module, pp_rank: int, pp: int, device: torch.device, *, group=None, wrap=None, spans=None
):
    """A manual `PipelineStage` for this rank: split the model (by `spans`, default even),
    apply `wrap(stage_module)` (checkpointing, FSDP or DDP over the stage's replicas), hand it
    to pipelining. Returns (stage, stage_module)."""
    module = split_stage(model, pp_rank, pp, spans)
    if wrap is not None:
        module = wrap(module)
    else:
        module = module.to(device)
    stage = _stage_class()(module, pp_rank, pp, device, group=group)
    return stage, module


def build_schedule(stage, schedule: str, microbatches: int, loss_fn):
    """ScheduleGPipe or Schedule1F1B. Gradients are not rescaled by the schedule: the loss
    function already divides by microbatches x accumulation steps (a schedule's own
    rescaling would divide gradients accumulated over earlier steps again)."""
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule]
    return cls(stage, microbatches, loss_fn=loss_fn, scale_grads=False)


def restoring_shards(forward_backward, shards: list):
    """`forward_backward` that puts each of `shards` (`LocalShards`) back when it ends (for the
    optimizer's and the state's view of the modules); itself when there are none."""
    if not shards:
        return forward_backward

    def restoring(micro_batches: list[Batch]) -> torch.Tensor:
        try:
            return forward_backward(micro_batches)
        finally:
            for local in shards:
                local.restore()

    return restoring


def microbatch_loss(ctx: StepContext, n: int):
    """A schedule's loss function: the loss over `n` (microbatches x accumulation steps), scaled
    for fp16 where a scaler runs."""
    scale, scaler, loss_fn = 1.0 / n, ctx.precision.scaler, ctx.loss_fn

    def mb_loss(out, y):
        loss = loss_fn(out, y) * scale
        return scaler.scale(loss) if scaler else loss

    return mb_loss


def stage_batches(ctx: StepContext, K: int, pp: int, first: bool, last: bool):
    """step -> this rank's `K` (inputs, targets): inputs where it runs the first stage, targets
    where it runs the last, None elsewhere."""

    def make_batches(step: int) -> list[Batch]:
        out = []
        for k in range(K):
            if first or last:
                x, y = ctx.batch(step, k, pp)
                out.append((x if first else None, y if last else None))
            else:
                out.append((None, None))
        return out

    return make_batches


def wrap_stage(ctx: StepContext, stage_module: StageModule, first: int, shards: list) -> nn.Module:
    """A stage's module as its rank runs it (`first`: its first block's index in the whole
    model): with tensor parallelism TP, checkpointing, then FSDP2 or DDP over the stage's
    data-parallel ranks on local shards (appended to `shards`); else checkpointing, then FSDP2
    when sharded, DDP over the stage's replicas when it has several."""
    cfg, res, layout, device = ctx.cfg, ctx.res, ctx.layout, ctx.device
    if res.tp > 1:
        mp = ctx.precision.mp_policy
        stage_module = parallelize(stage_module, cfg, res, layout, mp_policy=mp, first=first, shard=res.shard > 1)
        if res.shard > 1:
            return stage_module
        # local shards as under DDP, also for a lone replica: plain parameters only (one kind for
        # Adam's and the fp16 scaler's foreach kernels)
        stage_module, local = localize_tp(stage_module.to(device))
        shards.append(local)
        if res.dp > 1:
            return apply_ddp(stage_module, device, layout.dp_group, cfg.ddp_reduce_dtype)
        return stage_module
    apply_checkpointing(stage_module, cfg.checkpointing, cfg.selective_ac_option, first)
    if res.shard > 1:
        return apply_fsdp(stage_module, layout.fsdp_mesh, mp_policy=ctx.precision.mp_policy)
    stage_module = stage_module.to(device)
    if res.world // res.pp > 1:
        return apply_ddp(stage_module, device, layout.dp_group, cfg.ddp_reduce_dtype)
    return stage_module


def pipeline(model: nn.Module, ctx: StepContext) -> AppliedStrategy:
    """Strategy pipeline: this rank's stage (checkpointing if configured; FSDP2 over the
    layout's mesh when sharded, else DDP over the stage's replicas when it has several), and
    a step of `grad_accum` schedule steps, each over `microbatches` microbatches; the replicas
    sync their gradients only in the last (`AccumulatingStage.replica_sync`)."""
    cfg, res, layout, device = ctx.cfg, ctx.res, ctx.layout, ctx.device
    amp, scaler = ctx.precision.autocast, ctx.precision.scaler
    pp, M, K = res.pp, res.microbatches, cfg.grad_accum
    R = res.world // pp
    first, last = layout.stage == 0, layout.stage == pp - 1
    n_blocks = len(blocks_of(model))
    spans = ranges(res.stage_counts(n_blocks))

    shards: list = []  # LocalShards of a TP stage under DDP

    def wrap(stage_module: StageModule) -> nn.Module:
        return wrap_stage(ctx, stage_module, spans[layout.stage][0], shards)

    pairs = tied_parameters(model)  # before TP or FSDP2 replace the stage's parameters (and untie them)
    stage, module = build_pipeline_stage(model, layout.stage, pp, device, group=layout.pp_group, wrap=wrap, spans=spans)
    tied = TiedEmbedding(pairs, module, res, first, last) if pp > 1 and pairs else None
    schedule = build_schedule(stage, cfg.strategy.schedule, M, microbatch_loss(ctx, M * K))
    make_batches = stage_batches(ctx, K, pp, first, last)
    inv_scale = (lambda t: t / scaler.get_scale()) if scaler else (lambda t: t)

    def forward_backward(micro_batches: list[Batch]) -> torch.Tensor:
        losses: list = []
        for k, (x, y) in enumerate(micro_batches):
            stage.replica_sync = k == K - 1
            mb: list = []  # the schedule clears the list it is given
            with amp(), loss_context(res.tp):
                if first and last:
                    schedule.step(x, target=y, losses=mb)
                elif first:
                    schedule.step(x)
                elif last:
                    schedule.step(target=y, losses=mb)
                else:
                    schedule.step()
            losses += [local_loss(t) for t in mb]
        if tied is not None:
            tied.all_reduce_grads()
        if res.tp > 1:
            reduce_partial_grads(module)
        if not losses:
            return torch.zeros((), device=device)
        return inv_scale(torch.stack([t.detach().float() for t in losses]).sum())

    weight = 1.0 / R if last else 0.0
    forward_backward = restoring_shards(forward_backward, shards)

    keeps = layout.replica == 0 and layout.tp_rank == 0  # one rank per stage saves the full state
    return AppliedStrategy(module, forward_backward, make_batches, weight, keeps, scaler, {"stage": layout.stage})
