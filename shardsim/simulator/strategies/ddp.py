"""DDP (strategy ddp, and the replicated stages of a pipeline): DistributedDataParallel's
reducer all-reduces gradient buckets as backward produces them, only on the last micro-step
(no_sync), asynchronously (on gloo too), so its all-reduces overlap backward."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.steps import Piece, compute_op, data_parallel_plan, run_through, split_blocks
from shardsim.simulator.workload.model import Workload

DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.nn.parallel.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel(bucket_cap_mb=25)
GRAD_BYTES = 4  # DDP keeps and all-reduces fp32 gradients under autocast (reduce_dtype other than fp32 is refused)


@dataclass
class GradBuckets:
    """DDP's gradient buckets on rank class `rc`: gradients fill a bucket in the order backward
    produces them; a full one (the first at DDP_FIRST_BUCKET_BYTES, then DDP_BUCKET_BYTES) is
    all-reduced over `replica` once the op that filled it is done; `flush` sends the last one."""

    p: Plan
    rc: int
    replica: GroupLayout
    tag: str
    ops: list[int | None] = field(default_factory=list)  # the all-reduces
    _bytes: float = 0.0
    _cap: float = DDP_FIRST_BUCKET_BYTES

    def add(self, nbytes: float, ready: Dep) -> None:
        """Gradients of `nbytes` produced by op `ready`."""
        self._bytes += nbytes
        if self._bytes >= self._cap:
            self._all_reduce(ready)

    def flush(self, ready: Dep) -> None:
        """The end of backward (op `ready`): all-reduce what the last bucket holds."""
        if self._bytes > 0:
            self._all_reduce(ready)

    def _all_reduce(self, ready: Dep) -> None:
        name = f"AR bucket{self.tag}"
        self.ops.append(self.p.comm(self.rc, "ar", "all_reduce", self.replica, self._bytes, name, [ready], "sync"))
        self._bytes, self._cap = 0.0, DDP_BUCKET_BYTES


def ddp_forward(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after: Dep, tag: str) -> int:
    """Forward of a replicated piece: its blocks back to back (`run_through`)."""
    return run_through(p, rc, f"F{tag}", after, [cm.block(b, mb).fwd_s for b in pc.blocks], "fwd")


def ddp_backward(
    p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after: Dep, sync: bool, tag: str
) -> tuple[Dep, list[int | None]]:
    """Backward of a replicated piece, with `sync` (not under no_sync) and replicas its gradient
    buckets' all-reduces. Returns (last compute op, the all-reduces)."""
    rep = pc.replica
    if not sync or rep is None:  # no gradient bucket waits on a block: one op
        durs = [cm.block(b, mb).bwd_s for b in pc.head]
        durs += [cm.block(b, mb).bwd_s + cm.recompute_s(b, mb) for b in pc.layers[::-1]]
        durs += [cm.block(b, mb).bwd_s for b in pc.embed]
        return run_through(p, rc, f"B{tag}", after, durs, "bwd"), []
    prev = after
    for b in pc.head:
        prev = compute_op(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd")
    buckets = GradBuckets(p, rc, rep, tag)
    for b in pc.head:
        buckets.add(b.params * GRAD_BYTES, prev)
    for b in pc.layers[::-1]:
        c = cm.block(b, mb)
        prev = compute_op(p, rc, f"B {b.name}{tag}", [prev], c.bwd_s + cm.recompute_s(b, mb), "bwd")
        buckets.add(b.params * GRAD_BYTES, prev)
    for b in pc.embed:
        prev = compute_op(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd")
    for b in pc.embed:
        buckets.add(b.params * GRAD_BYTES, prev)
    buckets.flush(prev)
    return prev, buckets.ops


def ddp_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategy ddp: every rank runs the whole model; gradients all-reduced over the world."""
    embed, layers, head = split_blocks(w)
    piece = Piece(embed, layers, head, None, GroupLayout(0, res.world, res.world))
    data_parallel_plan(p, cm, cfg, res, w, piece, ddp_forward, ddp_backward)
