"""DDP (strategy ddp, and the replicated stages of a pipeline): DistributedDataParallel's
reducer all-reduces gradient buckets as backward produces them, only on the last micro-step
(no_sync), asynchronously (on gloo too), so its all-reduces overlap backward.

Buckets as PyTorch's reducer holds them from the second step on (`Reducer::rebuild_buckets`,
after the first step has recorded the order gradients became ready; the first step's single
bucket is not modelled): in gradient-ready order (head, layers last to first, embedding), the
first capped at `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB), the rest at `bucket_cap_mb` (25 MiB),
counted in the gradients' own fp32 bytes (`compute_bucket_assignment_by_size`). A bucket's
all-reduce starts when its last gradient is ready; the last bucket's waits for the end of
backward, and the optimizer step for it: it is never hidden. With `reduce_dtype` fp16 / bf16
(PyTorch's fp16_compress_hook / bf16_compress_hook) the all-reduce moves 2-byte gradients."""

from __future__ import annotations

from dataclasses import dataclass, field

from shardsim.config import Resolved, RunConfig
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.network.collectives import GroupLayout
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.mesh import stage_mesh
from shardsim.simulator.strategies.steps import (
    Piece,
    block_op,
    blocks_through,
    compute_op,
    data_parallel_plan,
    split_blocks,
)
from shardsim.simulator.workload.model import Workload

DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_BUCKET_BYTES = 25 * 1024 * 1024  # DistributedDataParallel(bucket_cap_mb=25)
GRAD_BYTES = 4  # DDP's gradients (and its buckets' caps) are fp32 under autocast
# The compression hook's casts (default_hooks._compress_hook): `bucket.buffer().to(dtype)`
# reads 4 and writes 2 bytes per gradient before the all-reduce, on the compute stream; the
# copy back into the fp32 bucket (`copy_` in its future's callback) reads 2 and writes 4 after
# it, on a stream of its own (a CUDA future's callbacks run on pool streams). The in-place
# division by the world size is left out, as it is on the fp32 path.
HOOK_CAST_BYTES = 6  # per gradient, each way


@dataclass
class GradBuckets:
    """DDP's gradient buckets on rank class `rc`: gradients fill buckets in the order backward
    produces them; a bucket that reaches its cap (the first DDP_FIRST_BUCKET_BYTES, then
    DDP_BUCKET_BYTES, of fp32 gradients) is all-reduced over `replica` once the op that filled it
    is done, moving `reduce_bytes` per gradient; `flush` sends the last one.

    Approximation (named): a block's gradients fill the buckets as one stream of bytes, all
    ready when its backward op ends; PyTorch closes a bucket at the first parameter tensor that
    reaches the cap (so holds up to one tensor more), and that tensor's gradient may be ready
    before the end of its block's backward."""

    p: Plan
    rc: int
    replica: GroupLayout
    tag: str
    reduce_bytes: int = GRAD_BYTES  # per gradient on the wire: 4 (fp32) or 2 (compression hook)
    cast_s_per_grad: float = 0.0  # the compression hook's casts, each way (0: no hook)
    ops: list[int | None] = field(default_factory=list)  # the all-reduces (and the hook's copies back)
    sizes: list[float] = field(default_factory=list)  # each bucket's fp32 bytes, in order
    _bytes: float = 0.0
    _cap: float = DDP_FIRST_BUCKET_BYTES

    def add(self, nbytes: float, ready: Dep) -> None:
        """Gradients of `nbytes` (fp32) produced by op `ready`."""
        self._bytes += nbytes
        while self._bytes >= self._cap:
            over = self._bytes - self._cap
            self._bytes = self._cap
            self._all_reduce(ready)
            self._bytes = over

    def flush(self, ready: Dep) -> None:
        """The end of backward (op `ready`): all-reduce what the last bucket holds."""
        if self._bytes > 0:
            self._all_reduce(ready)

    def _all_reduce(self, ready: Dep) -> None:
        name = f"AR bucket{self.tag}"
        grads = self._bytes / GRAD_BYTES
        self.sizes.append(self._bytes)
        cast = grads * self.cast_s_per_grad
        if cast > 0:
            ready = compute_op(self.p, self.rc, f"cast bucket{self.tag}", [ready], cast, "bwd")
        ar = self.p.comm(self.rc, "ar", "all_reduce", self.replica, grads * self.reduce_bytes, name, [ready], "sync")
        self.ops.append(ar)
        if cast > 0 and ar is not None:
            back = f"copy back bucket{self.tag}"
            self.ops.append(self.p.add(self.rc, "hook", "compute", back, [ar], duration=cast, phase="sync"))
        self._bytes, self._cap = 0.0, DDP_BUCKET_BYTES


def ddp_buckets(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, replica: GroupLayout, tag: str) -> GradBuckets:
    """The buckets of `cfg`'s DDP: fp32 on the wire, or with a compression hook 2 bytes and its casts."""
    dtype = cfg.ddp_reduce_dtype
    if dtype == "fp32":
        return GradBuckets(p, rc, replica, tag)
    cast = HOOK_CAST_BYTES / cm.mem_bytes_per_s
    return GradBuckets(p, rc, replica, tag, DTYPE_BYTES[dtype], cast)


def ddp_forward(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after: Dep, tag: str) -> Dep:
    """Forward of a replicated piece: its blocks back to back (`blocks_through`)."""
    durs = [cm.block(b, mb).fwd_s for b in pc.blocks]
    return blocks_through(p, rc, f"F{tag}", after, pc.blocks, durs, "fwd", mb, tag)


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
        blocks = [*pc.head, *pc.layers[::-1], *pc.embed]
        return blocks_through(p, rc, f"B{tag}", after, blocks, durs, "bwd", mb, tag), []
    prev: Dep = after
    for b in pc.head:
        prev = block_op(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd", b, mb, tag)
    buckets = ddp_buckets(p, rc, cm, cfg, rep, tag)
    for b in pc.head:
        buckets.add(b.params * GRAD_BYTES, prev)
    for b in pc.layers[::-1]:
        c = cm.block(b, mb)
        prev = block_op(p, rc, f"B {b.name}{tag}", [prev], c.bwd_s + cm.recompute_s(b, mb), "bwd", b, mb, tag)
        buckets.add(b.params * GRAD_BYTES, prev)
    for b in pc.embed:
        prev = block_op(p, rc, f"B {b.name}{tag}", [prev], cm.block(b, mb).bwd_s, "bwd", b, mb, tag)
    for b in pc.embed:
        buckets.add(b.params * GRAD_BYTES, prev)
    buckets.flush(prev)
    return prev, buckets.ops


def ddp_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategy ddp: every rank runs the whole model; gradients all-reduced over the world."""
    embed, layers, head = split_blocks(w)
    m = stage_mesh(res)
    piece = Piece(embed, layers, head, None, m.dp_groups(m.dp))
    data_parallel_plan(p, cm, cfg, res, w, piece, ddp_forward, ddp_backward)
