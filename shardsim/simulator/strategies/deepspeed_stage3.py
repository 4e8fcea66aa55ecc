"""DeepSpeed ZeRO stage 3's step (library deepspeed, stage 3) as deepspeed/runtime/zero/stage3.py,
partitioned_param_coordinator.py, partition_parameters.py and parameter_offload.py run it: which
parameters are all-gathered when (`fetch_schedule`) and the plan of a step (`stage3_plan`).

Each choice, where DeepSpeed makes it:
- Fetch units (`DeepSpeedZeRoOffload._register_deepspeed_module`): every submodule has a forward
  pre-hook and a backward pre-hook that fetch the parameters it holds itself
  (`fetch_sub_module`, `iter_params(recurse=False)`): the unit is the module that holds a tensor,
  here each parameter tensor of a block (`block_tensors`) in forward order; backward uses them in
  reverse. The trace (`__submodule_order`, `__param_order`) is one micro-step's uses in order.
- Persistent parameters (`mark_persistent_parameters`): a tensor under
  ``stage3_param_persistence_threshold`` elements is kept whole on every rank (`ds_persist`):
  never gathered nor released; its elements still count in the reuse distance.
- The fetch (`_fetch_sub_module_impl`): the module's parameters not available are all-gathered in
  one `all_gather_coalesced` (one flat all-gather of their partitions in the parameters' dtype,
  `_all_gather_dtype`; ``allgather_bucket_size`` is read by stages 1 and 2 only) on
  `__allgather_stream`; the module's compute waits with
  `current_stream().wait_stream(__allgather_stream)`: for every all-gather issued so far, the
  prefetches of earlier modules included.
- Prefetch (with the trace complete: the steady state; the first step's recording is not
  planned): after that wait, entries of the trace (`__param_queue`, every use of every parameter
  in order) are popped and those not available gathered in one more `all_gather_coalesced`, until
  ``stage3_prefetch_bucket_size`` elements, or ``stage3_max_live_parameters`` less the elements
  available (`__n_available_params`, reset by `reset_step` at every forward) where that is fewer;
  a popped parameter already available is marked as fetched for that later use
  (`__most_recent_step_id_param_fetched_for`).
- Release (`release_sub_module` after a module's forward and after its backward,
  `__params_to_release`): its parameters, unless persistent, marked as fetched for a later use,
  or used again by a module within ``stage3_max_reuse_distance`` elements ahead in the trace
  (counted module by module): at DeepSpeed's defaults (1e9) the last layers stay gathered from
  their forward to their backward, which gathers them no more. ``stage3_max_live_parameters``
  bounds the prefetch only: a module's own fetch is never refused.
- Gradients (`reduce_independent_p_g_buckets_and_remove_grads`): each parameter's gradient
  (persistent ones' too) joins the ipg bucket as backward makes it; a gradient that would take
  the bucket past ``reduce_bucket_size`` elements first sends the bucket
  (`__reduce_and_partition_ipg_grads` -> `__avg_scatter_grads` -> `reduce_scatter_coalesced`, one
  reduce-scatter in the communication dtype) on `reduce_and_partition_stream` under
  ``overlap_comm`` (DeepSpeed's default at stage 3), or on the compute stream without it
  (backward waits); what is left at the end of backward (`independent_gradient_partition_epilogue`).
  Every micro-step: the gradient partitions accumulate. With MiCS (a shard group smaller than the
  data-parallel ranks) the gradient partition is all-reduced across the replica groups on the
  boundary (`allreduce_mics_shard_grads`), one all-reduce after the last bucket.
- The step (`step`): each rank steps its fp32 partition (one flat tensor) and copies it into its
  half-precision partition; no all-gather (`_partition_all_parameters` releases every parameter:
  the next forward fetches them).

Approximations (named): a block's parameters are its `param_tensors` tensors (`block_tensors`: a
dense layer's linear weights, its norms and biases of even size; another block's largest tensor
and the rest of even size); each tensor is a module of its own
(a Linear's weight and bias are one module in DeepSpeed; its bias is persistent either way); a
block's pass is split over its modules in proportion to their elements; a checkpointed layer's
recomputation fetches as its backward does; a pass's all-gathers start no earlier than the op
before the pass (where the CPU issues them); the copy into the ipg bucket, the CPU's
synchronizations (`__max_ongoing_fetch_events`, `max_param_reduce_events`) and the overflow
check are left out.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from shardsim.config import Resolved, RunConfig
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.steps import Piece, compute_op, data_parallel_plan, split_blocks
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.float8 import layer_linears
from shardsim.specs.model.workload import Block, Workload


def wire_bytes(cfg: RunConfig) -> int:
    """Bytes a gradient moves: ``communication_data_type`` (reduce_dtype) or the parameters' dtype."""
    return DTYPE_BYTES[cfg.reduce_dtype or cfg.storage_precision]


def block_tensors(b: Block, arch: Arch | None = None) -> list[int]:
    """Elements of each parameter tensor of `b` (see the approximation above): a dense layer of
    `arch` its linears' weights in forward order (`layer_linears`), then its other parameters
    (norms, biases) evenly over its other tensors; another block its largest tensor, then the
    rest evenly over its others; one tensor where it names none."""
    if b.params <= 0:
        return []
    first = [b.largest_tensor] if 0 < b.largest_tensor < b.params else []
    if arch is not None and b.kind == "layer" and b.moe is None and not arch.mla:
        first = [x.in_features * x.out_features for x in layer_linears(arch)]
    rest, k = b.params - sum(first), b.param_tensors - len(first)
    if not first or rest < 0 or k < (1 if rest else 0):
        return [b.params]
    return first + [rest // k + (1 if i < rest % k else 0) for i in range(k)]


@dataclass(frozen=True)
class Trace:
    """One micro-step's module uses in order (forward, then backward in reverse), each a parameter
    tensor's id; `elems[p]` the elements of tensor p; `forward_uses` how many are forward's."""

    elems: tuple[int, ...]
    order: tuple[int, ...]
    forward_uses: int


def trace_of(blocks: Sequence[Block], arch: Arch | None = None) -> tuple[Trace, list[list[int]]]:
    """The trace of a model of `blocks` (of `arch`) run forward then backward, and each block's
    tensor ids."""
    ids: list[list[int]] = []
    elems: list[int] = []
    for b in blocks:
        t = block_tensors(b, arch)
        ids.append(list(range(len(elems), len(elems) + len(t))))
        elems += t
    forward = [p for block in ids for p in block]
    return Trace(tuple(elems), tuple(forward + forward[::-1]), len(forward)), ids


@dataclass(frozen=True)
class Fetch:
    """An `all_gather_coalesced` issued at use `at` of the trace: before its compute (a module's own
    parameters) or after its wait (`prefetch`), of `elems` elements."""

    at: int
    elems: int
    prefetch: bool


@dataclass(frozen=True)
class FetchSchedule:
    """What DeepSpeed's coordinator does over one micro-step's trace (see above)."""

    fetches: tuple[Fetch, ...]
    peak_live: int  # most gathered (non-persistent) elements alive at once
    persistent: int  # elements kept whole on every rank


def fetch_schedule(trace: Trace, ds: DeepSpeedSettings) -> FetchSchedule:
    """The all-gathers of one micro-step of `trace` under `ds` (`PartitionedParameterCoordinator`)."""
    elems, order = trace.elems, trace.order
    persist = [e < ds.stage3_param_persistence_threshold for e in elems]
    before = [0, *accumulate(elems[p] for p in order)]  # elements of the uses before each use
    following: list[int | None] = [None] * len(order)  # the next use of the same tensor
    seen: dict[int, int] = {}
    for s in range(len(order) - 1, -1, -1):
        following[s] = seen.get(order[s])
        seen[order[s]] = s
    queue = deque((p, s) for s, p in enumerate(order) if not persist[p])  # `__param_queue`
    fetched_for: dict[int, int] = {}  # `__most_recent_step_id_param_fetched_for`
    available: set[int] = set()
    live = peak = 0
    fetches: list[Fetch] = []
    for s, p in enumerate(order):
        if persist[p]:
            continue  # always available: no fetch; no release
        if p not in available:
            available.add(p)
            live += elems[p]
            fetches.append(Fetch(s, elems[p], False))
        if fetched_for.get(p, -1) < s:  # its own entry comes off the queue
            q, at = queue.popleft()
            assert q == p, "the trace's queue is in use order"
            fetched_for[p] = at
        room = min(ds.stage3_max_live_parameters - live, ds.stage3_prefetch_bucket_size)
        chosen = 0
        while queue and chosen < room and ds.stage3_prefetch_bucket_size > 0:
            q, at = queue.popleft()
            fetched_for[q] = max(fetched_for.get(q, -1), at)
            if q not in available:
                available.add(q)
                chosen += elems[q]
        if chosen:
            live += chosen
            fetches.append(Fetch(s, chosen, True))
        peak = max(peak, live)
        nxt = following[s]
        reused = nxt is not None and before[nxt] - before[s + 1] < ds.stage3_max_reuse_distance
        if not reused and fetched_for[p] <= s + 1:  # `__params_to_release`
            available.discard(p)
            live -= elems[p]
    kept = sum(e for e, k in zip(elems, persist, strict=True) if k)
    return FetchSchedule(tuple(fetches), peak, kept)


def ipg_buckets(elems: Sequence[int], cap: int) -> list[tuple[int | None, int]]:
    """Stage 3's ipg buckets over gradients of `elems` in the order backward makes them: (the index
    of the gradient whose arrival sends the bucket, None: the end of backward; its elements)."""
    out: list[tuple[int | None, int]] = []
    held = 0
    for i, e in enumerate(elems):
        if held and held + e > cap:
            out.append((i, held))
            held = 0
        held += e
    if held:
        out.append((None, held))
    return out


@dataclass
class Stage3Pass:
    """The ops of one pass (forward or backward) of a rank class: compute on the compute stream,
    split where a module waits for an all-gather or a bucket is sent; all-gathers on their stream."""

    p: Plan
    rc: int
    shard: GroupLayout
    half: int  # bytes of a gathered element
    tag: str
    gate: Dep  # what the pass's all-gathers wait for (the op before the pass)
    prev: Dep = None
    pending: float = 0.0  # seconds of compute not yet an op
    waits: list[Dep] = field(default_factory=list)  # what the next compute op waits for besides `prev`
    issued: Dep = None  # the last all-gather issued
    waited: Dep = None  # the last all-gather the compute stream waits for

    def gather(self, f: Fetch, phase: str) -> None:
        name = f"all_gather_coalesced {'prefetch ' if f.prefetch else ''}@{f.at}{self.tag}"
        op = self.p.comm(self.rc, "ag", "all_gather", self.shard, f.elems * self.half, name, [self.gate], phase)
        self.issued = op if op is not None else self.issued

    def wait_gathers(self, phase: str) -> None:
        """`wait_stream(__allgather_stream)`: the compute from here waits for every all-gather issued."""
        if self.issued is not None and self.issued != self.waited:
            self.flush(phase)
            self.waits.append(self.issued)
            self.waited = self.issued

    def flush(self, phase: str) -> Dep:
        """The compute so far as one op (if any): what the ops after it wait for."""
        if self.pending > 0 or self.waits:
            name = f"{'F' if phase == 'fwd' else 'B'} modules{self.tag}"
            self.prev = compute_op(self.p, self.rc, name, [self.prev, *self.waits], self.pending, phase)
            self.pending, self.waits = 0.0, []
        return self.prev


FETCHED_MODULES_PER_BLOCK = 8  # a dense layer's linears are 4 or 5; with its norms and biases gathered, up to 12


def stage3_ops_estimate(grad_accum: int, n_layers: int) -> int:
    """About how many ops `stage3_plan` holds (`scale.plan_ops_estimate`): a gathered module's use
    is at most its all-gather, a prefetch and a compute op, forward and backward, per block
    FETCHED_MODULES_PER_BLOCK modules: an upper bound (at DeepSpeed's defaults llama-2-7b's step
    holds a third of it, gpt2-xl's a tenth)."""
    return 2 * 3 * FETCHED_MODULES_PER_BLOCK * grad_accum * (n_layers + 2) + 4


def stage3_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload, ds: DeepSpeedSettings) -> None:
    """Stage 3: every rank runs the whole model, its parameters fetched module by module and its
    gradients reduce-scattered in ipg buckets (see above)."""
    embed, layers, head = split_blocks(w)
    m = stage_mesh(res)
    piece = Piece(embed, layers, head, m.groups("dp_shard"), m.groups("dp_replicate") if res.replicas > 1 else None)
    blocks = piece.blocks
    trace, ids = trace_of(blocks, w.arch)
    sched = fetch_schedule(trace, ds)
    at: dict[int, list[Fetch]] = {}
    for f in sched.fetches:
        at.setdefault(f.at, []).append(f)
    half, grad = DTYPE_BYTES[cfg.storage_precision], wire_bytes(cfg)
    overlap = ds.overlaps(3)
    recomputed = {b.name for b in layers}
    # backward's gradients in the order they are ready, and its ipg buckets: the same every micro-step
    buckets = ipg_buckets([trace.elems[pid] for tensors in ids[::-1] for pid in tensors[::-1]], ds.reduce_bucket_size)
    sends = {i: n for i, n in buckets if i is not None}
    rest = [n for i, n in buckets if i is None]

    def run(pass_: Stage3Pass, s: int, dur: float, phase: str) -> None:
        """Use `s` of the trace: its fetch, the wait, its prefetch, its compute (`dur` seconds)."""
        for f in at.get(s, []):
            if not f.prefetch:
                pass_.gather(f, phase)
        pass_.wait_gathers(phase)
        for f in at.get(s, []):
            if f.prefetch:
                pass_.gather(f, phase)
        pass_.pending += dur

    def forward(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after: Dep, tag: str) -> Dep:
        ps = Stage3Pass(p, rc, piece.shard, half, tag, after, prev=after)  # type: ignore[arg-type]
        s = 0
        for b, tensors in zip(blocks, ids, strict=True):
            dur = cm.block(b, mb).fwd_s
            if not tensors:
                ps.pending += dur
            for pid in tensors:
                run(ps, s, dur * trace.elems[pid] / b.params, "fwd")
                s += 1
        return ps.flush("fwd")

    def backward(
        p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after: Dep, sync: bool, tag: str
    ) -> tuple[Dep, list[int | None]]:
        ps = Stage3Pass(p, rc, piece.shard, half, tag, after, prev=after)  # type: ignore[arg-type]
        syncs: list[int | None] = []

        def send(n: int, ready: Dep) -> None:
            name = f"reduce_scatter_coalesced ipg bucket{tag}"
            rs = p.comm(rc, "rs", "reduce_scatter", piece.shard, n * grad, name, [ready], "sync")
            syncs.append(rs)
            if not overlap and rs is not None:  # on the compute stream: backward waits
                ps.waits.append(rs)

        s, g = trace.forward_uses, 0
        for b, tensors in zip(blocks[::-1], ids[::-1], strict=True):
            dur = cm.block(b, mb).bwd_s + (cm.recompute_s(b, mb) if b.name in recomputed else 0.0)
            if not tensors:
                ps.pending += dur
            for pid in tensors[::-1]:
                run(ps, s, dur * trace.elems[pid] / b.params, "bwd")
                if g in sends:  # this gradient sends the bucket before it
                    send(sends[g], ps.flush("bwd"))
                s, g = s + 1, g + 1
        last = ps.flush("bwd")
        if rest:
            send(rest[0], last)
        if sync and piece.replica is not None:  # MiCS: the partition across the replica groups
            whole = p.classes[rc].params / res.shard
            name = f"all_reduce shard gradients{tag}"
            syncs.append(p.comm(rc, "ar", "all_reduce", piece.replica, whole * grad, name, [syncs[-1], last], "sync"))
        return last, syncs

    def step(p: Plan, rc: int, cm: ComputeModel, pc: Piece, model_params: float, deps: list[Dep]) -> Dep:
        dur = cm.optimizer(p.classes[rc].params / res.shard, 1)  # one flat fp32 partition
        return p.add(rc, "compute", "optimizer", "optimizer step (own partition)", deps, duration=dur, phase="opt")

    data_parallel_plan(p, cm, cfg, res, w, piece, forward, backward, step=step)
