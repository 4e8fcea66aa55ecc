"""Pipeline parallelism (torch.distributed.pipelining): stage-major ranks (stage s = ranks
[s·R, (s+1)·R)), consecutive layers per stage (`stage_ranges`), GPipe or 1F1B order of
microbatches (`schedule_order`), activations and gradients sent point to point (isend, waited
on where the schedule waits: `send_waits`; with a rendezvous backend a send starts only once
the receiving stage posts its recv, right after its previous op, and a small one frees its
sender then: `RENDEZVOUS_BACKENDS`, `BUFFERED_SEND_BYTES`).

The R replicas of a stage run DDP, or FSDP2 when sharded (degree d > 1). DDP stages all-reduce
their buckets during the last microbatch's backward, which returns (and sends its input
gradient) only once they are done. A sharded stage runs every microbatch backward with
set_reshard_after_backward(False) and set_requires_gradient_sync(False): a unit all-gathers
only when it is sharded (`Residency`), stays unsharded after backward, and reduce-scatters once
per schedule step in perform_reduce_grad (+ the replica all-reduce at the accumulation boundary).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan, _ids, _join, moves
from shardsim.simulator.strategies.ddp import GRAD_BYTES, ddp_backward, ddp_forward
from shardsim.simulator.strategies.expert_parallel import dense_part, ep_groups
from shardsim.simulator.strategies.fsdp import FsdpPiece, Residency, fsdp_backward, fsdp_forward, fsdp_reduce_grad
from shardsim.simulator.strategies.mesh import StageMesh, pipeline_ends, stage_mesh
from shardsim.simulator.strategies.steps import (
    Piece,
    ends_apart,
    optimizer_step,
    rank_classes,
    stage_blocks,
    tied_shard,
)
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.parallel_dims import DATA
from shardsim.specs.schedules import stage_rank

# Point-to-point sends whose bytes move only once the receiver has posted its recv (gloo's TCP
# transport is a rendezvous), so a GPipe stage that runs ahead does not receive ahead: a stage
# posts its recv right before the op that needs it. NCCL is left as eager (its sends fill the
# receiver's preallocated buffers): an assumption. Readings: experiments/readings/gloo-p2p.md.
RENDEZVOUS_BACKENDS = frozenset({"gloo"})
# A gloo isend the kernel's socket buffers take whole ends for its sender at the rendezvous; a
# bigger one when its bytes are delivered (an approximation; readings: experiments/readings/gloo-p2p.md).
BUFFERED_SEND_BYTES = 512 * 1024


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


def activation_send(m: StageMesh, blocks: list[Block], mb: int, ebytes: int) -> tuple[GroupLayout, float]:
    """(layout, bytes) of the send of stage `m`'s output to the next stage, each of its ranks to
    its peer; `blocks` the stage's, `mb` the micro-batch, `ebytes` per element."""
    return m.sends(), blocks[-1].out_elems * mb * ebytes


def gradient_send(m: StageMesh, blocks: list[Block], mb: int, ebytes: int) -> tuple[GroupLayout, float]:
    """(layout, bytes) of the send of stage `m`'s input gradient back to the previous stage
    (nothing from a stage without layers)."""
    nbytes = blocks[0].in_elems * mb * ebytes if any(b.kind == "layer" for b in blocks) else 0.0
    return m.sends(backward=True), nbytes


def stage_pieces(res: Resolved, w: Workload) -> list[Piece]:
    """One piece per stage (pp x stages_per_rank of them), on its rank's mesh. A sharded stage
    (FSDP2 over its replicas) keeps units unsharded after backward (pipelining's
    set_reshard_after_backward(False)); with expert parallelism its layers' units hold all but
    their experts, sharded over dp_shard x ep (`expert_parallel`)."""
    d = res.shard
    pieces: list[Piece] = []
    for s, blocks in enumerate(stage_blocks(res, w)):
        r = stage_rank(res.schedule, res.pp, s)
        m = stage_mesh(res, r)
        if d > 1:
            replica = m.groups("dp_replicate") if res.replicas > 1 else None
            residency = Residency(reshard_after_backward=False)
            shard = m.groups("dp_shard")
            if res.ep > 1:
                g = ep_groups(res.dims, r)
                shard, replica = g.dense, g.replica
                blocks = (blocks[0], [dense_part(b) for b in blocks[1]], blocks[2])
            pc: Piece = FsdpPiece(*blocks, shard, replica, residency)
        else:
            pc = Piece(*blocks, None, m.groups(*DATA) if m.dp > 1 else None)
        pieces.append(pc)
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
        P, K, M, mb = res.pp, cfg.grad_accum, res.microbatches, res.microbatch_size
        tag = f" s{s} m{m}" + (f" [{k}]" if K > 1 else "")
        ebytes = DTYPE_BYTES[cfg.precision]
        if kind == "F":
            forward = fsdp_forward if isinstance(pc, FsdpPiece) else ddp_forward
            out = forward(p, s, self.cm, cfg, mb, pc, start, tag)
            if s == P - 1:
                return out, NO_SEND
            lay, nbytes = activation_send(stage_mesh(res, s), pc.blocks, mb, ebytes)
            return out, self._isend(s, "p2p_fwd", lay, nbytes, f"act{tag}", out, s + 1)
        # DDP syncs in the last microbatch's backward (last_backward) of the accumulation boundary;
        # FSDP2 never reduces in a microbatch backward (set_requires_gradient_sync(False))
        last = m == M - 1 and k == K - 1
        if isinstance(pc, FsdpPiece):
            op, syncs = fsdp_backward(p, s, self.cm, cfg, mb, pc, start, sync=last, tag=tag, reduce=False)
        else:
            op, syncs = ddp_backward(p, s, self.cm, cfg, mb, pc, start, sync=last, tag=tag)
        self.syncs[s] += syncs
        # DDP's backward() returns only once its buckets are all-reduced (the reducer's
        # finalize_backward waits for them; on a GPU its stream does), so this stage's
        # input-gradient send and its next op come after its gradient sync: the stages'
        # syncs run one after another, each behind the previous stage's last backward
        out = _join(op, *syncs)
        if s == 0:
            return out, NO_SEND
        lay, nbytes = gradient_send(stage_mesh(res, s), pc.blocks, mb, ebytes)
        return out, self._isend(s, "p2p_bwd", lay, nbytes, f"grad{tag}", out, s - 1)

    def _isend(self, s: int, stream: str, lay: GroupLayout, nbytes: float, what: str, after: Dep, peer: int) -> Isend:
        """The isend of `what` to stage `peer` once op `after` is done (`isend_op`)."""
        return isend_op(self.p, self.rendezvous, s, stream, lay, nbytes, what, after, peer)

    def _reduce_grad(self, s: int, run: _StageRun, k: int) -> None:
        """The end of a stage's schedule step: wait for its isends, then perform_reduce_grad
        (of a sharded stage); the next step's compute waits for the reductions (FSDP2's
        finalize_backward)."""
        K, pc = self.cfg.grad_accum, self.pieces[s]
        end = _join(self.prev[s], *run.sends)
        tag = f" s{s}" + (f" [{k}]" if K > 1 else "")
        rg: list[int | None] = []
        if isinstance(pc, FsdpPiece):
            rg = fsdp_reduce_grad(self.p, s, self.cfg, pc, end, sync=k == K - 1, tag=tag)
        self.syncs[s] += rg
        self.prev[s] = _join(end, *rg)


def isend_op(
    p: Plan, rendezvous: bool, s: int, stream: str, lay: GroupLayout, nbytes: float, what: str, after: Dep, peer: int
) -> Isend:
    """The isend of `what` from rank class `s` to `peer` once op `after` is done. With a
    rendezvous backend, a zero-length "post" op comes first (the recv's posting is added to its
    dependencies when the receiver's schedule gets there), and the sender's wait ends at the
    rendezvous when the message fits the sockets' buffers. Such sends run in order per peer
    only (their stream's lane): gloo's TCP transport holds a send whose recv is not posted yet
    in the pending sends of the pair (one connection per peer) it goes to
    (gloo/transport/tcp/pair.cc, `Pair::send`: `localPendingSend_`), and pipelining issues each
    isend on its own (its `_batch_p2p` does not coalesce sends), so a send held by one peer does
    not hold a later one to another (a V-shaped schedule's rank sends activations, and
    gradients, to both its neighbours). Eager (NCCL) sends run in order per direction: an
    approximation (pipelining's uncoalesced isends to different peers can run on separate NCCL
    streams), which costs an eager send at most the transfers queued before it, never a wait
    for a receiver."""
    if not rendezvous:
        op = _send(p, s, stream, lay, nbytes, f"send {what}", after, peer)
        return Isend(None, op, op)
    if not moves(lay, nbytes):
        return NO_SEND  # no op to post either
    post = p.add(s, f"{stream}_post", "compute", f"post {what}", [after], duration=0.0, phase="p2p", lane=peer)
    op = _send(p, s, stream, lay, nbytes, f"send {what}", post, peer, lane=peer)
    return Isend(post, post if nbytes <= BUFFERED_SEND_BYTES else op, op)


def _send(
    p: Plan,
    rc: int,
    stream: str,
    lay: GroupLayout,
    nbytes: float,
    name: str,
    after: Dep,
    peer: int,
    lane: int | None = None,
) -> int | None:
    """A point-to-point isend to rank class `peer` (None when there is nothing to send), in
    order with the earlier ones on `stream` (in `lane`, when given)."""
    op = p.comm(rc, stream, "send_recv", lay, nbytes, name, [after], "p2p", lane)
    if op is not None:
        p.ops[op].peer = peer
    return op


def pipeline_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategy pipeline, one stage a rank: one rank class per stage, `cfg.grad_accum` schedule
    steps, then each stage's optimizer step (`run_steps`)."""
    pieces = stage_pieces(res, w)
    p.classes += [rc for rc, _ in rank_classes(res, w, pipeline=True)]
    P = res.pp
    run_steps(p, cm, cfg, res, w, _Pipeline(p, cm, cfg, res, pieces, [None] * P, [[] for _ in range(P)]), pieces)


def run_steps(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload, pipe: Any, owned: list) -> None:
    """`cfg.grad_accum` schedule steps of `pipe` (its `step(k)`, `prev` and `syncs` per rank),
    the tied embedding's all-reduce, then each rank's optimizer step over `owned[rank]`, its piece."""
    for k in range(cfg.grad_accum):
        pipe.step(k)
    tied = tied_embedding_all_reduce(p, res, w, pipe)
    last = stage_rank(res.schedule, res.pp, res.stages - 1)
    for r in range(res.pp):
        ends = tied if r in (0, last) else []
        optimizer_step(p, r, cm, owned[r], w.params, [pipe.prev[r], *pipe.syncs[r], *ends])


def tied_embedding_all_reduce(p: Plan, res: Resolved, w: Workload, pipe: Any) -> list[int | None]:
    """Tied embeddings (Megatron-LM's `_allreduce_embedding_grads`, torchtitan's alike): once the
    stages' gradients are synced across their replicas (reduce-scattered, under FSDP2), each rank
    of the first stage and its peer of the last (the same dp / tp coordinates: the embedding
    group) sum their shard of the embedding's fp32 gradient (`tied_shard`: the vocabulary rows
    of its tensor-parallel rank, FSDP2's dim-0 shard of those) in a group of those two ranks,
    before either steps its optimizer. One op on the last stage's class; both stages' steps wait
    for it. None where one rank holds both ends (a V-shaped schedule's rank 0, which holds the
    embedding once: no copy, `ends_apart`)."""
    P, copy = res.pp, tied_shard(w, res.shard)
    if not copy or not ends_apart(res):
        return []
    ends = pipeline_ends(res.dims)  # rank i of stage 0 with rank i of stage P - 1
    deps = [pipe.prev[0], *pipe.syncs[0], pipe.prev[P - 1], *pipe.syncs[P - 1]]
    return [p.comm(P - 1, "ar", "all_reduce", ends, copy * GRAD_BYTES, "AR tied embedding grad", deps, "sync")]
