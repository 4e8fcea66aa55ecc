"""FSDP2 (strategies zero and zero2d, and the sharded stages of a pipeline): fully_shard with
one unit per layer plus the root (embedding + head); ZeRO-2 (reshard_after_forward=False)
keeps each layer gathered from its forward to its backward, which then gathers nothing.
Gradients are reduced in the reduce dtype (MixedPrecisionPolicy.reduce_dtype), parameters
gathered in the param dtype.

Per micro-step: all-gather the root (kept through forward: FSDP2 does not reshard the root
after forward), per layer all-gather → copy-out → forward; in backward all-gather again →
copy-out → backward → reduce-scatter. How far all-gathers run ahead of compute is FSDP2's
(torch 2.x `_fsdp_param_group.py`, no explicit prefetch set): all-gathers run one at a time on
their stream, each issued when the CPU reaches the unit (taken as never the bottleneck), and
- forward (implicit prefetch): `wait_for_unshard` of a unit makes the all-gather streams wait
  for the copy-out of the unit gathered before it, so a unit's all-gather waits for the
  copy-out of the unit FSDP_FORWARD_AG_WAITS_FOR (2) gathers back: while a layer computes, the
  next layer is gathered and the one after may be in flight;
- backward (`_backward_prefetch`, FSDP_BACKWARD_PREFETCH = 1 unit): a unit's pre-backward
  prefetches the next unit in backward order once its own copy-out is done (the last layer's
  is issued when backward starts, by the root's pre-backward).
for ZeRO-2D an all-reduce of the gradient shard across the replica group after each
reduce-scatter, only on the last micro-step (set_requires_all_reduce). FSDP2's own work
(copy-out after an all-gather, copy-in before a reduce-scatter) runs on the compute stream at
`Plan.fsdp`'s cost per parameter. Which units are unsharded is tracked (`Residency`), so that
a pipeline's stages, which keep them unsharded after backward, gather each unit once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.float8 import amax_all_reduce
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.expert_parallel import ExpertParallel, dense_part
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.steps import (
    ROOT,
    Piece,
    block_op,
    blocks_through,
    compute_op,
    data_parallel_plan,
    optimizer_step,
    split_blocks,
)
from shardsim.specs.model.workload import Workload

# FSDP2's prefetch depths (see the module docstring; torch.distributed.fsdp._fully_shard):
FSDP_FORWARD_AG_WAITS_FOR = 2  # forward: a unit's all-gather waits for the copy-out this many gathers back
FSDP_BACKWARD_PREFETCH = 1  # backward: units all-gathered ahead of the one whose backward starts


@dataclass
class Residency:
    """Which FSDP2 units of a rank class are unsharded now (FSDPParamGroup.is_unsharded).

    `unshard` all-gathers only a sharded unit (a no-op otherwise); a block reshards after
    forward (reshard_after_forward=True; False is ZeRO-2: it stays gathered for its backward),
    the root does not. After backward every unit reshards, unless pipelining set
    set_reshard_after_backward(False): then units stay unsharded until perform_reduce_grad."""

    reshard_after_backward: bool = True
    reshard_after_forward: bool = True
    unsharded: set[str] = field(default_factory=set)

    def unshard(self, unit: str) -> bool:
        """FSDPParamGroup.unshard: True when it issues an all-gather."""
        if unit in self.unsharded:
            return False
        self.unsharded.add(unit)
        return True

    def post_forward(self, unit: str) -> None:
        """FSDPParamGroup.post_forward of a block: reshard (even when a backward left it
        unsharded), unless it was sharded with reshard_after_forward=False."""
        if self.reshard_after_forward:
            self.unsharded.discard(unit)

    def post_backward(self) -> None:
        """The end of a backward pass: reshard everything unless resharding after backward is off."""
        if self.reshard_after_backward:
            self.unsharded.clear()

    def reshard_all(self) -> None:
        """perform_reduce_grad: post_backward with set_reshard_after_backward(True)."""
        self.unsharded.clear()


@dataclass
class FsdpPiece(Piece):
    """A piece FSDP2 shards over `shard`, with its units' residency."""

    shard: GroupLayout  # FSDP2's shard groups
    residency: Residency = field(default_factory=Residency)


def step_gathers(pc: FsdpPiece, order: Sequence[tuple[str, int]]) -> list[tuple[float, int, int]]:
    """The all-gathers a sharded pipeline stage issues in one schedule step that runs `order`
    (`pipeline.schedule_order`), each as (its parameters, the index in `order` of the pass whose
    op first waits for it, that op's index in the pass: a forward runs embedding, layers, head;
    a backward head, layers last to first, embedding). See `_gathers`."""
    r = pc.residency
    shape = (len(pc.embed), len(pc.layers), len(pc.head), bool(pc.root_params))
    found = _gathers(tuple(order), *shape, r.reshard_after_forward, r.reshard_after_backward)
    return [(pc.root_params if u < 0 else pc.layers[u].params, k, i) for u, k, i in found]


@lru_cache(maxsize=256)
def _gathers(
    order: tuple[tuple[str, int], ...], e: int, n: int, h: int, root: bool, after_forward: bool, after_backward: bool
) -> tuple[tuple[int, int, int], ...]:
    """`step_gathers` of a stage of `e` embedding, `n` layer and `h` head blocks (a root unit
    when `root`), with a unit as its layer's index (-1: the root): the unshards of `fsdp_forward`
    (the root, then each layer, resharding after it) and `fsdp_backward` (each layer, last
    first), on a residency of these flags that starts with every unit sharded
    (perform_reduce_grad reshards them all at the end of a step)."""
    res = Residency(after_backward, after_forward)
    out: list[tuple[int, int, int]] = []
    for k, (kind, _) in enumerate(order):
        if kind == "F":
            if res.unshard(ROOT) and root:  # the embedding's first op waits for it, else the head's
                out.append((-1, k, 0 if e else n))
            for i in range(n):
                if res.unshard(str(i)):
                    out.append((i, k, e + i))
                res.post_forward(str(i))
        else:
            out += [(i, k, h + n - 1 - i) for i in range(n - 1, -1, -1) if res.unshard(str(i))]
            res.post_backward()
    return tuple(out)


def fsdp_forward(
    p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: FsdpPiece, after: Dep, tag: str
) -> Dep:
    """FSDP2 forward of a piece (all-gathers of the units `pc.residency` holds sharded).
    Returns the last compute op."""
    pbytes = DTYPE_BYTES[cfg.precision]  # MixedPrecisionPolicy.param_dtype
    sh, res = pc.shard, pc.residency
    if isinstance(p.ep, ExpertParallel):
        p.ep.enter(res)
    if ROOT in res.unsharded and all(b.name in res.unsharded for b in pc.layers):
        for b in pc.layers:  # nothing to gather: nothing waits between the blocks (see run_through)
            res.post_forward(b.name)
        durs = [cm.block(b, mb).fwd_s for b in pc.blocks]
        return blocks_through(p, rc, f"F{tag}", after, pc.blocks, durs, "fwd", mb, tag)
    ag_root = None
    prev = after
    copied: list[Dep] = []  # per unit gathered in this forward: the op its copy-out ends with
    if res.unshard(ROOT):
        ag_root = p.comm(rc, "ag", "all_gather", sh, pc.root_params * pbytes, f"AG root{tag}", [after], "fwd")
        out = p.fsdp.gather_s_per_param * pc.root_params
        prev = _fsdp_work(p, rc, f"copy-out root{tag}", [ag_root, prev], out, "fwd")
        copied.append(prev)
    for b in pc.embed:
        prev = block_op(p, rc, f"F {b.name}{tag}", [ag_root, prev], cm.block(b, mb).fwd_s, "fwd", b, mb, tag)
    back = FSDP_FORWARD_AG_WAITS_FOR
    for b in pc.layers:
        ag = None
        if res.unshard(b.name):
            gate = copied[-back] if len(copied) >= back else after
            nb = cm.gathered_bytes(b, pbytes)
            ag = p.comm(rc, "ag", "all_gather", sh, nb, f"AG {b.name}{tag}", [gate, ag_root], "fwd")
            out = p.fsdp.gather_s_per_param * b.params
            prev = _fsdp_work(p, rc, f"copy-out {b.name}{tag}", [ag, prev], out, "fwd")
            copied.append(prev)
        prev = block_op(p, rc, f"F {b.name}{tag}", [ag, prev], cm.block(b, mb).fwd_s, "fwd", b, mb, tag)
        res.post_forward(b.name)
    for b in pc.head:
        prev = block_op(p, rc, f"F {b.name}{tag}", [ag_root, prev], cm.block(b, mb).fwd_s, "fwd", b, mb, tag)
    return prev


def _fsdp_work(p: Plan, rc: int, name: str, deps: list[Dep], dur: float, phase: str) -> Dep:
    """FSDP2's own work on the compute stream (Plan.fsdp) as an op of its own, when it costs
    anything; else the last of `deps` (what the next op waits on either way)."""
    if dur > 0:
        return compute_op(p, rc, name, deps, dur, phase)
    return deps[-1]


def fsdp_backward(
    p: Plan,
    rc: int,
    cm: ComputeModel,
    cfg: RunConfig,
    mb: int,
    pc: FsdpPiece,
    after: Dep,
    sync: bool,
    tag: str,
    reduce: bool = True,
) -> tuple[Dep, list[int | None]]:
    """Backward of a piece, with FSDP2's all-gathers (of units `pc.residency` holds sharded)
    and gradient collectives.

    `sync` False skips the all-reduce of gradient shards across replicas
    (set_requires_all_reduce(False)); `reduce` False also skips the reduce-scatter
    (set_requires_gradient_sync(False), as pipelining does in every microbatch backward).
    Returns (last compute op, gradient collective ops)."""
    pbytes, gbytes = DTYPE_BYTES[cfg.precision], DTYPE_BYTES[cfg.grad_dtype]
    sh, rep = pc.shard, pc.replica
    ep = p.ep if isinstance(p.ep, ExpertParallel) else None
    if ep is not None:  # the experts' units of MoE layers (`expert_parallel`)
        ep.enter(pc.residency, reduce, sync)
    prev = after
    for b in pc.head:
        prev = block_op(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd", b, mb, tag)
    # FSDP_BACKWARD_PREFETCH (1): the all-gather of layer i waits for the copy-out of layer
    # i+1 (issued in its pre-backward); the last layer's is issued when backward starts.
    copied: list[Dep] = []  # per layer gathered in this backward: the op its copy-out ends with
    ahead = FSDP_BACKWARD_PREFETCH
    syncs: list[int | None] = []
    for i in range(len(pc.layers) - 1, -1, -1):
        b = pc.layers[i]
        c = cm.block(b, mb)
        dur = c.bwd_s + cm.recompute_s(b, mb)
        agb = None
        if pc.residency.unshard(b.name):
            gate = copied[-ahead] if len(copied) >= ahead else after
            nb = cm.gathered_bytes(b, pbytes)
            agb = p.comm(rc, "ag", "all_gather", sh, nb, f"AG' {b.name}{tag}", [gate], "bwd")
            out = p.fsdp.gather_s_per_param * b.params
            prev = _fsdp_work(p, rc, f"copy-out' {b.name}{tag}", [agb, prev], out, "bwd")
            copied.append(prev)
        if reduce:
            dur += p.fsdp.reduce_s_per_param * b.params  # copy-in before its reduce-scatter
        prev = block_op(p, rc, f"B {b.name}{tag}", [agb, prev], dur, "bwd", b, mb, tag)
        if reduce:
            rs = p.comm(rc, "rs", "reduce_scatter", sh, b.params * gbytes, f"RS {b.name}{tag}", [prev], "sync")
            syncs.append(rs)
            if sync and rep is not None:
                shard_bytes = b.params * gbytes / sh.size
                syncs.append(p.comm(rc, "ar", "all_reduce", rep, shard_bytes, f"AR {b.name}{tag}", [rs, prev], "sync"))
    for b in pc.embed:
        prev = block_op(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd", b, mb, tag)
    if reduce and pc.root_params:
        prev = _fsdp_work(p, rc, f"copy-in root{tag}", [prev], p.fsdp.reduce_s_per_param * pc.root_params, "bwd")
        rs = p.comm(rc, "rs", "reduce_scatter", sh, pc.root_params * gbytes, f"RS root{tag}", [prev], "sync")
        syncs.append(rs)
        if sync and rep is not None:
            nb = pc.root_params * gbytes / sh.size
            syncs.append(p.comm(rc, "ar", "all_reduce", rep, nb, f"AR root{tag}", [rs, prev], "sync"))
    pc.residency.post_backward()
    return prev, syncs + (ep.syncs if ep is not None else [])


def fsdp_reduce_grad(
    p: Plan, rc: int, cfg: RunConfig, pc: FsdpPiece, after: Dep, sync: bool, tag: str
) -> list[int | None]:
    """PipelineStage.perform_reduce_grad: post_backward of every FSDP2 unit in FSDPState
    order (root, then the blocks): reduce-scatter of its accumulated unsharded gradient,
    with `sync` the all-reduce of the shard across replicas; then every unit reshards.
    Returns the gradient collective ops. With expert parallelism each MoE layer's experts' unit
    follows its layer's (`ExpertParallel.reduce_grad`)."""
    gbytes = DTYPE_BYTES[cfg.grad_dtype]
    sh, rep = pc.shard, pc.replica
    ep = p.ep if isinstance(p.ep, ExpertParallel) else None
    syncs: list[int | None] = []
    units = [(ROOT, pc.root_params, None)] + [(b.name, b.params, b) for b in pc.layers]
    for name, params, b in units:
        if params <= 0:
            continue
        after = _fsdp_work(p, rc, f"copy-in {name}{tag}", [after], p.fsdp.reduce_s_per_param * params, "sync")
        rs = p.comm(rc, "rs", "reduce_scatter", sh, params * gbytes, f"RS {name}{tag}", [after], "sync")
        syncs.append(rs)
        if sync and rep is not None and rs is not None:
            shard_bytes = params * gbytes / sh.size
            syncs.append(p.comm(rc, "ar", "all_reduce", rep, shard_bytes, f"AR {name}{tag}", [rs], "sync"))
        if ep is not None and b is not None and b.moe is not None:
            after, more = ep.reduce_grad(p, rc, b, after, sync, tag)
            syncs += more
    pc.residency.reshard_all()
    return syncs


def zero_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategies zero and zero2d: every rank runs the whole model, sharded over groups of
    `res.shard` ranks; with several groups (ZeRO-2D) each gradient shard is all-reduced across
    the replica groups. Either as ZeRO-3 or, without resharding after forward, ZeRO-2. With expert
    parallelism (`Plan.ep`) the experts are units of their own (`expert_parallel`)."""
    embed, layers, head = split_blocks(w)
    m = stage_mesh(res)
    replica = m.groups("dp_replicate") if res.replicas > 1 else None
    shard = m.groups("dp_shard")
    if isinstance(p.ep, ExpertParallel):  # the blocks' units without their experts, over dp_shard x ep
        layers = [dense_part(b) for b in layers]
        shard, replica = p.ep.groups(0).dense, p.ep.groups(0).replica
    residency = Residency(reshard_after_forward=cfg.strategy.reshard_after_forward)
    piece = FsdpPiece(embed, layers, head, shard, replica, residency)
    step = amax_all_reduce(w.arch, len(layers), optimizer_step) if cfg.float8_all_gather else None
    data_parallel_plan(p, cm, cfg, res, w, piece, fsdp_forward, fsdp_backward, step)
