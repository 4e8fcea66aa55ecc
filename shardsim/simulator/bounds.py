"""Lower bounds on a configuration's step time without a plan or a simulation: what the pruned
search (`sweep.prune`) compares with the best found.

The compute bound (`compute_bound_s`): every block's forward, backward and recomputation at
the micro-batch the plan runs, every compute op at full speed, and each collective alone on
the network (`collectives.call_alone_s`: the engine's algorithm and phases, its bottleneck
link) where it sits on a chain of dependencies whatever the overlap. It is a lower bound of
the simulated step because the ops of one stream run one after another (`plan.Plan.add`), an
op starts when its dependencies have ended, a compute op takes at least its `duration`
(`engine`: NCCL's SM share and shared cores only slow it), a call takes at least its time alone
(shared links only slow it), and the step ends with the latest rank class. What it counts:
- every block: its compute op, then its tensor-parallel collectives (the next op waits for
  them, `tensor_parallel.TensorParallel.after`; with asyncTP its fused pairs in the op's time
  instead, `TensorParallel.extra_s`);
- a data-parallel class: grad_accum × (forward + backward), then the optimizer step
  (`steps.data_parallel_plan`); with DDP the last backward to the end of its last bucket's
  all-reduce (`_synced_backward_s`: the buckets all-reduced one after another on their stream,
  each once backward has produced its gradients, `ddp.BucketFill`);
- a pipeline, per schedule step: the longest paths through its (stage, microbatch) forwards
  and backwards in the schedule's order (`_schedule_s`), each pass waiting for the stage's pass
  before it and for its input (the send alone after the other stage's pass), to stage 0's last
  op (the next step's first forward waits for it). In the last step each DDP stage's last
  backward syncs its gradients (as above: its input-gradient send follows the sync,
  `pipeline._Pipeline._op`). A sharded stage's passes wait for their all-gathers (`_gates`:
  `fsdp.step_gathers`, one stream, none before its pass starts), then FSDP2's copy-outs, and
  its reductions follow its last op (`_reduce_grad_s`: reduce-scatters, then the replicas'
  all-reduces), before its optimizer step and, on stage 0, the step's end.
What it leaves out (so it stays below): the overlap of collectives other than those chains,
an MoE layer's all-to-alls and its experts' FSDP2 collectives under expert parallelism,
the slowdown of shared links, FSDP2's other CPU work (copy-ins), the compression hook's casts,
the sharded optimizer's overhead, a ZeRO/ZeRO-2D step's all-gathers and reduce-scatters.
`tests/unit/test_sweep_prune.py` checks bound ≤ simulated step over several spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate

from shardsim.simulator.checkpointing import checkpointing_of
from shardsim.simulator.compute import DTYPE_BYTES
from shardsim.simulator.network.collectives import GroupLayout, call_alone_s
from shardsim.simulator.network.links import LinkGraph, links_for
from shardsim.simulator.predict import Prepared
from shardsim.simulator.strategies.build import plan_tensor_parallel
from shardsim.simulator.strategies.ddp import (
    GRAD_BYTES,
    BucketFill,
    ddp_piece,
    grad_ready_bytes,
    grad_ready_groups,
    wire_bytes_per_grad,
)
from shardsim.simulator.strategies.deepspeed_zero import DEEPSPEED_STAGES, stage_of
from shardsim.simulator.strategies.fsdp import FsdpPiece, step_gathers
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.pipeline import activation_send, gradient_send, schedule_order, stage_pieces
from shardsim.simulator.strategies.steps import BlockTimes, Piece, rank_classes
from shardsim.simulator.strategies.tensor_parallel import TensorParallel, calls_key
from shardsim.specs.model.workload import Block
from shardsim.specs.strategies.ddp import DDP

PASSES = ("fwd", "bwd")


@lru_cache(maxsize=8)
def _calls(g: LinkGraph, algo: str, backend: str, mics: bool) -> dict[tuple, float]:
    """The calls timed alone on graph `g` with these options: shared by a sweep's configurations."""
    return {}


@dataclass
class _Wire:
    """Calls timed alone on the network, once per (collective, layout, bytes) in a process for a
    graph and the engine's options (`_calls`)."""

    g: LinkGraph
    algo: str
    backend: str
    mics: bool
    _memo: dict[tuple, float] = field(init=False)  # per call
    _passes: dict[tuple, float] = field(default_factory=dict)  # per block pass (of this configuration's `tp`)

    def __post_init__(self) -> None:
        self._memo = _calls(self.g, self.algo, self.backend, self.mics)

    def alone_s(self, coll: str, layout: GroupLayout, nbytes: float) -> float:
        key = (coll, layout, nbytes)
        t = self._memo.get(key)
        if t is None:
            t = self._memo[key] = call_alone_s(self.g, coll, layout, nbytes, self.algo, self.backend, self.mics)
        return t

    def pass_s(self, tp: TensorParallel, b: Block, phase: str, layout: GroupLayout, mb: int) -> float:
        """Seconds of block `b`'s tensor-parallel calls of `phase` one after another, each alone;
        once per what decides them (`TensorParallel.pass_calls`: the block's kind and whether it is
        an MoE layer, `calls_key`, whether it recomputes its forward) for this `tp`, layout and micro-batch."""
        key = (calls_key(b), phase, b.name in tp.recomputed, layout, mb)
        t = self._passes.get(key)
        if t is None:
            calls = tp.plain_calls(b, phase, mb)
            t = self._passes[key] = sum(self.alone_s(c.coll, layout, tp.nbytes(c, mb)) for c in calls)
        return t


def _block_s(bt: BlockTimes, b: Block, mb: int, tp: TensorParallel | None, wire: _Wire, rc: int) -> tuple[float, float]:
    """(forward, backward with recomputation) seconds of block `b` of rank class `rc` for one
    micro-batch of `mb`, its tensor-parallel collectives after it (with asyncTP its fused pairs
    in place of their GEMMs, `TensorParallel.extra_s`, and only the others after it)."""
    c = bt.block(b, mb)
    f, bw = c.fwd_s, c.bwd_s + (bt.recompute_s(b, mb) if b.kind == "layer" else 0.0)
    if tp is not None:
        lay = tp.layout(rc)
        cf, cb = (wire.pass_s(tp, b, ph, lay, mb) for ph in PASSES)
        ef, eb = (tp.extra_s(rc, b, mb, ph) for ph in PASSES)
        f, bw = max(0.0, f + ef) + cf, max(0.0, bw + eb) + cb
    return f, bw


def _costs(
    bt: BlockTimes, blocks: list[Block], mb: int, tp: TensorParallel | None, wire: _Wire, rc: int
) -> dict[int, tuple[float, float]]:
    """Each of `blocks`' (forward, backward) seconds by id (`_block_s`)."""
    return {id(b): _block_s(bt, b, mb, tp, wire, rc) for b in blocks}


def _synced_backward_s(cost: dict[int, tuple[float, float]], pc: Piece, wire: _Wire, per_grad: int) -> float:
    """Seconds of a replicated piece's backward that syncs its gradients (`ddp.ddp_backward`
    with sync; `cost`: each block's (forward, backward) seconds by id), to the end of its last
    bucket's all-reduce: its blocks one after another in
    gradient-ready order, each bucket's all-reduce (alone, `per_grad` bytes a gradient) once its
    gradients are ready and the one before it has ended (one stream). Lower than the plan's:
    the compression hook's casts are left out."""
    t = free = 0.0
    fill = BucketFill()

    def reduce(sizes: list[float]) -> None:
        nonlocal free
        for size in sizes:
            free = max(t, free) + wire.alone_s("all_reduce", pc.replica, size / GRAD_BYTES * per_grad)

    for (blocks, _), ready in zip(grad_ready_groups(pc), grad_ready_bytes(pc), strict=True):
        t += sum(cost[id(b)][1] for b in blocks)
        reduce(fill.add(ready))
    reduce(fill.flush())
    return max(t, free)


def _gates(
    pc: FsdpPiece, order: Sequence[tuple[str, int]], wire: _Wire, ebytes: int, copy_per_param: float
) -> dict[int, list[tuple[float, float, int]]]:
    """A sharded stage's all-gathers in one schedule step (`fsdp.step_gathers`), by the pass
    (its index in `order`) whose op first waits for each: (seconds alone, its copy-out's
    seconds on the compute stream, that op's index in the pass)."""
    out: dict[int, list[tuple[float, float, int]]] = {}
    alone: dict[float, float] = {}
    for params, k, i in step_gathers(pc, order):
        t = alone.get(params)
        if t is None:
            t = alone[params] = wire.alone_s("all_gather", pc.shard, params * ebytes)
        out.setdefault(k, []).append((t, copy_per_param * params, i))
    return out


def _reduce_grad_s(pc: FsdpPiece, wire: _Wire, gbytes: int, sync: bool) -> float:
    """Seconds of a sharded stage's perform_reduce_grad after its last op (`fsdp.fsdp_reduce_grad`):
    each unit's reduce-scatter alone, one after another (one stream), and with `sync` each
    unit's all-reduce across replicas after its reduce-scatter, one after another (another
    stream): for every unit j, the reduce-scatters up to j, then the all-reduces from j on (a
    flow-shop bound). Lower than the plan's: the copy-ins are left out."""
    units = [params for _, params in pc.units if params > 0]
    rs = [wire.alone_s("reduce_scatter", pc.shard, n * gbytes) for n in units]
    if not (sync and pc.replica is not None):
        return sum(rs)
    ar = [wire.alone_s("all_reduce", pc.replica, n * gbytes / pc.shard.size) for n in units]
    after = [*accumulate(ar[::-1])][::-1]  # the all-reduces from j on
    return max(r + a for r, a in zip(accumulate(rs), after, strict=True))


def compute_bound_s(s: Prepared, algo: str = "auto") -> float:
    """The compute bound of `s`'s step (seconds; see the module's docstring)."""
    from shardsim.simulator.predict import _engine_options

    cfg, res, w = s.cfg, s.res, s.ranks_workload
    ckpt = checkpointing_of(cfg, w.layers)
    bt = BlockTimes(s.compute, ckpt)
    wire = _Wire(links_for(s.cluster), algo, cfg.backend, _engine_options(s)["mics"])
    tp = plan_tensor_parallel(cfg, res, w, ckpt, s.compute, wire.g)
    mb, K = res.microbatch_size, cfg.grad_accum
    pipeline = cfg.strategy.spec.is_pipeline
    classes = rank_classes(res, w, pipeline=pipeline)
    rc0, blocks0 = classes[0]
    tensors = sum(b.param_tensors for b in blocks0)
    if cfg.library == "deepspeed" and stage_of(cfg) in DEEPSPEED_STAGES:
        tensors = 1  # DeepSpeed steps one flat partition (`deepspeed_zero`)
    optimizer = s.compute.optimizer(rc0.local_params, tensors)
    per_grad = wire_bytes_per_grad(cfg)
    if not pipeline:
        cost = _costs(bt, blocks0, mb, tp, wire, 0)
        fwd, bwd = (sum(cost[id(b)][i] for b in blocks0) for i in (0, 1))  # the blocks one after another
        if cfg.strategy.kind != DDP.name:
            return K * (fwd + bwd) + optimizer
        pc = ddp_piece(res, w)  # the last micro-step syncs its buckets; the optimizer waits for them
        last = _synced_backward_s(cost, pc, wire, per_grad) if pc.replica is not None else bwd
        return (K - 1) * (fwd + bwd) + fwd + last + optimizer
    if res.multi_stage:
        return _multi_stage_s(s, bt, classes, tp, wire, K)
    M, ebytes = res.microbatches, DTYPE_BYTES[cfg.precision]
    gbytes, kind = DTYPE_BYTES[cfg.grad_dtype], cfg.strategy.schedule
    pieces = stage_pieces(res, w)
    fsdp = s.compute.fsdp_cpu(w.params, sum(b.params for b in w.layers))  # FSDP2's copies (`build.build_plan`)
    stages: list[_Stage] = []
    for st, (_, blocks) in enumerate(classes):
        pc, mesh = pieces[st], stage_mesh(res, st)
        cost = _costs(bt, pc.blocks, mb, tp, wire, st)  # the blocks the plan runs (under EP, without their experts)
        within = {
            "F": [0.0, *accumulate(cost[id(x)][0] for x in pc.blocks)],
            "B": [0.0, *accumulate(cost[id(x)][1] for x in pc.head + pc.layers[::-1] + pc.embed)],
        }
        sharded = isinstance(pc, FsdpPiece)
        order = _orders(kind, res.pp, M)[st]
        stages.append(
            _Stage(
                within,
                _synced_backward_s(cost, pc, wire, per_grad) if _replicated(pc) else within["B"][-1],
                wire.alone_s("send_recv", *activation_send(mesh, blocks, mb, ebytes)) if st + 1 < res.pp else 0.0,
                wire.alone_s("send_recv", *gradient_send(mesh, blocks, mb, ebytes)) if st > 0 else 0.0,
                _gates(pc, order, wire, ebytes, fsdp.gather_s_per_param) if sharded else {},
                _reduce_grad_s(pc, wire, gbytes, sync=True) if sharded else 0.0,
            )
        )
    # a schedule step from stage 0's end of the step before (the next step's first forward waits
    # for it) to stage 0's end, its reductions (a sharded stage's) after its last op; in the last
    # step the DDP stages sync their gradients, and every stage's optimizer step follows its reductions
    step = 0.0
    if K > 1:
        step = _schedule_s(kind, M, stages, last=False)[0]
        if isinstance(pieces[0], FsdpPiece):
            step += _reduce_grad_s(pieces[0], wire, gbytes, sync=False)
    ends = _schedule_s(kind, M, stages, last=True)
    own = max(end + st.tail for end, st in zip(ends, stages, strict=True))
    return (K - 1) * step + max(ends[0] + stages[0].tail + optimizer, own)


def _multi_stage_s(s: Prepared, bt: BlockTimes, classes: list, tp: TensorParallel | None, wire: _Wire, K: int) -> float:
    """A multi-stage schedule's bound (`virtual_pipeline`): the busiest rank's passes, every
    microbatch's forward and backward of each block it holds one after another, then its
    optimizer step (what waits on other ranks, the sends and the gradient syncs, left out)."""
    res, mb = s.res, s.res.microbatch_size
    out = 0.0
    for r, (rc, blocks) in enumerate(classes):
        cost = _costs(bt, blocks, mb, tp, wire, r)
        work = res.microbatches * sum(sum(cost[id(b)]) for b in blocks)
        out = max(out, K * work + s.compute.optimizer(rc.local_params, sum(b.param_tensors for b in blocks)))
    return out


@dataclass
class _Stage:
    """What the compute bound counts of a pipeline stage's schedule step."""

    within: dict[str, list[float]]  # F, B: seconds of a forward's / backward's first i ops
    last_bwd: float  # the last microbatch's backward in the last step (a DDP stage's to its gradient sync's end)
    to_next: float  # its activation send to the next stage, alone
    to_prev: float  # its input-gradient send to the stage before, alone
    gates: dict[int, list[tuple[float, float, int]]]  # a sharded stage's all-gathers per pass (`_gates`)
    tail: float  # a sharded stage's reductions after its last op, with the replicas' sync (`_reduce_grad_s`)


def _replicated(pc: Piece) -> bool:
    """A DDP stage with replicas (its gradients all-reduced)."""
    return not isinstance(pc, FsdpPiece) and pc.replica is not None


def _schedule_s(kind: str, M: int, stages: list[_Stage], last: bool) -> list[float]:
    """The longest paths of one schedule step over its (stage, microbatch) passes, each stage's in
    `pipeline.schedule_order`: when each stage's last pass ends. A pass starts when the stage's
    pass before it has ended and its input has arrived (the previous stage's forward, the next
    one's backward, then the send alone) and takes its ops one after another (with `last`, the
    last microbatch's backward is `_Stage.last_bwd`). A sharded stage's pass also waits for its
    all-gathers (`_Stage.gates`): they run one after another on their stream, none before the
    pass starts (FSDP2 issues them in the pass); after all-gather j, its copy-out and those of
    the pass's later ones, and the pass's ops from the first that waits for j (a flow-shop bound)."""
    P = len(stages)
    orders = _orders(kind, P, M)
    ends = {"F": [[-1.0] * M for _ in range(P)], "B": [[-1.0] * M for _ in range(P)]}  # -1: not yet
    free = [0.0] * P  # when each stage's last pass so far ends
    gathered = [0.0] * P  # when each stage's last all-gather so far ends
    at = [0] * P
    remaining = 2 * M * P
    while remaining:
        progressed = 0
        for s in range(P):
            order, t, st = orders[s], free[s], stages[s]
            while at[s] < 2 * M:
                k, m = order[at[s]]
                if k == "F" and s > 0:
                    got = ends["F"][s - 1][m]
                    if got < 0:
                        break
                    t = max(t, got + stages[s - 1].to_next)
                elif k == "B" and s + 1 < P:
                    got = ends["B"][s + 1][m]
                    if got < 0:
                        break
                    t = max(t, got + stages[s + 1].to_prev)
                w = st.within[k]
                gates = st.gates.get(at[s])
                if gates:
                    copies = sum(c for _, c, _ in gates)
                    end, a = t + w[-1] + copies, max(gathered[s], t)
                    for sec, copy, i in gates:
                        a += sec
                        end = max(end, a + copies + w[-1] - w[i])
                        copies -= copy
                    gathered[s], t = a, end
                else:
                    t += st.last_bwd if last and k == "B" and m == M - 1 else w[-1]
                ends[k][s][m] = t
                at[s] += 1
                progressed += 1
            free[s] = t
        if not progressed:
            raise RuntimeError("pipeline schedule deadlocked (a bug in schedule_order)")
        remaining -= progressed
    return free


@lru_cache(maxsize=64)
def _orders(kind: str, P: int, M: int) -> tuple[tuple[tuple[str, int], ...], ...]:
    """Every stage's `schedule_order`."""
    return tuple(tuple(schedule_order(kind, s, P, M)) for s in range(P))
