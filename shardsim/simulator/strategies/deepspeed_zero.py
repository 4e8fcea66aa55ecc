"""DeepSpeed's ZeRO (library deepspeed) as deepspeed/runtime/zero/stage_1_and_2.py and stage3.py
run it: the memory of its partitioning (`zero_states`) and the step of stages 1 and 2
(`deepspeed_plan`); stage 3's step and fetches are `deepspeed_stage3`'s.

Each choice, where DeepSpeed makes it:
- Partitioning (`DeepSpeedZeroOptimizer.__init__`): the half-precision parameters are flattened
  per parameter group (`bit16_groups_flat`) and split into dp equal partitions
  (`get_data_parallel_partitions`); each rank keeps the fp32 master copy of its partition
  (`single_partition_of_fp32_groups`) and the optimizer's state of it. Stages 1 and 2 keep the
  half-precision parameters whole; stage 3 (`DeepSpeedZeroOptimizer_Stage3`) partitions them too
  (`partition_parameters.py`), keeping whole those under ``stage3_param_persistence_threshold``
  elements.
- Gradients: half precision (`param.grad`), copied into an ipg bucket of
  ``reduce_bucket_size`` elements as backward makes them (`reduce_independent_p_g_buckets_and_remove_grads`;
  at stages 1 and 2 two buffers alternate under ``overlap_comm``, `ipg_buckets`' double buffer;
  stage 3 reduce-scatters its one bucket, `__avg_scatter_grads`: `reduce_scatter_coalesced`). A full
  bucket is reduced (`average_tensor`): with ``reduce_scatter`` and
  ``use_multi_rank_bucket_allreduce`` (both DeepSpeed's defaults) one all-reduce of the bucket
  whose owners keep their slices (`allreduce_and_scatter`); with ``reduce_scatter`` alone one
  `dist.reduce` to each owner, planned as a reduce-scatter of the bucket (the same bytes a rank
  sends, one collective); without it, an all-reduce (`gradient_reduction_w_predivide`). The
  owner copies its slice into its partition's gradient buffer (`grads_in_partition`,
  ``contiguous_gradients``). Stage 2 reduces every micro-step (`partition_gradients`) and frees
  the other ranks' gradients; stage 1 reduces on the gradient-accumulation boundary only
  (`reduce_ready_partitions_and_remove_grads`) and keeps `param.grad` whole.
- Streams: with ``overlap_comm`` (DeepSpeed's default at stage 3 only, `overlap_comm_valid`) a
  bucket is reduced on `reduction_stream` while backward goes on; without it on the current
  stream, so backward waits for each reduction. Stage 1 without ``overlap_comm`` reduces after
  backward (`reduce_gradients`).
- The step (`step`): each rank converts its partition's gradients to fp32
  (`single_grad_partition`, alive during the step), steps its fp32 partition, copies it into its
  half-precision partition, and all-gathers the partitions: `all_gather_into_tensor` of the
  whole flat group where the backend has it (NCCL: `all_gather_dp_groups`, which then ignores
  ``allgather_bucket_size``; the bucketed path is gloo's).
- Communication dtype: the parameters' (``communication_data_type``, shardsim's `reduce_dtype`,
  where given).

- Stage 3's gathered parameters: the most its coordinator holds alive at once over a step
  (`deepspeed_stage3.fetch_schedule`: the modules in use, those prefetched and those kept for
  reuse within ``stage3_max_reuse_distance``), the gradient of the largest tensor before it is
  copied into the bucket, and the bucket.

Approximations (named): a block's gradients are ready together when its backward ends (as
`ddp`); the overflow check and gradient norm (two scalar all-reduces) are left out; a parameter
larger than the bucket is reduced in its own bucket by DeepSpeed (`extra_large_param_to_reduce`),
here the bucket stream splits it.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardsim.config import Resolved, RunConfig
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.simulator.compute import DTYPE_BYTES, ComputeModel
from shardsim.simulator.plan import Dep, Plan
from shardsim.simulator.strategies.ddp import GRAD_BYTES, BucketFill, GradBuckets, ddp_backward, ddp_forward, ddp_piece
from shardsim.simulator.strategies.deepspeed_stage3 import (
    block_tensors,
    fetch_schedule,
    stage3_plan,
    trace_of,
    wire_bytes,
)
from shardsim.simulator.strategies.steps import Piece, block_op, data_parallel_plan
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.workload import Block, Workload
from shardsim.specs.strategies import ZERO1

FP32 = 4  # bytes of the master weights, the optimizer's state and the step's gradient partition
DEEPSPEED_STAGES = (1, 2, 3)  # the stages library deepspeed plans and sizes its own way (0: PyTorch's DDP)


def stage_of(cfg: RunConfig) -> int:
    """The ZeRO stage of library deepspeed's kind (`config.deepspeed.STAGES`): zero1 is stage 1,
    a sharded kind without resharding stage 2, with it stage 3; ddp stage 0."""
    s = cfg.strategy
    if s.kind == ZERO1.name:
        return 1
    if not s.spec.fsdp:
        return 0
    return 3 if s.reshard_after_forward else 2


def settings(cfg: RunConfig) -> DeepSpeedSettings:
    """The run's DeepSpeed settings (DeepSpeed's defaults where none were given)."""
    return cfg.deepspeed or DeepSpeedSettings()


@dataclass(frozen=True)
class ZeroStates:
    """Bytes one rank holds under a DeepSpeed stage, by part (`memory.MemoryBreakdown`'s)."""

    params: float  # half-precision parameters (whole, or a partition) + the fp32 master partition
    grads: float  # half-precision gradients (whole, or the partition's buffer)
    optimizer: float  # the optimizer's fp32 state of the partition
    gathered: float  # the gradient bucket(s); stage 3: and the fetched parameters alive at once
    step: float  # the fp32 gradient partition, alive during the optimizer step

    @property
    def model_states(self) -> float:
        """What DeepSpeed's estimators count: parameters, gradients, optimizer state and the
        step's fp32 gradients (`estimate_zero2_model_states_mem_needs`: 2 + 18 / N bytes a parameter)."""
        return self.params + self.grads + self.optimizer + self.step


def zero_states(
    stage: int,
    params: float,
    dp: int,
    half: int,
    words: float,
    ds: DeepSpeedSettings,
    live: float = 0.0,
    persistent: float = 0.0,
) -> ZeroStates:
    """A rank's bytes under DeepSpeed's `stage` (1, 2, 3) for `params` parameters partitioned over
    `dp` ranks, `half` bytes a half-precision element (4 in fp32 training), the optimizer keeping
    `words` fp32 words a parameter (Adam's 2); stage 3: the gathered elements alive at most
    (`live`: fetched parameters, and a gradient before its bucket) and the parameters kept whole
    (`persistent`, under ``stage3_param_persistence_threshold``)."""
    part = params / dp
    master = FP32 * part
    # the ipg bucket's buffer: stages 1 and 2 a second one under overlap_comm (`ipg_buckets`' double
    # buffer, with contiguous_gradients), stage 3 one; never more than the gradients
    buffers = 2 if stage < 3 and ds.overlaps(stage) and ds.contiguous_gradients else 1
    bucket = buffers * half * min(float(ds.reduce_bucket_size), params)
    if stage == 3:
        held = half * ((params - persistent) / dp + persistent)
        return ZeroStates(held + master, half * part, FP32 * words * part, half * live + bucket, FP32 * part)
    grads = half * params + (half * part if ds.contiguous_gradients else 0.0) if stage == 1 else half * part
    return ZeroStates(half * params + master, grads, FP32 * words * part, bucket, FP32 * part)


def bucket_collective(ds: DeepSpeedSettings) -> str:
    """The collective a full bucket is reduced with (`average_tensor`, above)."""
    return "reduce_scatter" if ds.reduce_scatter and not ds.use_multi_rank_bucket_allreduce else "all_reduce"


class IpgFill(BucketFill):
    """DeepSpeed's ipg bucket: closes at ``reduce_bucket_size`` elements (counted, as `BucketFill`
    counts, in GRAD_BYTES a gradient), every bucket the same size."""

    def __init__(self, elements: int) -> None:
        super().__init__(0.0, float(max(elements, 1) * GRAD_BYTES))

    def add(self, nbytes: float) -> list[float]:
        self._bytes += nbytes
        full = int(self._bytes // self._cap)
        self._bytes -= full * self._cap
        return [self._cap] * full

    def flush(self) -> list[float]:
        closed = [self._bytes] if self._bytes > 0 else []
        self._bytes = 0.0
        return closed


@dataclass
class DeepSpeedBuckets(GradBuckets):
    """The ipg buckets' reductions (`GradBuckets` with DeepSpeed's size, dtype and collective)."""

    collective: str = "all_reduce"

    def _all_reduce(self, size: float, ready: Dep) -> None:
        name = f"{self.collective} ipg bucket{self.tag}"
        grads = size / GRAD_BYTES
        self.sizes.append(size)
        op = self.p.comm(self.rc, "ar", self.collective, self.replica, grads * self.reduce_bytes, name, [ready], "sync")
        self.ops.append(op)


def _groups(pc: Piece) -> list[tuple[list[Block], bool]]:
    """Backward in gradient-ready order (head, layers last to first, embedding), as DDP's."""
    return [(pc.head, False), *(([b], True) for b in pc.layers[::-1]), (pc.embed, False)]


def deepspeed_plan(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Stages 1 and 2: every rank runs the whole model; gradients reduced in ipg buckets, each
    rank steps its partition and the updated half-precision partitions are all-gathered."""
    stage = stage_of(cfg)
    ds = settings(cfg)
    overlap = ds.overlaps(stage)
    piece = ddp_piece(res, w)
    half = DTYPE_BYTES[cfg.storage_precision]
    dp = res.dp

    def backward(
        p: Plan, rc: int, cm: ComputeModel, cfg: RunConfig, mb: int, pc: Piece, after: Dep, sync: bool, tag: str
    ) -> tuple[Dep, list[int | None]]:
        reduces = sync or stage == 2  # stage 2 reduces every micro-step, stage 1 on the boundary
        if not reduces or pc.replica is None:
            return ddp_backward(p, rc, cm, cfg, mb, pc, after, False, tag)
        fill = IpgFill(ds.reduce_bucket_size)
        buckets = DeepSpeedBuckets(p, rc, pc.replica, tag, wire_bytes(cfg), fill=fill, collective=bucket_collective(ds))
        prev: Dep = after
        if stage == 1 and not overlap:  # `reduce_gradients` after backward, on the current stream
            prev, _ = ddp_backward(p, rc, cm, cfg, mb, pc, after, False, tag)
            buckets.add(sum(b.params for b in pc.blocks) * float(GRAD_BYTES), prev)
            buckets.flush(prev)
            return buckets.ops[-1] if buckets.ops else prev, buckets.ops
        for blocks, recomputes in _groups(pc):
            for b in blocks:
                dur = cm.block(b, mb).bwd_s + (cm.recompute_s(b, mb) if recomputes else 0.0)
                prev = block_op(p, rc, f"B {b.name}{tag}", [prev], dur, "bwd", b, mb, tag)
            done = len(buckets.ops)
            buckets.add(sum(b.params for b in blocks) * float(GRAD_BYTES), prev)
            if not overlap and len(buckets.ops) > done and buckets.ops[-1] is not None:
                prev = buckets.ops[-1]  # the current stream waits for the reduction
        buckets.flush(prev)
        return prev, buckets.ops

    def step(p: Plan, rc: int, cm: ComputeModel, pc: Piece, model_params: float, deps: list[Dep]) -> Dep:
        whole = p.classes[rc].params  # the model's (the kind's own sharding is not DeepSpeed's)
        dur = cm.optimizer(whole / dp, 1)  # one flat fp32 partition a parameter group
        prev: Dep = p.add(rc, "compute", "optimizer", "optimizer step (own partition)", deps, duration=dur, phase="opt")
        name = "all_gather_into_tensor updated partitions"
        return p.comm(rc, "ar", "all_gather", pc.replica, whole * half, name, [prev], "sync") or prev

    data_parallel_plan(p, cm, cfg, res, w, piece, ddp_forward, backward, step=step)


def rank_states(
    cfg: RunConfig, res: Resolved, blocks: list[Block], params: float, words: float, arch: Arch | None = None
) -> ZeroStates:
    """`zero_states` of a rank of `cfg` running `params` parameters (`blocks`' of `arch`): partitioned over
    the data-parallel ranks (stage 3: over the shard group, MiCS's where it is smaller; the
    gathered and persistent elements of its fetch schedule, `deepspeed_stage3.fetch_schedule`)."""
    stage = stage_of(cfg)
    ds = settings(cfg)
    half = DTYPE_BYTES[cfg.storage_precision]
    if stage != 3:
        return zero_states(stage, params, res.dp, half, words, ds)
    sched = fetch_schedule(trace_of(blocks, arch)[0], ds)
    largest = max((t for b in blocks for t in block_tensors(b, arch)), default=0)  # its gradient before the bucket
    live = float(sched.peak_live + largest)
    return zero_states(stage, params, res.shard, half, words, ds, live, float(sched.persistent))


def plan_deepspeed(p: Plan, cm: ComputeModel, cfg: RunConfig, res: Resolved, w: Workload) -> None:
    """Library deepspeed's step at its stage: 1 and 2 `deepspeed_plan`, 3 `deepspeed_stage3`'s."""
    if stage_of(cfg) == 3:
        stage3_plan(p, cm, cfg, res, w, settings(cfg))
    else:
        deepspeed_plan(p, cm, cfg, res, w)
