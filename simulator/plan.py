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
  gradients sent point to point (isend, waited on where the schedule waits: `send_waits`;
  with gloo a send starts only once the receiving stage posts its recv, right after its
  previous op, and a small one frees its sender then: `RENDEZVOUS_BACKENDS`);
  DDP stages all-reduce their buckets during the last microbatch's backward, which returns
  (and sends its input gradient) only once they are done. A sharded
  stage runs every microbatch backward with set_reshard_after_backward(False) and
  set_requires_gradient_sync(False): a unit all-gathers only when it is sharded
  (`Residency`), stays unsharded after backward, and reduce-scatters once per schedule
  step in perform_reduce_grad (+ the replica all-reduce at the accumulation boundary).

Streams: with overlap (NCCL on GPUs, and DDP's asynchronous all-reduce, also in the stages
of a pipeline) each class has a compute stream and one stream per communication kind, ops on
one stream run in order; without overlap (FSDP2 on CPU with gloo) everything runs on one
stream except the pipeline's point-to-point sends (isend is asynchronous on gloo too).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from shardsim.simulator.compute import DTYPE_BYTES, BlockCost, ComputeModel, FsdpCpu
from shardsim.simulator.config import Resolved, RunConfig
from shardsim.simulator.gcpause import paused_gc
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.workload.model import Block, Workload, stage_ranges

DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.nn.parallel.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel(bucket_cap_mb=25)
FSDP_PREFETCH_LIMIT = 2  # gathered layers allowed ahead of compute in forward (assumption)
ASYNC_STREAMS = frozenset({"p2p_fwd", "p2p_bwd", "p2p_fwd_post", "p2p_bwd_post"})  # own streams even
# without overlap: pipelining's isends (and their posting, with a rendezvous backend)
ROOT = "root"
# Point-to-point sends whose bytes move only once the receiver has posted its recv. gloo's
# TCP transport is a rendezvous: measured in emu-2x2 (2026-11-22), a 64 KiB or 512 KiB isend
# whose recv is posted 0.3 s late completes 0.30 s after it was posted, and the recv then
# still takes the whole transfer (2.2 ms, 23 ms at 23 MB/s). A pipeline stage posts its recv
# right before the op that needs it, so a GPipe stage that runs ahead does not receive ahead.
# NCCL is left as eager (its sends fill the receiver's preallocated buffers): an assumption.
RENDEZVOUS_BACKENDS = frozenset({"gloo"})
# A gloo isend the kernel's socket buffers take whole ends for its sender at the rendezvous;
# a bigger one when its bytes are delivered (an approximation: measured in emu-2x2, a 512 KiB
# isend whose recv was posted ended 1 ms later, its delivery 22 ms later; a 2 MiB and an 8 MiB
# one ended 35 and 52 ms before their delivery, about 0.8-1.2 MB still in flight).
BUFFERED_SEND_BYTES = 512 * 1024
Join = tuple[int, ...]  # ops that an op waits for all of (see `_join`)
Dep = int | Join | None  # what an op waits for: an op, a Join, or nothing


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
    fsdp: FsdpCpu = field(default_factory=FsdpCpu)  # FSDP2's own work per unit parameter
    _last_on_stream: dict[tuple[int, str], int] = field(default_factory=dict)

    def add(self, rc: int, stream: str, kind: str, name: str, deps: list[Dep], **kw) -> int:
        key = (rc, stream if self.overlap or stream in ASYNC_STREAMS else "main")
        d = _ids(deps)
        prev = self._last_on_stream.get(key)
        if prev is not None:
            d.append(prev)
        op = Op(len(self.ops), rc, key[1], kind, name, sorted(set(d)) if len(d) > 1 else d, **kw)
        self.ops.append(op)
        self._last_on_stream[key] = op.id
        return op.id

    def comm(self, rc: int, stream: str, coll: str, layout: GroupLayout, nbytes: float, name: str, deps, phase: str):
        if not moves(layout, nbytes):
            return None
        return self.add(rc, stream, "comm", name, deps, coll=coll, layout=layout, nbytes=nbytes, phase=phase)


def moves(layout: GroupLayout, nbytes: float) -> bool:
    """Does a collective or send over `layout` move anything (a group of one, or no bytes: no op)?"""
    return layout.size >= 2 and nbytes > 0


def overlaps(cfg: RunConfig, res: Resolved) -> bool:
    """Does communication overlap compute? NCCL runs on its own CUDA streams; on CPU with
    gloo FSDP2 has no streams (serialized), DDP's reducer still runs gloo asynchronously,
    also when it wraps the stages of a pipeline whose stages are replicated, not sharded."""
    ddp = cfg.strategy.kind == "ddp" or (cfg.strategy.kind == "pipeline" and res.shard == 1)
    return cfg.backend == "nccl" or ddp


def _split(w: Workload) -> tuple[list[Block], list[Block], list[Block]]:
    embed = [b for b in w.blocks if b.kind == "embed"]
    layers = [b for b in w.blocks if b.kind == "layer"]
    head = [b for b in w.blocks if b.kind == "head"]
    return embed, layers, head


@dataclass
class Residency:
    """Which FSDP2 units of a rank class are unsharded now (FSDPParamGroup.is_unsharded).

    `unshard` all-gathers only a sharded unit (a no-op otherwise); a block reshards after
    forward (reshard_after_forward=True), the root does not. After backward every unit
    reshards, unless pipelining set set_reshard_after_backward(False): then units stay
    unsharded until perform_reduce_grad."""

    reshard_after_backward: bool = True
    unsharded: set[str] = field(default_factory=set)

    def unshard(self, unit: str) -> bool:
        """FSDPParamGroup.unshard: True when it issues an all-gather."""
        if unit in self.unsharded:
            return False
        self.unsharded.add(unit)
        return True

    def post_forward(self, unit: str) -> None:
        """FSDPParamGroup.post_forward of a block: reshard, even when a backward left it unsharded."""
        self.unsharded.discard(unit)

    def post_backward(self) -> None:
        """The end of a backward pass: reshard everything unless resharding after backward is off."""
        if self.reshard_after_backward:
            self.unsharded.clear()

    def reshard_all(self) -> None:
        """perform_reduce_grad: post_backward with set_reshard_after_backward(True)."""
        self.unsharded.clear()


@dataclass
class Piece:
    """The blocks one rank class runs (the whole model, or one pipeline stage), with the
    collectives that gather and sync its parameters."""

    embed: list[Block]
    layers: list[Block]
    head: list[Block]
    shard: GroupLayout | None  # FSDP shard groups; None = replicated (DDP or no data parallel)
    replica: GroupLayout | None  # groups that all-reduce gradients (HSDP / DDP)
    residency: Residency = field(default_factory=Residency)

    @property
    def root_params(self) -> float:
        return sum(b.params for b in self.embed + self.head)

    @property
    def blocks(self) -> list[Block]:
        return self.embed + self.layers + self.head


def _compute(p: Plan, rc: int, name: str, deps, dur: float, phase: str) -> int:
    return p.add(rc, "compute", "compute", name, deps, duration=dur, phase=phase)


def _run_through(p: Plan, rc: int, name: str, after, durations: list[float], phase: str) -> int:
    """Blocks that run back to back on one compute stream, with no op waiting on any but the
    last, as one compute op of their summed duration: exact (a chain of ops on one stream
    ends when its sum has elapsed, with or without shared cores), and it keeps the plans of
    long pipelines small. The trace shows one span per microbatch's pass instead of one per block."""
    return _compute(p, rc, f"{name} ({len(durations)} blocks)", [after], sum(durations), phase)


def fsdp_forward(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after, tag: str):
    """FSDP2 forward of a piece (all-gathers of the units `pc.residency` holds sharded).
    Returns the last compute op."""
    pbytes = DTYPE_BYTES[cfg.precision]  # MixedPrecisionPolicy: param_dtype = reduce_dtype
    sh, res = pc.shard, pc.residency
    gathered = sh is not None and ROOT in res.unsharded and all(b.name in res.unsharded for b in pc.layers)
    if sh is None or gathered:  # nothing to gather: nothing waits between the blocks (see _run_through)
        for b in pc.layers:
            res.post_forward(b.name)
        return _run_through(p, rc, f"F{tag}", after, [cm.block(b, mb).fwd_s for b in pc.blocks], "fwd")
    ag_root = None
    prev = after
    if sh and res.unshard(ROOT):
        ag_root = p.comm(rc, "ag", "all_gather", sh, pc.root_params * pbytes, f"AG root{tag}", [after], "fwd")
        out = p.fsdp.gather_s_per_param * pc.root_params
        prev = _fsdp_work(p, rc, f"copy-out root{tag}", [ag_root, prev], out, "fwd")
    for b in pc.embed:
        prev = _compute(p, rc, f"F {b.name}{tag}", [ag_root, prev], cm.block(b, mb).fwd_s, "fwd")
    fwd_ids: list[int] = []
    for i, b in enumerate(pc.layers):
        ag = None
        own = 0.0
        if sh and res.unshard(b.name):
            gate = fwd_ids[i - FSDP_PREFETCH_LIMIT] if i >= FSDP_PREFETCH_LIMIT else after
            ag = p.comm(rc, "ag", "all_gather", sh, b.params * pbytes, f"AG {b.name}{tag}", [gate, ag_root], "fwd")
            own = p.fsdp.gather_s_per_param * b.params
        prev = _compute(p, rc, f"F {b.name}{tag}", [ag, prev], own + cm.block(b, mb).fwd_s, "fwd")
        res.post_forward(b.name)
        fwd_ids.append(prev)
    for b in pc.head:
        prev = _compute(p, rc, f"F {b.name}{tag}", [ag_root, prev], cm.block(b, mb).fwd_s, "fwd")
    return prev


def _fsdp_work(p: Plan, rc: int, name: str, deps, dur: float, phase: str):
    """FSDP2's own work on the compute stream (Plan.fsdp) as an op of its own, when it costs
    anything; else the last of `deps` (what the next op waits on either way)."""
    if dur > 0:
        return _compute(p, rc, name, deps, dur, phase)
    return deps[-1]


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
    """Backward of a piece, with FSDP2's all-gathers (of units `pc.residency` holds sharded)
    and gradient collectives when sharded.

    `sync` False skips the all-reduce of gradients (DDP's no_sync; FSDP2's
    set_requires_all_reduce(False)); `reduce` False also skips FSDP2's reduce-scatter
    (set_requires_gradient_sync(False), as pipelining does in every microbatch backward).
    Returns (last compute op, gradient collective ops)."""
    pbytes = DTYPE_BYTES[cfg.precision]
    sh, rep = pc.shard, pc.replica
    fsdp = sh is not None
    if not fsdp and not (sync and rep is not None):  # no gradient bucket waits on a block: one op
        durs = [cm.block(b, mb).bwd_s for b in pc.head]
        durs += [cm.block(b, mb).bwd_s + (cm.block(b, mb).fwd_s if cfg.checkpointing else 0.0) for b in pc.layers[::-1]]
        durs += [cm.block(b, mb).bwd_s for b in pc.embed]
        return _run_through(p, rc, f"B{tag}", after, durs, "bwd"), []
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
        dur = c.bwd_s + (c.fwd_s if cfg.checkpointing else 0.0)
        if fsdp and pc.residency.unshard(b.name):
            gate = after if i == L - 1 else pre[i + 1]
            agb = p.comm(rc, "ag", "all_gather", sh, b.params * pbytes, f"AG' {b.name}{tag}", [gate], "bwd")
            dur += p.fsdp.gather_s_per_param * b.params
        if fsdp and reduce:
            dur += p.fsdp.reduce_s_per_param * b.params  # copy-in before its reduce-scatter
        prev = _compute(p, rc, f"B {b.name}{tag}", [agb, prev], dur, "bwd")
        pre[i - 1] = prev
        if fsdp and reduce:
            rs = p.comm(rc, "rs", "reduce_scatter", sh, b.params * pbytes, f"RS {b.name}{tag}", [prev], "sync")
            syncs.append(rs)
            if sync and rep is not None:
                shard_bytes = b.params * pbytes / sh.size
                syncs.append(p.comm(rc, "ar", "all_reduce", rep, shard_bytes, f"AR {b.name}{tag}", [rs, prev], "sync"))
        elif not fsdp and sync and rep is not None:
            ddp_bucket(b.params * gbytes, prev, False)
    for b in pc.embed:
        prev = _compute(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd")
    if fsdp and reduce and pc.root_params:
        prev = _fsdp_work(p, rc, f"copy-in root{tag}", [prev], p.fsdp.reduce_s_per_param * pc.root_params, "bwd")
        rs = p.comm(rc, "rs", "reduce_scatter", sh, pc.root_params * pbytes, f"RS root{tag}", [prev], "sync")
        syncs.append(rs)
        if sync and rep is not None:
            nb = pc.root_params * pbytes / sh.size
            syncs.append(p.comm(rc, "ar", "all_reduce", rep, nb, f"AR root{tag}", [rs, prev], "sync"))
    elif not fsdp and sync and rep is not None:
        for b in pc.embed:
            ddp_bucket(b.params * gbytes, prev, False)
        ddp_bucket(0.0, prev, True)
    pc.residency.post_backward()
    return prev, syncs


def fsdp_reduce_grad(p: Plan, rc: int, cfg: RunConfig, pc: Piece, after: Dep, sync: bool, tag: str):
    """PipelineStage.perform_reduce_grad: post_backward of every FSDP2 unit in FSDPState
    order (root, then the blocks): reduce-scatter of its accumulated unsharded gradient,
    with `sync` the all-reduce of the shard across replicas; then every unit reshards.
    Returns the gradient collective ops."""
    pbytes = DTYPE_BYTES[cfg.precision]
    sh, rep = pc.shard, pc.replica
    syncs: list[int | None] = []
    if sh is None:
        return syncs
    units = [(ROOT, pc.root_params)] + [(b.name, b.params) for b in pc.layers]
    for name, params in units:
        if params <= 0:
            continue
        after = _fsdp_work(p, rc, f"copy-in {name}{tag}", [after], p.fsdp.reduce_s_per_param * params, "sync")
        rs = p.comm(rc, "rs", "reduce_scatter", sh, params * pbytes, f"RS {name}{tag}", [after], "sync")
        syncs.append(rs)
        if sync and rep is not None and rs is not None:
            shard_bytes = params * pbytes / sh.size
            syncs.append(p.comm(rc, "ar", "all_reduce", rep, shard_bytes, f"AR {name}{tag}", [rs], "sync"))
    pc.residency.reshard_all()
    return syncs


def _optimizer(p: Plan, rc: int, cm: ComputeModel, pc: Piece, model_params: float, deps) -> int:
    """Adam over the parameters rank class `rc` owns. When its piece is sharded (FSDP2's
    DTensors), its share of the model's parameters times the measured sharded overhead is
    added (an approximation: the overhead goes with the number of parameter tensors, taken
    here as with their size)."""
    rcl = p.classes[rc]
    share = rcl.params / model_params if pc.shard is not None else 0.0
    dur = cm.optimizer(rcl.local_params) + share * cm.sharded_optimizer_overhead()
    return p.add(rc, "compute", "optimizer", "optimizer step", deps, duration=dur, phase="opt")


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
    _optimizer(p, 0, cm, piece, w.params, [prev, *syncs])


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


def send_waits(kind: str, stage: int, pp: int, m: int) -> list[list[int]]:
    """For each op of `schedule_order`, the earlier ops whose isend it waits for before it
    computes. ScheduleGPipe waits for every forward send before the first backward
    (fwd_sends_to_wait); Schedule1F1B waits for a send after the next op's compute in
    warm-up and cool-down, and in its steady phase fires each send with the next receive
    and waits for both. Every send is waited for before perform_reduce_grad (`_Pipeline`)."""
    n = 2 * m
    if kind == "gpipe":
        return [list(range(m)) if j == m else [] for j in range(n)]
    warm = min(m, pp - stage)  # Schedule1F1B's warmup_chunks
    steady = range(warm, warm + 2 * (m - warm) + 1)  # its 1B1F loop: B0, F, B, ..., F, B
    return [([j - 2] if j >= 2 else []) + ([j - 1] if j in steady else []) for j in range(n)]


def _stage_pieces(p: Plan, res: Resolved, w: Workload) -> list[Piece]:
    """One piece and rank class per stage. A sharded stage (FSDP2 over its replicas) keeps
    units unsharded after backward (pipelining's set_reshard_after_backward(False))."""
    embed, layers, head = _split(w)
    P, R, d = res.pp, res.world // res.pp, res.shard
    pieces: list[Piece] = []
    for s, (a, b) in enumerate(stage_ranges(len(layers), P)):
        shard = GroupLayout(s * R, R, d) if d > 1 else None
        if d > 1:
            replica = GroupLayout(s * R, R, R // d, strided=True) if R > d else None
        else:
            replica = GroupLayout(s * R, R, R) if R > 1 else None
        residency = Residency(reshard_after_backward=False)
        pc = Piece(embed if s == 0 else [], layers[a:b], head if s == P - 1 else [], shard, replica, residency)
        pieces.append(pc)
        params = sum(x.params for x in pc.blocks)
        units = tuple((x.name, float(x.params)) for x in pc.layers)
        if pc.root_params:
            units = ((ROOT, float(pc.root_params)),) + units
        p.classes.append(RankClass(f"stage {s}", s * R, R, float(params), params / d, units))
    return pieces


@dataclass
class _StageRun:
    """One stage's progress through a schedule step: its ops and the isend of each op done."""

    order: list[tuple[str, int]]
    waits: list[list[int]]
    sends: list[int | None] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Isend:
    """A pipeline's point-to-point send: `post`, the op that starts it once both sides have
    posted (rendezvous backends only); `sender_done`, what the sender's waits end with;
    `delivered`, the transfer the receiver's op waits for. None: nothing to wait for."""

    post: int | None
    sender_done: int | None
    delivered: int | None


NO_SEND = Isend(None, None, None)


@dataclass
class _Pipeline:
    """Emits the schedule steps of a pipeline (torch.distributed.pipelining), stage by stage
    in an order that respects the dependencies between stages."""

    p: Plan
    cm: ComputeModel
    cfg: RunConfig
    res: Resolved
    pieces: list[Piece]
    prev: list[Dep]  # what each stage's next op on its compute stream waits for
    syncs: list[list[int | None]]  # each stage's gradient collectives (the optimizer waits for them)

    @property
    def rendezvous(self) -> bool:
        return self.cfg.backend in RENDEZVOUS_BACKENDS

    def step(self, k: int) -> None:
        """Schedule step `k` of the gradient accumulation (one schedule.step call)."""
        P, M, kind = self.res.pp, self.res.microbatches, self.cfg.strategy.schedule
        runs = [_StageRun(schedule_order(kind, s, P, M), send_waits(kind, s, P, M)) for s in range(P)]
        sent: dict[tuple[str, int, int], Isend] = {}  # (F|B, stage, microbatch) -> its isend
        remaining = 2 * M * P
        while remaining:
            progressed = 0
            for s, run in enumerate(runs):
                while len(run.sends) < len(run.order):
                    kind_, m = run.order[len(run.sends)]
                    need = ("F", s - 1, m) if kind_ == "F" else ("B", s + 1, m)
                    if 0 <= need[1] < P and need not in sent:
                        break
                    waits = [run.sends[j] for j in run.waits[len(run.sends)]]
                    got = sent.get(need, NO_SEND)
                    if got.post is not None:
                        # this stage posts the recv once its previous op is done (in the batch it
                        # then waits on, with its own sends): the peer's bytes move from then on
                        self.p.ops[got.post].deps += _ids([self.prev[s]])
                    start = _join(self.prev[s], got.delivered, *waits)
                    self.prev[s], sent[(kind_, s, m)] = self._op(s, kind_, m, start, k)
                    run.sends.append(sent[(kind_, s, m)].sender_done)
                    progressed += 1
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked (a bug in schedule_order)")
            remaining -= progressed
        for s, run in enumerate(runs):
            self._reduce_grad(s, run, k)

    def _op(self, s: int, kind: str, m: int, start: Dep, k: int) -> tuple[Dep, Isend]:
        """F or B of microbatch m on stage s, then the isend of its output (activation to the
        next stage, input gradient to the previous). Returns (what the op's end waits for, the isend)."""
        p, cfg, res, pc = self.p, self.cfg, self.res, self.pieces[s]
        P, R, K, M, mb = res.pp, res.world // res.pp, cfg.grad_accum, res.microbatches, res.microbatch_size
        tag = f" s{s} m{m}" + (f" [{k}]" if K > 1 else "")
        ebytes = DTYPE_BYTES[cfg.precision]
        if kind == "F":
            out = fsdp_forward(p, s, self.cm, cfg, mb, pc, start, tag)
            if s == P - 1:
                return out, NO_SEND
            lay = GroupLayout(s * R, 2 * R, 2, strided=True)
            return out, self._isend(s, "p2p_fwd", lay, pc.blocks[-1].out_elems * mb * ebytes, f"act{tag}", out, s + 1)
        # DDP syncs in the last microbatch's backward (last_backward) of the accumulation boundary;
        # FSDP2 never reduces in a microbatch backward (set_requires_gradient_sync(False))
        last = m == M - 1 and k == K - 1
        op, syncs = fsdp_backward(p, s, self.cm, cfg, mb, pc, start, sync=last, tag=tag, reduce=False)
        self.syncs[s] += syncs
        # DDP's backward() returns only once its buckets are all-reduced (the reducer's
        # finalize_backward waits for them; on a GPU its stream does), so this stage's
        # input-gradient send and its next op come after its gradient sync: the stages'
        # syncs run one after another, each behind the previous stage's last backward
        out = _join(op, *syncs)
        if s == 0:
            return out, NO_SEND
        nbytes = pc.blocks[0].in_elems * mb * ebytes if pc.layers else 0.0
        lay = GroupLayout((s - 1) * R, 2 * R, 2, strided=True, reverse=True)
        return out, self._isend(s, "p2p_bwd", lay, nbytes, f"grad{tag}", out, s - 1)

    def _isend(self, s: int, stream: str, lay: GroupLayout, nbytes: float, what: str, after: Dep, peer: int) -> Isend:
        """The isend of `what` to stage `peer` once op `after` is done. With a rendezvous
        backend, a zero-length "post" op comes first (the recv's posting is added to its
        dependencies when the receiver's schedule gets there), and the sender's wait ends at
        the rendezvous when the message fits the sockets' buffers."""
        if not self.rendezvous:
            op = _send(self.p, s, stream, lay, nbytes, f"send {what}", after, peer)
            return Isend(None, op, op)
        if not moves(lay, nbytes):
            return NO_SEND  # no op to post either
        post = self.p.add(s, f"{stream}_post", "compute", f"post {what}", [after], duration=0.0, phase="p2p")
        op = _send(self.p, s, stream, lay, nbytes, f"send {what}", post, peer)
        return Isend(post, post if nbytes <= BUFFERED_SEND_BYTES else op, op)

    def _reduce_grad(self, s: int, run: _StageRun, k: int) -> None:
        """The end of a stage's schedule step: wait for its isends, then perform_reduce_grad;
        the next step's compute waits for the reductions (FSDP2's finalize_backward)."""
        K = self.cfg.grad_accum
        end = _join(self.prev[s], *run.sends)
        tag = f" s{s}" + (f" [{k}]" if K > 1 else "")
        rg = fsdp_reduce_grad(self.p, s, self.cfg, self.pieces[s], end, sync=k == K - 1, tag=tag)
        self.syncs[s] += rg
        self.prev[s] = _join(end, *rg)


def _send(p: Plan, rc: int, stream: str, lay: GroupLayout, nbytes: float, name: str, after: Dep, peer: int):
    """A point-to-point isend to rank class `peer` (None when there is nothing to send)."""
    op = p.comm(rc, stream, "send_recv", lay, nbytes, name, [after], "p2p")
    if op is not None:
        p.ops[op].peer = peer
    return op


def _pipeline_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    pieces = _stage_pieces(p, res, w)
    P = res.pp
    pipe = _Pipeline(p, cm, cfg, res, pieces, [None] * P, [[] for _ in range(P)])
    for k in range(cfg.grad_accum):
        pipe.step(k)
    for s in range(P):
        _optimizer(p, s, cm, pieces[s], w.params, [pipe.prev[s], *pipe.syncs[s]])


def _join(a: Dep, *others: Dep) -> Dep:
    """`a` and the others, for the next op to wait on: `a` itself when there are no others,
    else a Join of them all. Exact: a zero-length op waiting for them would end when the last
    of them does, which is when the op after it would start; without one, a pipeline's plan
    has a third fewer ops."""
    if all(x is None for x in others):
        return a
    return tuple(dict.fromkeys(_ids((a, *others))))


def _ids(deps: Iterable[Dep]) -> list[int]:
    """The op ids of `deps`, Joins expanded, Nones dropped."""
    out: list[int] = []
    for x in deps:
        if type(x) is int:
            out.append(x)
        elif x is not None:
            out += x
    return out


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

    def sharded_optimizer_overhead(self) -> float:
        return self.cm.sharded_optimizer_overhead()


def build_plan(cfg: RunConfig, res: Resolved, w: Workload, cm: ComputeModel) -> Plan:
    layer_params = sum(b.params for b in w.layers)
    p = Plan(overlap=overlaps(cfg, res), fsdp=cm.fsdp_cpu(w.params, layer_params))
    cm = _BlockTimes(cm)  # type: ignore[assignment]
    with paused_gc():
        if cfg.strategy.kind == "pipeline":
            _pipeline_plan(p, cm, cfg, res, w)
        else:
            _data_parallel_plan(p, cm, cfg, res, w)
    return p
