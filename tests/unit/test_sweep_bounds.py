"""The pieces of the compute bound read the plan's own rules: a sharded pipeline stage's
all-gathers (`fsdp.step_gathers`) are the plan's, step by step and stage by stage."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig
from shardsim.simulator.compute import DTYPE_BYTES
from shardsim.simulator.predict import prepare
from shardsim.simulator.strategies.ddp import DDP_BUCKET_BYTES, DDP_FIRST_BUCKET_BYTES, BucketFill
from shardsim.simulator.strategies.fsdp import step_gathers
from shardsim.simulator.strategies.pipeline import schedule_order, stage_pieces


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("pp", "degree", "microbatches"), [(2, 2, 2), (2, 4, 4), (4, 2, 8)])
def test_the_gathers_of_a_sharded_stage_are_the_plans(schedule, pp, degree, microbatches) -> None:
    cfg = RunConfig(
        workload="tiny-gpt",
        topology="p4d.24xlarge",
        nodes=2,
        precision="bf16",
        grad_accum=2,
        strategy={"kind": "pipeline", "pp": pp, "degree": degree, "microbatches": microbatches, "schedule": schedule},
    )
    s = prepare(cfg)
    plan = s.plan()
    pbytes = DTYPE_BYTES[cfg.precision]
    for st, pc in enumerate(stage_pieces(s.res, s.ranks_workload)):
        planned = [
            op.nbytes for op in plan.ops if op.rank_class == st and op.coll == "all_gather" and op.name.endswith(" [0]")
        ]
        order = schedule_order(schedule, st, pp, s.res.microbatches)
        counted = [params * pbytes for params, _, _ in step_gathers(pc, order)]
        assert counted == planned and counted, (st, len(counted), len(planned))


def test_buckets_close_at_their_caps() -> None:
    fill = BucketFill()
    assert fill.add(DDP_FIRST_BUCKET_BYTES / 2) == []
    assert fill.add(DDP_FIRST_BUCKET_BYTES) == [DDP_FIRST_BUCKET_BYTES]  # the first bucket's cap, then the rest's
    assert fill.add(DDP_BUCKET_BYTES * 2) == [DDP_BUCKET_BYTES, DDP_BUCKET_BYTES]
    assert fill.flush() == [DDP_FIRST_BUCKET_BYTES / 2]
    assert fill.flush() == []
