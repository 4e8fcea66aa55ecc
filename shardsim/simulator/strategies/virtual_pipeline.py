"""Pipelines under PyTorch's multi-stage schedules (PipelineScheduleMulti: interleaved-1f1b,
looped-bfs, interleaved-zb, zbv, dualpipev): each rank holds `stages_per_rank` stages and runs its passes
in `specs.schedules.rank_order`, as `_PipelineScheduleRuntime` does:
- a stage's output goes to the rank of the next stage; where that is the same rank (zbv's
  turn, stage pp - 1 to stage pp) the hand-off is local: no send;
- sends are waited for only at the end of the schedule step (its `send_ops`), a receive right
  before the pass that needs it (`fwd_recv_ops` / `bwd_recv_ops`); with a rendezvous backend
  the bytes move once the receiving rank has posted its recv, taken here as once its previous
  pass is done (the posting of `_add_send_recv` can be earlier: an approximation), and a rank's
  sends wait in order per peer (`pipeline.isend_op`: a V-shaped rank sends to both neighbours);
- zero-bubble schedules split a backward into I (BACKWARD_INPUT) and W (BACKWARD_WEIGHT),
  costed apart (`weight_grad_share`); W runs no tensor-parallel collective;
- each stage's gradients as the single-stage pipeline handles them (`pipeline`): a DDP stage
  syncs in its last backward (B) or weight pass (W), counted per stage (its backward_counter);
  a sharded stage's perform_reduce_grad (REDUCE_GRAD) follows its last B or W on its rank, and
  the next schedule step waits for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.compute import DTYPE_BYTES, BlockCost
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan, _ids, _join
from shardsim.simulator.strategies.ddp import ddp_backward, ddp_forward
from shardsim.simulator.strategies.fsdp import FsdpPiece, fsdp_backward, fsdp_forward, fsdp_reduce_grad
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.pipeline import (
    NO_SEND,
    RENDEZVOUS_BACKENDS,
    Isend,
    activation_send,
    gradient_send,
    isend_op,
    run_steps,
    stage_pieces,
)
from shardsim.simulator.strategies.steps import Piece, rank_classes
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.schedules import Action, rank_order, rank_stages, stage_rank


def virtual_pipeline_plan(p: Plan, cm: Any, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategy pipeline under a multi-stage schedule: one rank class per pipeline rank (its
    stages' blocks), `cfg.grad_accum` schedule steps, then each rank's optimizer step over all
    its stages' parameters."""
    pieces = stage_pieces(res, w)
    p.classes += [rc for rc, _ in rank_classes(res, w, pipeline=True)]
    P = res.pp
    pipe = VirtualPipeline(p, cm, cfg, res, pieces, w.tokens_per_sample, [None] * P, [[] for _ in range(P)])
    held = [[pieces[s] for s in rank_stages(res.schedule, P, res.stages_per_rank, r)] for r in range(P)]
    owned = [
        Piece(*(sum((getattr(pc, f) for pc in h), []) for f in ("embed", "layers", "head")), h[0].shard, None)
        for h in held
    ]
    run_steps(p, cm, cfg, res, w, pipe, owned)


def weight_grad_share(b: Block, tokens: int) -> float:
    """The share of block `b`'s backward that is its weight gradients (W): dW = dYᵀ·X, 2 FLOPs
    per weight per token, against the block's backward FLOPs (Qi et al., "Zero Bubble Pipeline
    Parallelism", arXiv 2401.10241, section 2: W holds the weight GEMMs; B the input-gradient
    GEMMs, attention's core and the element-wise work). The embedding's backward is all W (its
    input, token ids or pixels, takes no gradient). A modelling choice: memory-bound work goes
    to I whole, and W's GEMMs run at the rate of the block's backward. An MoE layer's weights are
    those a token uses (`Block.active_params`: its top-k routed experts, not all of them)."""
    if b.kind == "embed":
        return 1.0
    if b.bwd_flops <= 0:
        return 0.5
    return min(1.0, 2.0 * b.active_params * (b.tokens or tokens) / b.bwd_flops)


@dataclass(frozen=True)
class BackwardPart:
    """A compute model whose blocks' backward is only its I or its W part (`weight_grad_share`):
    what a zero-bubble pass costs. Recomputation (checkpointing) runs before I."""

    cm: Any  # ComputeModel or BlockTimes
    part: str  # "I" or "W"
    tokens: int

    def block(self, b: Block, batch: int) -> BlockCost:
        c = self.cm.block(b, batch)
        share = weight_grad_share(b, self.tokens)
        return replace(c, bwd_s=c.bwd_s * (share if self.part == "W" else 1.0 - share))

    def recompute_s(self, b: Block, batch: int) -> float:
        return self.cm.recompute_s(b, batch) if self.part == "I" else 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.cm, name)


def p2p_layout(res: Resolved, sender: int, receiver: int) -> GroupLayout:
    """Each rank of pipeline rank `sender` paired with its peer of pipeline rank `receiver`:
    neighbours, or the last and the first (a looped schedule's turn from rank pp - 1 to 0)."""
    P = res.pp
    if receiver == sender + 1:
        return stage_mesh(res, sender).sends()
    if receiver == sender - 1:
        return stage_mesh(res, sender).sends(backward=True)
    assert {sender, receiver} == {0, P - 1}, (sender, receiver)
    return GroupLayout(0, res.world, P, strided=True, ends=True, reverse=sender == P - 1)


@dataclass
class VirtualPipeline:
    """Emits the schedule steps of a multi-stage pipeline, rank by rank in an order that
    respects the dependencies between stages. `pieces` one per stage; rank class r is pipeline rank r."""

    p: Plan
    cm: Any
    cfg: RunConfig
    res: Resolved
    pieces: list[Piece]
    tokens: int
    prev: list[Dep]  # what each rank's next op on its compute stream waits for
    syncs: list[list[int | None]]  # each rank's gradient collectives (the optimizer waits for them)
    # (sending stage, its stream) -> the peer, the pairs' layout and the bytes: the same every microbatch
    _sends: dict[tuple[int, str], tuple[int, GroupLayout, float]] = field(default_factory=dict)

    def step(self, k: int) -> None:
        """Schedule step `k` of the gradient accumulation (one schedule.step call)."""
        res = self.res
        P, M, V, S = res.pp, res.microbatches, res.stages_per_rank, res.stages
        orders = [rank_actions(res.schedule, P, M, V, r) for r in range(P)]
        at, sends = [0] * P, [[] for _ in range(P)]
        counted: dict[int, int] = {}  # B or W passes so far, per stage
        sent: dict[tuple[str, int, int], Isend] = {}  # ("F" | "G", stage, microbatch) -> its output's isend
        pending: list[list[int | None]] = [[] for _ in range(P)]  # reductions the next step waits for
        remaining = sum(map(len, orders))
        while remaining:
            progressed = 0
            for r in range(P):
                while at[r] < len(orders[r]):
                    a = orders[r][at[r]]
                    need = _input(a, S)
                    if need is not None and need not in sent:
                        break
                    got = sent.get(need, NO_SEND) if need else NO_SEND
                    if got.post is not None:  # the receiver posts its recv once its previous pass is done
                        self.p.ops[got.post].deps += _ids([self.prev[r]])
                    start = _join(self.prev[r], got.delivered)
                    out, isend = self._op(r, a, start, k, counted)
                    self.prev[r] = out
                    if isend is not None:
                        sent[("F" if a.kind == "F" else "G", a.stage, a.microbatch)] = isend
                        sends[r].append(isend.sender_done)
                    if a.kind in ("B", "W") and counted.get(a.stage) == M:
                        pending[r] += self._reduce_grad(r, a.stage, out, k)
                    at[r] += 1
                    progressed += 1
            if not progressed:
                raise RuntimeError("pipeline schedule deadlocked (a bug in specs.schedules)")
            remaining -= progressed
        for r in range(P):  # the step ends once its sends are waited for and its reductions are done
            self.prev[r] = _join(self.prev[r], *sends[r], *pending[r])

    def _op(self, r: int, a: Action, start: Dep, k: int, counted: dict[int, int]) -> tuple[Dep, Isend | None]:
        """Pass `a` on rank `r`, then the send of its output (None: nothing sent by this pass)."""
        p, cfg, res, pc = self.p, self.cfg, self.res, self.pieces[a.stage]
        K, mb, S = cfg.grad_accum, res.microbatch_size, res.stages
        tag = f" s{a.stage} m{a.microbatch}" + (f" [{k}]" if K > 1 else "")
        fsdp = isinstance(pc, FsdpPiece)
        if a.kind == "F":
            out = (fsdp_forward if fsdp else ddp_forward)(p, r, self.cm, cfg, mb, pc, start, tag)
            if a.stage == S - 1:
                return out, None
            return out, self._send(r, a.stage + 1, "p2p_fwd", activation_send, pc, f"act{tag}", out)
        if a.kind in ("B", "W"):
            counted[a.stage] = counted.get(a.stage, 0) + 1
        last = a.kind in ("B", "W") and counted[a.stage] == res.microbatches and k == K - 1
        cm = self.cm if a.kind == "B" else BackwardPart(self.cm, a.kind, self.tokens)
        # W holds the weight GEMMs only: no input gradient to reduce across tp, and no attention (its
        # backward, with context parallelism's ring rounds and their collectives, is I's)
        tp, cp = p.tp, p.cp
        if a.kind == "W":
            p.tp = p.cp = None
        try:
            if fsdp:
                op, syncs = fsdp_backward(p, r, cm, cfg, mb, pc, start, sync=last, tag=f"{tag} {a.kind}", reduce=False)
            else:
                op, syncs = ddp_backward(p, r, cm, cfg, mb, pc, start, sync=last, tag=f"{tag} {a.kind}")
        finally:
            p.tp, p.cp = tp, cp
        self.syncs[r] += syncs
        out = _join(op, *syncs)  # DDP's backward returns once its buckets are all-reduced (see pipeline._op)
        if a.kind == "W" or a.stage == 0:
            return out, None
        return out, self._send(r, a.stage - 1, "p2p_bwd", gradient_send, pc, f"grad{tag}", out)

    def _send(self, r: int, to_stage: int, stream: str, what: Any, pc: Piece, name: str, after: Dep) -> Isend:
        """The output of a pass on rank `r` to stage `to_stage`: a local hand-off where that
        stage is on `r` too, else an isend to its rank."""
        known = self._sends.get((to_stage, stream))
        if known is None:
            peer = stage_rank(self.res.schedule, self.res.pp, to_stage)
            mb, esize = self.res.microbatch_size, DTYPE_BYTES[self.cfg.precision]
            lay = p2p_layout(self.res, r, peer) if peer != r else None
            nbytes = what(stage_mesh(self.res, r), pc.blocks, mb, esize)[1] if lay is not None else 0.0
            known = self._sends[(to_stage, stream)] = (peer, lay, nbytes)
        peer, lay, nbytes = known
        if lay is None:
            return Isend(None, None, after)  # type: ignore[arg-type]
        return isend_op(self.p, self.cfg.backend in RENDEZVOUS_BACKENDS, r, stream, lay, nbytes, name, after, peer)

    def _reduce_grad(self, r: int, stage: int, after: Dep, k: int) -> list[int | None]:
        """REDUCE_GRAD of a sharded stage after its last B or W (nothing for a DDP stage)."""
        pc = self.pieces[stage]
        if not isinstance(pc, FsdpPiece):
            return []
        tag = f" s{stage}" + (f" [{k}]" if self.cfg.grad_accum > 1 else "")
        rg = fsdp_reduce_grad(self.p, r, self.cfg, pc, after, sync=k == self.cfg.grad_accum - 1, tag=tag)
        self.syncs[r] += rg
        return rg


@lru_cache(maxsize=4096)  # a sweep asks for each many times: every (schedule, pp, microbatches, V, rank) of
# the 405B space is 2,100 orders, 205,740 actions (about 15 MiB)
def rank_actions(schedule: str, pp: int, microbatches: int, v: int, rank: int) -> tuple[Action, ...]:
    """`specs.schedules.rank_order`, kept: what depends only on these."""
    return tuple(rank_order(schedule, pp, microbatches, v, rank))


def held_activations(order: Sequence[Action], saved: dict[int, float]) -> float:
    """The most activation elements (per sample) a rank holds at once in schedule order `order`,
    stage s's forward holding `saved[s]` until its backward (B) is done; a zero-bubble stage's
    until its W, as though I freed none of them (W needs the layers' inputs; what only I needs,
    attention's and the element-wise ops' saves, is freed earlier in PyTorch: an upper bound)."""
    held = peak = 0.0
    for a in order:
        if a.kind == "F":
            held += saved[a.stage]
            peak = max(peak, held)
        elif a.kind in ("B", "W"):
            held -= saved[a.stage]
    return peak


def rank_held_activations(res: Resolved, rank: int, saved: dict[int, float]) -> float:
    """`held_activations` of pipeline rank `rank` under the resolved schedule."""
    return held_activations(rank_actions(res.schedule, res.pp, res.microbatches, res.stages_per_rank, rank), saved)


def _input(a: Action, stages: int) -> tuple[str, int, int] | None:
    """What pass `a` waits for from another stage: a forward the previous stage's output, a
    backward (B or I) the next stage's input gradient; a W nothing (its I ran before it on its rank)."""
    if a.kind == "F":
        return ("F", a.stage - 1, a.microbatch) if a.stage > 0 else None
    if a.kind in ("B", "I"):
        return ("G", a.stage + 1, a.microbatch) if a.stage + 1 < stages else None
    return None
