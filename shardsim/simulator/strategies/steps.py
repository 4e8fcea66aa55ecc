"""What every strategy's program is made of: the piece of the model a rank class runs, its
compute ops, the optimizer step, and the micro-steps of a data-parallel plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from operator import attrgetter

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.checkpointing import Checkpointing
from shardsim.simulator.compute import BlockCost, ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan, RankClass
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.schedules import rank_stages, stage_rank
from shardsim.specs.stage_split import ranges

ROOT = "root"  # the unit of the embedding and the head (FSDP2's root module)


def split_blocks(w: Workload) -> tuple[list[Block], list[Block], list[Block]]:
    """The workload's embedding, layer and head blocks."""
    embed = [b for b in w.blocks if b.kind == "embed"]
    layers = [b for b in w.blocks if b.kind == "layer"]
    head = [b for b in w.blocks if b.kind == "head"]
    return embed, layers, head


def tied_copy(w: Workload) -> int:
    """Elements of the token embedding a pipeline's last stage holds a copy of when the LM head
    is tied to it (Megatron-LM's tied embeddings: the first stage's embedding, the last stage's
    output projection); 0 for an untied model."""
    embed = [b for b in w.blocks if b.kind == "embed"]
    return embed[0].largest_tensor if w.tied_embeddings and embed else 0


def tied_shard(w: Workload, shard: int) -> int:
    """Elements of a rank's shard of the tied copy (`tied_copy`, already a tensor-parallel rank's
    vocabulary rows) when FSDP2 shards its stage over `shard` ranks: dim 0 split as
    `torch.chunk` splits it, the largest shard (the first rank's)."""
    copy = tied_copy(w)
    if shard == 1 or not copy:
        return copy
    assert w.arch is not None, "a tied copy is a text model's token embedding"
    rows = copy // w.arch.hidden
    return -(-rows // shard) * w.arch.hidden


def ends_apart(res: Resolved) -> bool:
    """Are a pipeline's first and last stage on different ranks? (Not with one stage, nor in a
    V-shaped schedule, whose rank 0 holds both: a tied embedding is one parameter there.)"""
    return res.pp > 1 and stage_rank(res.schedule, res.pp, res.stages - 1) != 0


def pipeline_blocks(w: Workload, apart: bool) -> tuple[list[Block], list[Block], list[Block]]:
    """`split_blocks` of a pipeline: with tied embeddings and its ends on different ranks
    (`apart`, `ends_apart`), the head holds the copy of the embedding (`tied_copy`: its
    parameters, gradients and optimizer state on the last stage, a DTensor there when the
    embedding is one; its matmul is the head's already)."""
    embed, layers, head = split_blocks(w)
    copy = tied_copy(w) if apart else 0
    if copy and head:
        h = head[-1]
        largest = max(h.largest_tensor, copy)
        dt = h.dtensor_params + (copy if embed[0].dtensor_params else 0)
        grown = replace(
            h, params=h.params + copy, param_tensors=h.param_tensors + 1, largest_tensor=largest, dtensor_params=dt
        )
        head = [*head[:-1], grown]
    return embed, layers, head


@dataclass
class Piece:
    """The blocks one rank class runs (the whole model, or one pipeline stage), with the
    collectives that gather and sync its parameters."""

    embed: list[Block]
    layers: list[Block]
    head: list[Block]
    shard: GroupLayout | None  # FSDP shard groups; None = replicated (DDP or no data parallel)
    replica: GroupLayout | None  # groups that all-reduce gradients (HSDP / DDP)

    @property
    def root_params(self) -> float:
        return sum(b.params for b in self.embed + self.head)

    @property
    def blocks(self) -> list[Block]:
        return self.embed + self.layers + self.head

    @property
    def units(self) -> tuple[tuple[str, float], ...]:
        """(name, params) of its units: the root (when it has embedding or head), then each layer."""
        units = tuple((b.name, float(b.params)) for b in self.layers)
        if self.root_params:
            units = ((ROOT, float(self.root_params)),) + units
        return units


def stage_blocks(res: Resolved, w: Workload) -> list[tuple[list[Block], list[Block], list[Block]]]:
    """(embedding, layers, head) of each of a pipeline's stages (`Resolved.stage_counts`): the
    embedding on the first, the head on the last."""
    embed, layers, head = pipeline_blocks(w, ends_apart(res))
    last = res.stages - 1
    spans = ranges(res.stage_counts(len(layers)))
    return [(embed if s == 0 else [], layers[a:b], head if s == last else []) for s, (a, b) in enumerate(spans)]


def rank_stage_blocks(res: Resolved, w: Workload, rank: int) -> list[tuple[int, list[Block]]]:
    """The stages pipeline rank `rank` holds (in its local order) with each one's blocks."""
    per_stage = stage_blocks(res, w)
    return [
        (s, [b for part in per_stage[s] for b in part])
        for s in rank_stages(res.schedule, res.pp, res.stages_per_rank, rank)
    ]


def rank_classes(res: Resolved, w: Workload, pipeline: bool) -> list[tuple[RankClass, list[Block]]]:
    """The rank classes of a step's plan (one of every rank, or one a pipeline stage), each with
    the blocks it runs: what the plans are made of and what memory is estimated from, before
    any op is planned."""
    if pipeline:
        per_stage = stage_blocks(res, w)
        parts = []
        for r in range(res.pp):  # a class a pipeline rank, with the blocks of every stage it holds
            m, held = stage_mesh(res, r), rank_stages(res.schedule, res.pp, res.stages_per_rank, r)
            e, ls, h = ([b for s in held for b in per_stage[s][i]] for i in range(3))
            label = f"stage {r}" if res.stages_per_rank == 1 else f"rank {r} (stages {', '.join(map(str, held))})"
            parts.append((label, m.start, m.count, e, ls, h))
    else:
        parts = [("all ranks", 0, res.world, *split_blocks(w))]
    out = []
    for label, first, count, e, ls, h in parts:
        pc = Piece(e, ls, h, None, None)
        params = sum(b.params for b in pc.blocks)
        local = params / res.shard
        over = res.dims.ep * res.dims.efsdp  # the ranks each MoE layer's experts are split over (etp 1: x tp)
        if res.ep > 1 and over != res.shard:
            experts = sum(b.moe.experts * b.moe.expert_params for b in pc.blocks if b.moe is not None)
            local = (params - experts) / res.shard + experts / over
        out.append((RankClass(label, first, count, float(params), local, pc.units), pc.blocks))
    return out


def compute_op(p: Plan, rc: int, name: str, deps: list[Dep], dur: float, phase: str) -> int:
    """A compute op of `dur` seconds on the compute stream of rank class `rc`."""
    return p.add(rc, "compute", "compute", name, deps, duration=dur, phase=phase)


def block_op(p: Plan, rc: int, name: str, deps: list[Dep], dur: float, phase: str, b: Block, mb: int, tag: str) -> Dep:
    """The compute op of block `b`'s pass `phase` (a layer's ops with context parallelism,
    `Plan.cp`; an MoE layer's with expert parallelism, `Plan.ep`), and its tensor-parallel
    collectives where the plan has them (`Plan.tp`): what the next op waits for."""
    if p.tp is not None:  # asyncTP's fused pairs in place of their GEMMs (`TensorParallel.extra_s`)
        dur = max(0.0, dur + p.tp.extra_s(rc, b, mb, phase))
    if p.cp is not None and b.kind == "layer":
        op = p.cp.run(p, rc, name, deps, dur, phase, b, mb)
    elif p.ep is not None and b.moe is not None:
        op = p.ep.run(p, rc, name, deps, dur, phase, b, mb)
    else:
        op = compute_op(p, rc, name, deps, dur, phase)
    return op if p.tp is None else p.tp.after(p, rc, b, mb, phase, op, tag)


def blocks_through(
    p: Plan, rc: int, name: str, after: Dep, blocks: list[Block], durations: list[float], phase: str, mb: int, tag: str
) -> Dep:
    """Blocks that run back to back: one op (`run_through`), or, with tensor, context or expert
    parallelism, each block's op and its collectives."""
    if p.tp is None and p.cp is None and p.ep is None:
        return run_through(p, rc, name, after, durations, phase)
    prev = after
    for b, dur in zip(blocks, durations, strict=True):
        prev = block_op(p, rc, f"{name[0]} {b.name}{tag}", [prev], dur, phase, b, mb, tag)
    return prev


def run_through(p: Plan, rc: int, name: str, after: Dep, durations: list[float], phase: str) -> int:
    """Blocks that run back to back on one compute stream, with no op waiting on any but the
    last, as one compute op of their summed duration: exact (a chain of ops on one stream
    ends when its sum has elapsed, with or without shared cores), and it keeps the plans of
    long pipelines small. The trace shows one span per microbatch's pass instead of one per block."""
    return compute_op(p, rc, f"{name} ({len(durations)} blocks)", [after], sum(durations), phase)


def optimizer_step(p: Plan, rc: int, cm: ComputeModel, pc: Piece, model_params: float, deps: list[Dep]) -> int:
    """Adam over the parameters rank class `rc` owns. When its piece is sharded (FSDP2's
    DTensors), its share of the model's parameters times the measured sharded overhead is
    added (an approximation: the overhead goes with the number of parameter tensors, taken
    here as with their size)."""
    rcl = p.classes[rc]
    share = rcl.params / model_params if pc.shard is not None else 0.0
    tensors = sum(b.param_tensors for b in (*pc.embed, *pc.layers, *pc.head))
    dur = cm.optimizer(rcl.local_params, tensors) + share * cm.sharded_optimizer_overhead()
    return p.add(rc, "compute", "optimizer", "optimizer step", deps, duration=dur, phase="opt")


def data_parallel_plan(
    p: Plan,
    cm: ComputeModel,
    cfg: RunConfig,
    res: Resolved,
    w: Workload,
    piece: Piece,
    forward: Callable[..., Dep],
    backward: Callable[..., tuple[Dep, list[int | None]]],
    step: Callable[..., Dep] | None = None,
) -> None:
    """One rank class of every rank running the whole model: `cfg.grad_accum` micro-steps of
    `forward` and `backward` (gradients synced on the last), then the optimizer step (`step`, of
    `optimizer_step`'s arguments; None: `optimizer_step`)."""
    p.classes.append(rank_classes(res, w, pipeline=False)[0][0])
    prev: Dep = None
    syncs: list[int | None] = []
    K = cfg.grad_accum
    for k in range(K):
        tag = f" [{k}]" if K > 1 else ""
        prev = forward(p, 0, cm, cfg, res.microbatch_size, piece, prev, tag)
        prev, s = backward(p, 0, cm, cfg, res.microbatch_size, piece, prev, sync=(k == K - 1), tag=tag)
        syncs += s
    (step or optimizer_step)(p, 0, cm, piece, w.params, [prev, *syncs])


_shape = attrgetter(*(f.name for f in fields(Block) if f.name != "name"))  # a block's every figure but its name


@dataclass
class BlockTimes:
    """A ComputeModel whose block times are computed once per (block, batch): a plan asks for
    every block once per microbatch; with the configuration's checkpointing, what each block's
    backward recomputes."""

    cm: ComputeModel
    ckpt: Checkpointing = field(default_factory=lambda: Checkpointing(frozenset()))
    _memo: dict[tuple[object, int], BlockCost] = field(default_factory=dict)

    def recompute_s(self, b: Block, batch: int) -> float:
        """Seconds of forward that backward of `b` runs again (activation checkpointing)."""
        return self.ckpt.recompute_s(b, self.block(b, batch))

    def block(self, b: Block, batch: int) -> BlockCost:
        # the same for blocks of one shape (a model's layers) unless the cost goes by name; else
        # per block (the workload keeps its blocks alive while the plan is built)
        key = (id(b) if self.cm.by_name else _shape(b), batch)
        cost = self._memo.get(key)
        if cost is None:
            cost = self._memo[key] = self.cm.block(b, batch)
        return cost

    @property
    def mem_bytes_per_s(self) -> float:
        return self.cm.mem_bytes_per_s

    def gathered_bytes(self, b: Block, param_bytes: int) -> float:
        return self.cm.gathered_bytes(b, param_bytes)

    def optimizer(self, local_params: float, tensors: int = 0) -> float:
        return self.cm.optimizer(local_params, tensors)

    def sharded_optimizer_overhead(self) -> float:
        return self.cm.sharded_optimizer_overhead()
