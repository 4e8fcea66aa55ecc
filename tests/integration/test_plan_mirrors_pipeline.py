"""The plan of a pipeline with sharded stages issues the collectives a real run issues.

A real run (torchrun, gloo, CPU) of pipelining x FSDP2 records each rank's collectives
(SHARDSIM_TRACE_COLLECTIVES): every microbatch backward keeps units unsharded and skips
gradient sync, so a unit all-gathers only when a forward resharded it, and reduce-scatters
once per schedule step in perform_reduce_grad (with replicas, each shard is all-reduced
across them at the accumulation boundary). The first rank of each stage is compared, in
program order, with the plan's ops of its stage."""

from __future__ import annotations

import pytest

from shardsim.runtime.collective_trace import load_rank_trace
from shardsim.specs.model.library import PRESETS
from tests.runtime_batch import ModuleBatches, SessionBatches, register
from tests.unit.test_plan_mirrors_fsdp import assert_equal_up_to_padding, plan_collectives
from tests.unit.test_plan_pipeline import PP, SHARD, pipeline_args, planned

TRACED = {  # id: (world, schedule, microbatches, accum)
    "gpipe": (4, "gpipe", 4, 1),
    "1f1b": (4, "1f1b", 4, 1),
    "1f1b-accum2": (4, "1f1b", 4, 2),
    "1f1b-2-replicas-accum2": (8, "1f1b", 2, 2),
}


def run_flags(opts: dict) -> list[str]:
    return [*(f"--{k.replace('_', '-')}={v}" for k, v in opts.items() if k != "checkpointing"), "--no-checkpointing"]


register(
    "traced",
    {
        name: (world, run_flags(pipeline_args(schedule, accum, microbatches)))
        for name, (world, schedule, microbatches, accum) in TRACED.items()
    },
    save_params=False,
    trace=True,
)


@pytest.fixture(scope="module")
def batches(runtime_batches: SessionBatches) -> ModuleBatches:
    """The traced runs, in the session's launches of 4 and 8 ranks (`tests.runtime_batch`)."""
    return runtime_batches.module("traced")


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TRACED))
def test_sharded_pipeline_plan_equals_real_run(batches: ModuleBatches, case: str) -> None:
    world, schedule, microbatches, accum = TRACED[case]
    opts = pipeline_args(schedule, accum, microbatches)
    trace_dir = batches[case].folder / "trace"
    batches[case].ok()
    plan, precision = planned(opts, world)
    row = 2 * PRESETS["tiny-gpt"].hidden
    for stage in range(PP):  # stage 0: embedding + 2 blocks; stage 1: 2 blocks + head
        rank = stage * world // PP
        want = plan_collectives(plan, precision, rank_class=stage)
        steps = load_rank_trace(trace_dir, rank)
        assert steps, f"rank {rank} traced no step"
        for step in steps:  # every measured step (the warm-up step also infers shapes)
            assert_equal_up_to_padding(want, [(c.kind, c.numel, c.group_size) for c in step], row, SHARD)
