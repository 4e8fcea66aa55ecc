"""DDP (strategy ddp, and the replicated stages of a pipeline): DistributedDataParallel's
reducer all-reduces gradient buckets as backward produces them, only on the last micro-step
(no_sync), asynchronously (on gloo too), so its all-reduces overlap backward.

Buckets as PyTorch's reducer holds them from the second step on (`Reducer::rebuild_buckets`,
after the first step has recorded the order gradients became ready; the first step's single
bucket is not modelled): in gradient-ready order (head, layers last to first, embedding), the
first capped at `dist._DEFAULT_FIRST_BUCKET_BYTES` (1 MiB), the rest at `bucket_cap_mb` (25 MiB),
counted in the gradients' own fp32 bytes (`compute_bucket_assignment_by_size`). A bucket's
all-reduce starts when its last gradient is ready; the last bucket's waits for the end of
backward, and the optimizer step for it: it is never hidden. With tensor parallelism every
DTensor parameter's gradient is ready at the end of backward (`grad_ready_bytes`). With
`reduce_dtype` fp16 / bf16 (PyTorch's fp16_compress_hook / bf16_compress_hook) the all-reduce
moves 2-byte gradients."""

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
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.parallel_dims import DATA

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
class BucketFill:
    """DDP's bucket assignment by size (`compute_bucket_assignment_by_size`): gradients fill
    buckets in the order backward produces them; a bucket closes when it reaches its cap (the
    first DDP_FIRST_BUCKET_BYTES, then DDP_BUCKET_BYTES, of fp32 gradients).

    Approximation (named): a block's gradients fill the buckets as one stream of bytes;
    PyTorch closes a bucket at the first parameter tensor that reaches the cap (so holds up to
    one tensor more)."""

    _bytes: float = 0.0
    _cap: float = DDP_FIRST_BUCKET_BYTES

    def add(self, nbytes: float) -> list[float]:
        """Gradients of `nbytes` (fp32): the fp32 bytes of each bucket they close."""
        self._bytes += nbytes
        closed: list[float] = []
        while self._bytes >= self._cap:
            closed.append(self._cap)
            self._bytes, self._cap = self._bytes - self._cap, DDP_BUCKET_BYTES
        return closed

    def flush(self) -> list[float]:
        """The end of backward: the last bucket's bytes (if it holds any)."""
        closed = [self._bytes] if self._bytes > 0 else []
        self._bytes, self._cap = 0.0, DDP_BUCKET_BYTES
        return closed


def grad_ready_groups(pc: Piece) -> list[tuple[list[Block], bool]]:
    """A replicated piece's backward in gradient-ready order (head, layers last to first,
    embedding) as (blocks, whether they recompute their forward): each group's blocks run, then
    their gradients are ready together."""
    return [(pc.head, False), *(([b], True) for b in pc.layers[::-1]), (pc.embed, False)]


def grad_ready_bytes(pc: Piece) -> list[float]:
    """The fp32 gradient bytes ready at the end of each group of `grad_ready_groups(pc)`: a
    group's plain parameters' as its backward ends, and every DTensor parameter's (tensor
    parallelism under DDP, `Block.dtensor_params`) with the last group, at the end of backward.

    Why (PyTorch's TP + DDP composition, ours `runtime.strategies.ddp.LocalShards` and PyTorch's
    `_pre_dp_module_transform` alike): DDP holds each DTensor's local shard, and the DTensors
    are rebuilt from them (`DTensor.from_local`) in a forward pre-hook, so their backward nodes
    are the graph's oldest; the autograd engine runs the ready node of the highest sequence
    number first, so those nodes, and the local shards' gradients, come after every block's
    backward (measured: experiments/validation/README.md, "DDP's buckets under tensor
    parallelism"). Every bucket holding a sharded parameter waits for the end of backward."""
    groups = grad_ready_groups(pc)
    ready = [sum(b.params - b.dtensor_params for b in bs) * float(GRAD_BYTES) for bs, _ in groups]
    ready[-1] += sum(b.dtensor_params for bs, _ in groups for b in bs) * float(GRAD_BYTES)
    return ready


def wire_bytes_per_grad(cfg: RunConfig) -> int:
    """Bytes per gradient a DDP bucket's all-reduce moves: 4 (fp32), or 2 with a compression hook."""
    return GRAD_BYTES if cfg.ddp_reduce_dtype == "fp32" else DTYPE_BYTES[cfg.ddp_reduce_dtype]


@dataclass
class GradBuckets:
    """DDP's gradient buckets on rank class `rc` (`BucketFill`): a bucket that reaches its cap is
    all-reduced over `replica` once the op that filled it is done, moving `reduce_bytes` per
    gradient; `flush` sends the last one.

    Approximation (named): a block's gradients are all ready when its backward op ends (a
    tensor's gradient may be ready before the end of its block's backward)."""

    p: Plan
    rc: int
    replica: GroupLayout
    tag: str
    reduce_bytes: int = GRAD_BYTES  # per gradient on the wire: 4 (fp32) or 2 (compression hook)
    cast_s_per_grad: float = 0.0  # the compression hook's casts, each way (0: no hook)
    ops: list[int | None] = field(default_factory=list)  # the all-reduces (and the hook's copies back)
    sizes: list[float] = field(default_factory=list)  # each bucket's fp32 bytes, in order
    fill: BucketFill = field(default_factory=BucketFill)

    def add(self, nbytes: float, ready: Dep) -> None:
        """Gradients of `nbytes` (fp32) produced by op `ready`."""
        for size in self.fill.add(nbytes):
            self._all_reduce(size, ready)

    def flush(self, ready: Dep) -> None:
        """The end of backward (op `ready`): all-reduce what the last bucket holds."""
        for size in self.fill.flush():
            self._all_reduce(size, ready)

    def _all_reduce(self, size: float, ready: Dep) -> None:
        name = f"AR bucket{self.tag}"
        grads = size / GRAD_BYTES
        self.sizes.append(size)
        cast = grads * self.cast_s_per_grad
        if cast > 0:
            ready = compute_op(self.p, self.rc, f"cast bucket{self.tag}", [ready], cast, "bwd")
        ar = self.p.comm(self.rc, "ar", "all_reduce", self.replica, grads * self.reduce_bytes, name, [ready], "sync")
        self.ops.append(ar)
        if cast > 0 and ar is not None:
            back = f"copy back bucket{self.tag}"
            self.ops.append(self.p.add(self.rc, "hook", "compute", back, [ar], duration=cast, phase="sync"))


def ddp_buckets(p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, replica: GroupLayout, tag: str) -> GradBuckets:
    """The buckets of `cfg`'s DDP: fp32 on the wire, or with a compression hook 2 bytes and its casts."""
    if cfg.ddp_reduce_dtype == "fp32":
        return GradBuckets(p, rc, replica, tag)
    cast = HOOK_CAST_BYTES / cm.mem_bytes_per_s
    return GradBuckets(p, rc, replica, tag, wire_bytes_per_grad(cfg), cast)


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
        groups = grad_ready_groups(pc)
        durs = [cm.block(b, mb).bwd_s + (cm.recompute_s(b, mb) if r else 0.0) for bs, r in groups for b in bs]
        blocks = [b for bs, _ in groups for b in bs]
        return blocks_through(p, rc, f"B{tag}", after, blocks, durs, "bwd", mb, tag), []
    prev: Dep = after
    buckets = ddp_buckets(p, rc, cm, cfg, rep, tag)
    for (blocks, recomputes), ready in zip(grad_ready_groups(pc), grad_ready_bytes(pc), strict=True):
        for b in blocks:
            dur = cm.block(b, mb).bwd_s + (cm.recompute_s(b, mb) if recomputes else 0.0)
            prev = block_op(p, rc, f"B {b.name}{tag}", [prev], dur, "bwd", b, mb, tag)
        buckets.add(ready, prev)
    buckets.flush(prev)
    return prev, buckets.ops


def ddp_piece(res: Resolved, w: Workload) -> Piece:
    """Strategy ddp's piece: the whole model, gradients all-reduced over the data-parallel ranks."""
    embed, layers, head = split_blocks(w)
    m = stage_mesh(res)
    return Piece(embed, layers, head, None, m.groups(*DATA))


def ddp_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Strategy ddp: every rank runs the whole model; gradients all-reduced over the world."""
    piece = ddp_piece(res, w)
    data_parallel_plan(p, cm, cfg, res, w, piece, ddp_forward, ddp_backward)
