"""`DeepSpeedSettings`: the knobs of DeepSpeed's ZeRO that change a step's time or memory (the
``deepspeed`` key of a configuration, filled from a ``zero_optimization`` block), each with
DeepSpeed's default (deepspeed/runtime/zero/config.py, `DeepSpeedZeroConfig`), and the batch
DeepSpeed checks (``train_batch_size``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from shardsim.config.frozen import Frozen

Count = Annotated[int, Field(ge=0)]


class DeepSpeedSettings(Frozen):
    """What `library: deepspeed` plans with (`simulator.strategies.deepspeed_zero`); sizes are
    elements, as DeepSpeed counts them."""

    reduce_bucket_size: Count = 500_000_000  # gradient elements a reduction bucket holds
    allgather_bucket_size: Count = 500_000_000  # stages 1, 2 without all_gather_into_tensor (not NCCL); not stage 3
    overlap_comm: bool | None = None  # reductions on a side stream; None: DeepSpeed's default, true at stage 3
    contiguous_gradients: bool = True  # a rank's gradient partition copied into one buffer as it is reduced
    reduce_scatter: bool = True  # stages 1 and 2: bucket slices reduced to their owners (else all-reduced)
    use_multi_rank_bucket_allreduce: bool = True  # with reduce_scatter: a bucket's slices in one all-reduce
    stage3_prefetch_bucket_size: Count = 50_000_000  # parameter elements fetched ahead of use
    stage3_param_persistence_threshold: Count = 100_000  # parameters of fewer elements are kept whole
    stage3_max_live_parameters: Count = 1_000_000_000  # gathered parameter elements alive at most
    stage3_max_reuse_distance: Count = 1_000_000_000  # a parameter used again within this many is kept
    train_batch_size: Annotated[int, Field(ge=1)] | None = None  # checked: micro-batch x accumulation x dp ranks

    def overlaps(self, stage: int) -> bool:
        """Whether reductions run on DeepSpeed's side stream (`overlap_comm_valid`: unset, stage 3 only)."""
        return self.overlap_comm if self.overlap_comm is not None else stage == 3
