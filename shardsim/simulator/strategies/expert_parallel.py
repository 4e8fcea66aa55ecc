"""Expert parallelism in the plan, as the runtime runs it (torchtitan's: `runtime.strategies.
expert_parallel`, `runtime.models.moe.ExpertParallel`), composed with FSDP2 (zero, zero2d) and
with a pipeline of FSDP2-sharded stages (torchtitan's ParallelDims: pp outermost, EP inside each
stage's data-parallel ranks).

The mesh (`ParallelDims`: torchtitan's, the experts' (efsdp, ep, etp) over each replica's
degree x tp ranks, tp innermost) of each stage (the world without pipeline): an EP group is `ep`
ranks `etp` apart (consecutive without tensor parallelism, or with etp 1, its tensor-parallel
ranks among them); FSDP2 shards the rest of the model over the degree's ranks (tp apart) and the
experts, a unit of their own per MoE layer, over the efsdp ranks ep x etp apart (the ranks left
after EP); the replicas (zero2d, or a pipeline's replicated stages) across them. With etp 1 each
tensor-parallel rank dispatches a tp-th of the tokens to whole experts, with etp tp all of them
to experts split by tp (the rank's workload: `blocks.from_arch`'s `expert_tp`); the MoE layer's
tensor-parallel collectives are a dense layer's (`tensor_parallel`). The experts' unit follows its
piece's `Residency` as the layer's own unit does: a pipeline's stage gathers it where it gathers
the layer, and reduce-scatters its gradient once per schedule step (`reduce_grad`).

An MoE layer's forward on one rank, per microbatch:
- the layer up to its experts (attention, router, permute, the shared expert) as one op;
- the exchange of the per-expert token counts (all-to-all of `experts` int64), then the dispatch
  all-to-all of the routed rows. The host waits for the counts (``.tolist()``), so the experts'
  FSDP2 all-gather, issued in their pre-forward hook, starts only then: it runs beside the
  dispatch, not earlier (the plan's choice, from the runtime's call order);
- the local experts' grouped GEMMs, at the pace of the busiest EP rank (`ComputeModel.ep`:
  the rank holding the busiest expert, `gpu_kernels.routed_rows`);
- the combine all-to-all (the dispatch transposed), then the un-permute.
Backward mirrors it: un-permute, the combine's reverse (the dispatch's direction), the experts'
backward (after their all-gather when resharded after forward), their gradient reduce-scatter
over the experts' shard group (and all-reduce across replicas on the last micro-step), the
dispatch's reverse, the rest of the layer. A checkpointed layer runs its forward again first,
its all-to-alls included (the runtime re-runs the counts exchange too).
Uneven shares: the busiest EP rank receives `rank_factor` times the mean rank's rows
(`Exchange.busiest`), and sends them back in the combine. The shared expert overlaps the
combine, not the dispatch, in forward: torchtitan's MoE.forward (torchtitan/models/moe/moe.py)
runs it after the routed experts, before their output (the combine's, a functional collective
waited for where it is used) is scored and scattered back; the compute stream waits for the
dispatch before the experts. In backward the plan overlaps nothing with the all-to-alls (an
assumption: autograd's order of the two branches is not modelled).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from shardsim.config import RunConfig
from shardsim.simulator import gpu_kernels as gk
from shardsim.simulator.compute import BWD_MEM_FACTOR, DTYPE_BYTES
from shardsim.simulator.network.alltoall import Exchange
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.steps import BlockTimes, compute_op

if TYPE_CHECKING:
    from shardsim.simulator.strategies.fsdp import Residency
from shardsim.specs.model.workload import Block, MoELayer
from shardsim.specs.parallel_dims import ParallelDims

COUNT_BYTES = 8  # an int64 token count per expert (the counts exchange)


@dataclass(frozen=True)
class EpGroups:
    """The groups of an expert-parallel FSDP2 mesh of one pipeline stage (cp of 1)."""

    ep: GroupLayout  # each EP group: `ep` ranks, etp apart
    dense: GroupLayout  # FSDP2's shard groups of all but the experts: the degree's ranks, tp apart
    experts: GroupLayout  # FSDP2's shard groups of the experts: efsdp ranks, ep x etp apart
    replica: GroupLayout | None  # the replica groups (zero2d, replicated stages), for both


def ep_groups(dims: ParallelDims, stage: int = 0) -> EpGroups:
    """The groups of pipeline stage `stage` of `dims` (the world without pipeline; see the module's
    docstring; `ParallelDims.expert_groups` lays out the same)."""
    assert dims.cp == 1 and dims.tp_inner, "expert parallelism composes with FSDP2, pipelines and tp innermost here"
    n, r, shard = dims.world // dims.pp, dims.dp_replicate, dims.dp_shard * dims.size("ep")
    a = stage * n
    replica = GroupLayout(a, n, r, strided=True) if r > 1 else None
    ep = GroupLayout(a, n, dims.ep, inner=dims.expert_tp)
    experts = GroupLayout(a, n, dims.efsdp, inner=dims.ep * dims.expert_tp, outer=r)
    return EpGroups(ep, GroupLayout(a, n, shard, inner=dims.tp), experts, replica)


def experts_unit(b: Block) -> str:
    """The name of MoE layer `b`'s experts' FSDP2 unit (in its piece's `Residency`)."""
    return f"{b.name} experts"


def rank_factor(moe: MoELayer, batch: int, imbalance: float, capacity: float, ep: int) -> float:
    """Rows the busiest EP rank's experts receive over the mean rank's (1 to ep)."""
    busiest, _ = gk.routed_rows(moe, batch, imbalance, capacity, ep)
    mean, _ = gk.routed_rows(moe, batch, imbalance, capacity)
    return min(float(ep), max(1.0, busiest / mean))


def dense_part(b: Block) -> Block:
    """Block `b` without its routed experts: what FSDP2's unit of the block holds under EP."""
    if b.moe is None:
        return b
    return replace(b, params=b.params - b.moe.experts * b.moe.expert_params)


def local_expert_params(b: Block, ep: int) -> float:
    """Parameters of the experts an EP rank holds of block `b` (before FSDP2 shards them)."""
    return 0.0 if b.moe is None else b.moe.experts // ep * b.moe.expert_params


@dataclass(frozen=True)
class MoEParts:
    """Seconds of an MoE layer's experts and un-permute within its block's cost, each pass; the
    experts' op runs `busiest` times theirs (the busiest EP rank's load where the block's cost is
    the mean rank's: the roofline)."""

    experts_fwd: float = 0.0
    unpermute_fwd: float = 0.0
    shared_fwd: float = 0.0  # the shared expert's forward, run while the combine is in flight
    experts_bwd: float = 0.0
    unpermute_bwd: float = 0.0
    busiest: float = 1.0

    def scaled(self, k: float) -> MoEParts:
        """The forward's parts at `k` times (a recomputation of that share of the forward)."""
        return replace(
            self, experts_fwd=k * self.experts_fwd, unpermute_fwd=k * self.unpermute_fwd, shared_fwd=k * self.shared_fwd
        )


@dataclass
class ExpertParallel:
    """Each MoE layer's pass with its all-to-alls and its experts' FSDP2 unit (`Plan.ep`). A
    piece's pass (`fsdp`) sets `enter` first: the residency of its units and whether its backward
    reduces gradients."""

    stage_groups: list[EpGroups]  # the groups of each rank class (a pipeline rank's stage; one without)
    times: BlockTimes
    cfg: RunConfig
    ep: int
    sync: bool = True  # this micro-step all-reduces gradient shards across replicas
    reduce: bool = True  # this backward reduce-scatters the experts' gradients (a pipeline's: at the step's end)
    residency: Residency | None = None  # the units of the piece whose pass runs now
    syncs: list[int | None] = field(default_factory=list)  # the experts' gradient collectives so far

    def enter(self, residency: Residency, reduce: bool = True, sync: bool = True) -> None:
        """The pass of a piece whose units are in `residency` starts: its backward reduces the
        experts' gradients (`reduce`), all-reducing them across replicas (`sync`)."""
        self.residency, self.reduce, self.sync, self.syncs = residency, reduce, sync, []

    def groups(self, rc: int) -> EpGroups:
        """The groups of rank class `rc`."""
        return self.stage_groups[rc]

    def _unshard(self, b: Block) -> bool:
        """FSDP2's unshard of `b`'s experts: True when it all-gathers (always, outside a piece's pass)."""
        return self.residency is None or self.residency.unshard(experts_unit(b))

    def _exchange(self, b: Block, mb: int) -> tuple[Exchange, float]:
        """The dispatch's exchange and a rank's mean send buffer in bytes."""
        assert b.moe is not None
        cm = self.times.cm
        f = rank_factor(b.moe, mb, cm.moe_imbalance, cm.moe_capacity, self.ep)
        rows, _ = gk.routed_rows(b.moe, mb, cm.moe_imbalance, cm.moe_capacity)
        return Exchange.busiest(self.ep, f), rows * b.moe.hidden * DTYPE_BYTES[self.cfg.precision]

    def parts(self, b: Block, mb: int) -> MoEParts:
        """The seconds of MoE layer `b`'s parts on the busiest EP rank: its grouped GEMMs from their
        kernels at the device's training rate (the pass's straggler factor included; the block's
        cost counts them so, `ComputeModel.ep`), its un-permute the memory-bound share
        `gpu_kernels` counts for it; without kernel figures (the roofline, which costs a block at
        the mean load), the experts' share of the layer's FLOPs, the busiest rank's `rank_factor`
        times that, and no un-permute."""
        cm = self.times.cm
        c = self.times.block(b, mb)
        spec = cm.device.kernels
        k = cm._kernels(b, mb)
        if k is None or k.moe is None or spec is None:
            k = gk.block_kernels(cm.arch, b, mb, cm.tp) if cm.arch else None
            if k is None or b.moe is None:
                return MoEParts()
            share = 1.0 / max(b.fwd_flops * mb, 1.0)
            fwd = min(1.0, sum(g.flops for g in k.grouped) * share) * c.fwd_s
            shared = min(1.0 - fwd / c.fwd_s, sum(g.flops for g in k.moe.shared) * share) * c.fwd_s if k.moe else 0.0
            bwd = min(1.0, sum(g.flops for g in k.bwd_grouped) / max(b.bwd_flops * mb, 1.0)) * c.bwd_s
            f = rank_factor(b.moe, mb, cm.moe_imbalance, cm.moe_capacity, self.ep)
            return MoEParts(fwd, 0.0, shared, bwd, 0.0, f)
        esize, bw = DTYPE_BYTES[cm.precision], cm.mem_bytes_per_s
        rate = cm.flops_per_s * spec.gemm_training_fraction
        slowest = gk.slowest_of(cm.sync_ranks, spec.rank_time_cv)
        ef = min(c.fwd_s, slowest * sum(gk.grouped_gemm_time(g, spec, rate, bw, esize) for g in k.grouped))
        eb = min(c.bwd_s, slowest * sum(gk.grouped_gemm_time(g, spec, rate, bw, esize) for g in k.bwd_grouped))
        rows, h, s = k.grouped[0].rows, b.moe.hidden, mb * b.moe.tokens  # type: ignore[union-attr]
        un = min(c.fwd_s - ef, (3 * rows * h + 2 * s * h) * esize / bw)  # weight, scatter-add (`blocks._moe_mlp`)
        sf = min(c.fwd_s - ef - un, slowest * sum(gk.gemm_time(g, spec, rate, bw, esize) for g in k.moe.shared))
        return MoEParts(ef, un, sf, eb, min(BWD_MEM_FACTOR * un, c.bwd_s - eb))

    def run(self, p: Plan, rc: int, name: str, deps: list[Dep], dur: float, phase: str, b: Block, mb: int) -> int:
        """The ops of MoE layer `b`'s pass `phase` of `dur` seconds (backward: with its
        recomputation and FSDP2's copy-in); the last op's id."""
        assert b.moe is not None
        m = self.parts(b, mb)
        if phase == "fwd":
            return self._forward(p, rc, name, deps, dur, b, mb, m, "fwd")
        again = self.times.recompute_s(b, mb)
        start: list[Dep] = deps
        if again > 0:
            redo = m.scaled(again / self.times.block(b, mb).fwd_s)
            start = [self._forward(p, rc, f"{name} (recompute)", start, again, b, mb, redo, "bwd")]
        ex, nbytes = self._exchange(b, mb)
        if m.unpermute_bwd > 0:
            start = [compute_op(p, rc, f"{name} un-permute", start, m.unpermute_bwd, "bwd")]
        g = self.groups(rc)
        back = p.all_to_all(rc, "a2a", g.ep, nbytes, f"A2A combine' {name}", start, "bwd", ex)
        ag = self._gather(p, rc, b, start, f"{name}'", "bwd") if self._unshard(b) else None
        prev = compute_op(p, rc, f"{name} experts", [back, ag, *start], m.experts_bwd * m.busiest, "bwd")
        if self.reduce:
            self._reduce(p, rc, b, prev, name)
        disp = p.all_to_all(rc, "a2a", g.ep, nbytes, f"A2A dispatch' {name}", [prev], "bwd", ex.transposed())
        return compute_op(p, rc, name, [disp, prev], dur - again - m.experts_bwd - m.unpermute_bwd, "bwd")

    def _forward(
        self, p: Plan, rc: int, name: str, deps: list[Dep], dur: float, b: Block, mb: int, m: MoEParts, ph: str
    ) -> int:
        """A forward of MoE layer `b` of `dur` seconds, parts `m` (`ph`: "bwd" for a recomputation):
        pre, counts, dispatch, the experts (after their all-gather), combine, un-permute."""
        assert b.moe is not None
        ex, nbytes = self._exchange(b, mb)
        g = self.groups(rc)
        pre = compute_op(p, rc, name, deps, dur - m.experts_fwd - m.unpermute_fwd - m.shared_fwd, ph)
        counts = p.all_to_all(rc, "a2a", g.ep, b.moe.experts * COUNT_BYTES, f"A2A counts {name}", [pre], ph)
        disp = p.all_to_all(rc, "a2a", g.ep, nbytes, f"A2A dispatch {name}", [counts, pre], ph, ex)
        ag = self._gather(p, rc, b, [counts, pre], name, ph) if ph == "fwd" and self._unshard(b) else None
        if ph == "fwd" and self.residency is not None:
            self.residency.post_forward(experts_unit(b))
        prev = compute_op(p, rc, f"{name} experts", [disp, ag, pre], m.experts_fwd * m.busiest, ph)
        comb = p.all_to_all(rc, "a2a", g.ep, nbytes, f"A2A combine {name}", [prev], ph, ex.transposed())
        if m.shared_fwd > 0:  # torchtitan's MoE.forward: the shared expert before the combine's output is used
            prev = compute_op(p, rc, f"{name} shared expert", [prev], m.shared_fwd, ph)
        return compute_op(p, rc, f"{name} un-permute", [comb, prev], m.unpermute_fwd, ph)

    def _gather(self, p: Plan, rc: int, b: Block, deps: list[Dep], name: str, phase: str) -> Dep:
        """The experts' FSDP2 all-gather over their shard group and its copy-out: what their compute waits for."""
        params = local_expert_params(b, self.ep)
        nbytes = params * DTYPE_BYTES[self.cfg.precision]
        ag = p.comm(rc, "ag", "all_gather", self.groups(rc).experts, nbytes, f"AG experts {name}", deps, phase)
        out = p.fsdp.gather_s_per_param * params
        return compute_op(p, rc, f"copy-out experts {name}", [ag, deps[-1]], out, phase) if out > 0 else ag

    def _reduce(self, p: Plan, rc: int, b: Block, after: Dep, name: str) -> None:
        """The experts' gradient reduce-scatter (after its copy-in) and, on a syncing micro-step,
        the shard's all-reduce across replicas."""
        after = self._copy_in(p, rc, b, after, name, "bwd")
        self.syncs += self._reduce_scatter(p, rc, b, after, name, self.sync, [after])

    def _copy_in(self, p: Plan, rc: int, b: Block, after: Dep, name: str, phase: str) -> Dep:
        """FSDP2's copy-in of `b`'s experts' gradients after op `after` (`after` itself when it costs nothing)."""
        copy = p.fsdp.reduce_s_per_param * local_expert_params(b, self.ep)
        return compute_op(p, rc, f"copy-in experts {name}", [after], copy, phase) if copy > 0 else after

    def _reduce_scatter(
        self, p: Plan, rc: int, b: Block, after: Dep, name: str, sync: bool, ar_deps: list[Dep]
    ) -> list[int | None]:
        """The experts' gradient reduce-scatter over their shard group after op `after`, and with
        `sync` the shard's all-reduce across replicas after it and `ar_deps`."""
        params, gbytes = local_expert_params(b, self.ep), DTYPE_BYTES[self.cfg.grad_dtype]
        g = self.groups(rc)
        rs = p.comm(rc, "rs", "reduce_scatter", g.experts, params * gbytes, f"RS experts {name}", [after], "sync")
        out = [rs]
        if sync and g.replica is not None:
            nb = params * gbytes / g.experts.size
            out.append(p.comm(rc, "ar", "all_reduce", g.replica, nb, f"AR experts {name}", [rs, *ar_deps], "sync"))
        return out

    def reduce_grad(self, p: Plan, rc: int, b: Block, after: Dep, sync: bool, tag: str) -> tuple[Dep, list[int | None]]:
        """perform_reduce_grad's turn of MoE layer `b`'s experts (after op `after`): copy-in, their
        gradient reduce-scatter and, with `sync`, the all-reduce across replicas. Returns (what the
        next unit's copy-in waits for, the gradient collectives)."""
        after = self._copy_in(p, rc, b, after, f"{b.name}{tag}", "sync")
        return after, self._reduce_scatter(p, rc, b, after, f"{b.name}{tag}", sync, [])


def ep_units(units: tuple[tuple[str, float], ...], blocks: list[Block], ep: int) -> tuple[tuple[str, float], ...]:
    """A rank class's FSDP2 units under EP, as held unsharded: each MoE layer's own unit with the
    experts' unit beside it, experts / ep experts of it (both gathered while the layer runs)."""
    off = {b.name: b.moe.experts * b.moe.expert_params - local_expert_params(b, ep) for b in blocks if b.moe}
    return tuple((name, params - off.get(name, 0.0)) for name, params in units)


def ep_activations(blocks: list[Block], ep: int, imbalance: float, capacity: float) -> tuple[list[Block], float]:
    """The blocks with what their MoE layers save on the busiest EP rank (its experts' inputs and
    SwiGLU tensors for `rank_factor` x the mean rank's rows: the top-k expansion, `blocks._moe_mlp`'s
    rows x (2 hidden + 4 expert_ffn)), and the dispatch buffers of one layer in flight, elements
    per sample: the rows it receives and the combine's send buffer (an assumption: the runtime's
    ``all_to_all_single`` outputs, alive while its experts run)."""
    out, buffers = [], 0.0
    for b in blocks:
        if b.moe is None:
            out.append(b)
            continue
        m = b.moe
        f = rank_factor(m, 1, imbalance, capacity, ep)
        rows = m.routed_rows
        out.append(replace(b, act_elems=b.act_elems + (f - 1) * rows * (2 * m.hidden + 4 * m.expert_ffn)))
        buffers = max(buffers, 2 * f * rows * m.hidden)
    return out, buffers


def ep_classes(classes: list, ep: int, imbalance: float, capacity: float) -> tuple[list, float]:
    """(rank class, blocks) pairs of `steps.rank_classes` as memory sees them under EP (`ep_units`,
    `ep_activations`), and the dispatch buffers' elements per sample."""
    out, buffers = [], 0.0
    for rc, blocks in classes:
        saved, buf = ep_activations(blocks, ep, imbalance, capacity)
        out.append((replace(rc, units=ep_units(rc.units, blocks, ep)), saved))
        buffers = max(buffers, buf)
    return out, buffers
