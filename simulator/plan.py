"""Strategy plans: the program of ops each rank runs in one training step.

Ranks that run the same program (all ranks of ZeRO/ZeRO-2D/DDP; all replicas of one
pipeline stage) form one *rank class* and are simulated once; a collective op of a class
stands for the call in every group at once, so the network sees the whole world's
traffic. Programs mirror what PyTorch executes:

- FSDP2 (zero, zero2d): one unit per layer plus the root (embedding + head). Per
  micro-step: all-gather the root (kept through forward: FSDP2 does not reshard the
  root after forward), per layer all-gather → forward (the next layer's all-gather is
  issued as soon as the one before it is, at most two gathered layers ahead: implicit
  prefetch), in backward all-gather again (explicit prefetch of the next layer) →
  backward → reduce-scatter; for ZeRO-2D an all-reduce of the gradient shard across the
  replica group after each reduce-scatter, only on the last micro-step
  (set_requires_all_reduce).
- DDP: gradient buckets all-reduced as backward produces them (first bucket 1 MiB, then
  25 MiB, as DistributedDataParallel's defaults), only on the last micro-step (no_sync).
- pipeline: stage-major ranks (stage s = ranks [s·R, (s+1)·R)), consecutive layers per
  stage (`stage_ranges`), GPipe or 1F1B order of microbatches, activations and
  gradients sent point to point; data-parallel sync of each stage after its last
  backward (DDP buckets, or FSDP2 reduce-scatter + all-reduce when the stage is sharded).

Streams: with overlap (NCCL on GPUs, and DDP's asynchronous all-reduce) each class has a
compute stream and one stream per communication kind, ops on one stream run in order;
without overlap (FSDP2 on CPU with gloo) everything runs on one stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from simulator.collectives import GroupLayout
from simulator.compute import DTYPE_BYTES, BlockCost, ComputeModel
from simulator.config import Resolved, RunConfig
from simulator.gcpause import paused_gc
from simulator.workload import Block, Workload, stage_ranges

DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.nn.parallel.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel(bucket_cap_mb=25)
FSDP_PREFETCH_LIMIT = 2  # gathered layers allowed ahead of compute in forward (assumption)


@dataclass(slots=True)
class Op:
    id: int
    rank_class: int
    stream: str
    kind: str  # compute | comm | optimizer
    name: str
    deps: list[int]
    duration: float = 0.0
    coll: str | None = None
    layout: GroupLayout | None = None
    nbytes: float = 0.0
    phase: str = ""  # fwd | bwd | sync | opt | p2p
    peer: int | None = None  # the receiving rank class of a point-to-point send


@dataclass(frozen=True)
class RankClass:
    label: str
    first_rank: int
    count: int
    params: float  # parameters of this class's model piece (unsharded)
    local_params: float  # parameters this rank owns (after sharding)
    units: tuple[tuple[str, float], ...]  # (name, params) of its FSDP units / gathered pieces


@dataclass
class Plan:
    ops: list[Op] = field(default_factory=list)
    classes: list[RankClass] = field(default_factory=list)
    overlap: bool = True
    _last_on_stream: dict[tuple[int, str], int] = field(default_factory=dict)

    def add(self, rc: int, stream: str, kind: str, name: str, deps: list[int | None], **kw) -> int:
        key = (rc, stream if self.overlap else "main")
        d = [x for x in deps if x is not None]
        prev = self._last_on_stream.get(key)
        if prev is not None:
            d.append(prev)
        op = Op(len(self.ops), rc, key[1], kind, name, sorted(set(d)) if len(d) > 1 else d, **kw)
        self.ops.append(op)
        self._last_on_stream[key] = op.id
        return op.id

    def comm(self, rc: int, stream: str, coll: str, layout: GroupLayout, nbytes: float, name: str, deps, phase: str):
        if layout.size < 2 or nbytes <= 0:
            return None
        return self.add(rc, stream, "comm", name, deps, coll=coll, layout=layout, nbytes=nbytes, phase=phase)


def overlaps(cfg: RunConfig) -> bool:
    """Does communication overlap compute? NCCL runs on its own CUDA streams; on CPU with
    gloo FSDP2 has no streams (serialized), DDP's reducer still runs gloo asynchronously."""
    return cfg.backend == "nccl" or cfg.strategy.kind == "ddp"


def _split(w: Workload) -> tuple[list[Block], list[Block], list[Block]]:
    embed = [b for b in w.blocks if b.kind == "embed"]
    layers = [b for b in w.blocks if b.kind == "layer"]
    head = [b for b in w.blocks if b.kind == "head"]
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


def _compute(p: Plan, rc: int, name: str, deps, dur: float, phase: str) -> int:
    return p.add(rc, "compute", "compute", name, deps, duration=dur, phase=phase)


def fsdp_forward(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after, tag: str):
    """FSDP2 forward of a piece. Returns (last compute op, root all-gather op)."""
    pbytes = DTYPE_BYTES[cfg.precision]  # MixedPrecisionPolicy: param_dtype = reduce_dtype
    sh = pc.shard
    ag_root = (
        p.comm(rc, "ag", "all_gather", sh, pc.root_params * pbytes, f"AG root{tag}", [after], "fwd") if sh else None
    )
    prev = after
    for b in pc.embed:
        prev = _compute(p, rc, f"F {b.name}{tag}", [ag_root, prev], cm.block(b, mb).fwd_s, "fwd")
    fwd_ids: list[int] = []
    for i, b in enumerate(pc.layers):
        ag = None
        if sh:
            gate = fwd_ids[i - FSDP_PREFETCH_LIMIT] if i >= FSDP_PREFETCH_LIMIT else after
            ag = p.comm(rc, "ag", "all_gather", sh, b.params * pbytes, f"AG {b.name}{tag}", [gate, ag_root], "fwd")
        prev = _compute(p, rc, f"F {b.name}{tag}", [ag, prev], cm.block(b, mb).fwd_s, "fwd")
        fwd_ids.append(prev)
    for b in pc.head:
        prev = _compute(p, rc, f"F {b.name}{tag}", [ag_root, prev], cm.block(b, mb).fwd_s, "fwd")
    return prev


def fsdp_backward(
    p: Plan,
    rc: int,
    cm: ComputeModel,
    cfg: RunConfig,
    mb: int,
    pc: Piece,
    after,
    sync: bool,
    tag: str,
    reduce: bool = True,
) -> tuple[int, list[int | None]]:
    """Backward of a piece, with FSDP2's all-gathers and gradient collectives when sharded.

    `sync` False skips the all-reduce of gradients (DDP's no_sync; FSDP2's
    set_requires_all_reduce(False)); `reduce` False also skips FSDP2's reduce-scatter
    (set_requires_gradient_sync(False), as pipelining does before the last microbatch).
    Returns (last compute op, gradient collective ops)."""
    pbytes = DTYPE_BYTES[cfg.precision]
    sh, rep = pc.shard, pc.replica
    fsdp = sh is not None
    prev = after
    for b in pc.head:
        prev = _compute(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd")
    # the all-gather of layer i is issued when backward of layer i+1 starts (FSDP2's
    # explicit backward prefetch of one unit); the last layer's when backward starts.
    L = len(pc.layers)
    pre: dict[int, int] = {L - 1: prev}  # the compute op just before B(i)
    syncs: list[int | None] = []
    bucket = 0.0
    bucket_cap = DDP_FIRST_BUCKET_BYTES
    gbytes = pbytes if fsdp else 4  # DDP keeps fp32 gradients under autocast

    def ddp_bucket(nbytes: float, last_op: int, force: bool) -> None:
        nonlocal bucket, bucket_cap
        bucket += nbytes
        if bucket >= bucket_cap or (force and bucket > 0):
            syncs.append(p.comm(rc, "ar", "all_reduce", rep, bucket, f"AR bucket{tag}", [last_op], "sync"))
            bucket, bucket_cap = 0.0, DDP_BUCKET_BYTES

    if not fsdp and sync and rep is not None:
        for b in pc.head:
            ddp_bucket(b.params * gbytes, prev, False)
    for i in range(L - 1, -1, -1):
        b = pc.layers[i]
        c = cm.block(b, mb)
        agb = None
        if fsdp:
            gate = after if i == L - 1 else pre[i + 1]
            agb = p.comm(rc, "ag", "all_gather", sh, b.params * pbytes, f"AG' {b.name}{tag}", [gate], "bwd")
        dur = c.bwd_s + (c.fwd_s if cfg.checkpointing else 0.0)
        prev = _compute(p, rc, f"B {b.name}{tag}", [agb, prev], dur, "bwd")
        pre[i - 1] = prev
        if fsdp and reduce:
            rs = p.comm(rc, "rs", "reduce_scatter", sh, b.params * pbytes, f"RS {b.name}{tag}", [prev], "sync")
            syncs.append(rs)
            if sync and rep is not None:
                shard_bytes = b.params * pbytes / sh.size
                syncs.append(p.comm(rc, "ar", "all_reduce", rep, shard_bytes, f"AR {b.name}{tag}", [rs, prev], "sync"))
        elif sync and rep is not None:
            ddp_bucket(b.params * gbytes, prev, False)
    for b in pc.embed:
        prev = _compute(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd")
    if fsdp and reduce and pc.root_params:
        rs = p.comm(rc, "rs", "reduce_scatter", sh, pc.root_params * pbytes, f"RS root{tag}", [prev], "sync")
        syncs.append(rs)
        if sync and rep is not None:
            nb = pc.root_params * pbytes / sh.size
            syncs.append(p.comm(rc, "ar", "all_reduce", rep, nb, f"AR root{tag}", [rs, prev], "sync"))
    elif not fsdp and sync and rep is not None:
        for b in pc.embed:
            ddp_bucket(b.params * gbytes, prev, False)
        ddp_bucket(0.0, prev, True)
    return prev, syncs


def _optimizer(p: Plan, rc: int, cm: ComputeModel, local_params: float, deps) -> int:
    return p.add(rc, "compute", "optimizer", "optimizer step", deps, duration=cm.optimizer(local_params), phase="opt")


def _data_parallel_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    embed, layers, head = _split(w)
    world, d = res.world, res.shard
    if cfg.strategy.kind == "ddp":
        piece = Piece(embed, layers, head, None, GroupLayout(0, world, world))
    else:
        replica = GroupLayout(0, world, world // d, strided=True) if world > d else None
        piece = Piece(embed, layers, head, GroupLayout(0, world, d), replica)
    units = tuple((b.name, float(b.params)) for b in layers)
    if piece.root_params:
        units = (("root", float(piece.root_params)),) + units
    p.classes.append(RankClass("all ranks", 0, world, float(w.params), w.params / d, units))
    prev = None
    syncs: list[int | None] = []
    K = cfg.grad_accum
    for k in range(K):
        tag = f" [{k}]" if K > 1 else ""
        prev = fsdp_forward(p, 0, cm, cfg, res.microbatch_size, piece, prev, tag)
        prev, s = fsdp_backward(p, 0, cm, cfg, res.microbatch_size, piece, prev, sync=(k == K - 1), tag=tag)
        syncs += s
    _optimizer(p, 0, cm, w.params / d, [prev, *syncs])


def schedule_order(kind: str, stage: int, pp: int, m: int) -> list[tuple[str, int]]:
    """Order of forward/backward microbatches on one stage (ScheduleGPipe / Schedule1F1B)."""
    if kind == "gpipe":
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warm = min(pp - stage - 1, m)
    order = [("F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [("F", warm + i), ("B", i)]
    order += [("B", i) for i in range(m - warm, m)]
    return order


def _pipeline_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    embed, layers, head = _split(w)
    P, R, d, M = res.pp, res.world // res.pp, res.shard, res.microbatches
    ebytes = DTYPE_BYTES[cfg.precision]
    pieces: list[Piece] = []
    for s, (a, b) in enumerate(stage_ranges(len(layers), P)):
        shard = GroupLayout(s * R, R, d) if d > 1 else None
        if d > 1:
            replica = GroupLayout(s * R, R, R // d, strided=True) if R > d else None
        else:
            replica = GroupLayout(s * R, R, R) if R > 1 else None
        pc = Piece(embed if s == 0 else [], layers[a:b], head if s == P - 1 else [], shard, replica)
        pieces.append(pc)
        params = sum(x.params for x in pc.blocks)
        units = tuple((x.name, float(x.params)) for x in pc.layers)
        if pc.root_params:
            units = (("root", float(pc.root_params)),) + units
        p.classes.append(RankClass(f"stage {s}", s * R, R, float(params), params / d, units))
    mb = res.microbatch_size
    K = cfg.grad_accum
    last_ops: dict[int, list[int | None]] = {s: [] for s in range(P)}
    prev_step: dict[int, int | None] = {s: None for s in range(P)}
    for k in range(K):
        # events: forward output of (s, m) sent to s+1; gradient of (s, m) sent to s-1
        fwd_send: dict[tuple[int, int], int | None] = {}
        bwd_send: dict[tuple[int, int], int | None] = {}
        fwd_done: dict[tuple[int, int], int] = {}
        orders = {s: schedule_order(cfg.strategy.schedule, s, P, M) for s in range(P)}
        cursor = {s: 0 for s in range(P)}
        prev = dict(prev_step)
        # emit ops in a global order that respects cross-stage dependencies
        remaining = sum(len(o) for o in orders.values())
        while remaining:
            progressed = False
            for s in range(P):
                while cursor[s] < len(orders[s]):
                    kind, m = orders[s][cursor[s]]
                    tag = f" s{s} m{m}" + (f" [{k}]" if K > 1 else "")
                    if kind == "F":
                        if s > 0 and (s - 1, m) not in fwd_send:
                            break
                        dep = fwd_send.get((s - 1, m)) if s > 0 else None
                        out = fsdp_forward(p, s, cm, cfg, mb, pieces[s], _join(p, s, prev[s], dep), tag)
                        fwd_done[(s, m)] = out
                        prev[s] = out
                        if s < P - 1:
                            nbytes = pieces[s].blocks[-1].out_elems * mb * ebytes
                            lay = GroupLayout(s * R, 2 * R, 2, strided=True)
                            fwd_send[(s, m)] = p.comm(
                                s, "p2p_fwd", "send_recv", lay, nbytes, f"send act{tag}", [out], "p2p"
                            )
                            if fwd_send[(s, m)] is not None:
                                p.ops[fwd_send[(s, m)]].peer = s + 1
                    else:
                        if s < P - 1 and (s + 1, m) not in bwd_send:
                            break
                        dep = bwd_send.get((s + 1, m)) if s < P - 1 else fwd_done[(s, m)]
                        last_mb = m == M - 1
                        out, syncs = fsdp_backward(
                            p,
                            s,
                            cm,
                            cfg,
                            mb,
                            pieces[s],
                            _join(p, s, prev[s], dep),
                            sync=last_mb and k == K - 1,
                            tag=tag,
                            reduce=last_mb,
                        )
                        last_ops[s] += syncs
                        prev[s] = out
                        if s > 0:
                            nbytes = pieces[s].blocks[0].in_elems * mb * ebytes if pieces[s].layers else 0.0
                            lay = GroupLayout((s - 1) * R, 2 * R, 2, strided=True, reverse=True)
                            bwd_send[(s, m)] = p.comm(
                                s, "p2p_bwd", "send_recv", lay, nbytes, f"send grad{tag}", [out], "p2p"
                            )
                            if bwd_send[(s, m)] is not None:
                                p.ops[bwd_send[(s, m)]].peer = s - 1
                    cursor[s] += 1
                    remaining -= 1
                    progressed = True
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked (a bug in schedule_order)")
        prev_step = prev
    for s in range(P):
        _optimizer(p, s, cm, p.classes[s].local_params, [prev_step[s], *last_ops[s]])


def _join(p: Plan, rc: int, a: int | None, b: int | None) -> int | None:
    """A zero-length compute op that waits for both (keeps the compute stream in order)."""
    if b is None:
        return a
    return p.add(rc, "compute", "compute", "wait", [a, b], duration=0.0, phase="wait")


@dataclass
class _BlockTimes:
    """A ComputeModel whose block times are computed once per (block, batch): a plan asks for
    every block once per microbatch."""

    cm: ComputeModel
    _memo: dict[tuple[int, int], BlockCost] = field(default_factory=dict)

    def block(self, b: Block, batch: int) -> BlockCost:
        key = (id(b), batch)  # the workload keeps its blocks alive while the plan is built
        if key not in self._memo:
            self._memo[key] = self.cm.block(b, batch)
        return self._memo[key]

    def optimizer(self, local_params: float) -> float:
        return self.cm.optimizer(local_params)


def build_plan(cfg: RunConfig, res: Resolved, w: Workload, cm: ComputeModel) -> Plan:
    p = Plan(overlap=overlaps(cfg))
    cm = _BlockTimes(cm)  # type: ignore[assignment]
    with paused_gc():
        if cfg.strategy.kind == "pipeline":
            _pipeline_plan(p, cm, cfg, res, w)
        else:
            _data_parallel_plan(p, cm, cfg, res, w)
    return p
