"""The plan of a pipeline with sharded stages issues the collectives a real run issues.

A real run (torchrun, gloo, CPU) of pipelining x FSDP2 records each rank's collectives
(SHARDSIM_TRACE_COLLECTIVES): every microbatch backward keeps units unsharded and skips
gradient sync, so a unit all-gathers only when a forward resharded it, and reduce-scatters
once per schedule step in perform_reduce_grad (with replicas, each shard is all-reduced
across them at the accumulation boundary). The first rank of each stage is compared, in
program order, with the plan's ops of its stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardsim.config import load_config, resolve
from shardsim.runtime.collective_trace import TRACE_ENV, load_rank_trace
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.plan import Plan
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.pipeline import send_waits
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster
from shardsim.specs.model.library import PRESETS
from tests.integration.test_runtime_strategies import shardsim_run
from tests.runtime_batch import Batches
from tests.unit.test_plan_mirrors_fsdp import assert_equal_up_to_padding, plan_collectives

WORLD, PP, SHARD, MICROBATCHES = 4, 2, 2, 4


def pipeline_args(schedule: str, accum: int, microbatches: int = MICROBATCHES) -> dict:
    return {
        "workload": "tiny-gpt",
        "strategy": "pipeline",
        "pp": PP,
        "degree": SHARD,
        "microbatches": microbatches,
        "schedule": schedule,
        "grad_accum": accum,
        "checkpointing": False,
    }


def planned(opts: dict, world: int = WORLD) -> tuple[Plan, str]:
    """The simulator's plan for the run's configuration (as simulator.predict builds it)."""
    cfg = load_config(None, {"topology": "emu-2x2", **opts})
    w = load_workload(cfg.workload)
    cfg, res = resolve(cfg, world, len(w.layers))
    device = make_cluster(cfg.topology, cfg.nodes).instance.device
    return build_plan(cfg, res, w, ComputeModel(device, cfg.precision)), cfg.precision


TRACED = {  # id: (world, schedule, microbatches, accum)
    "gpipe": (4, "gpipe", 4, 1),
    "1f1b": (4, "1f1b", 4, 1),
    "1f1b-accum2": (4, "1f1b", 4, 2),
    "1f1b-2-replicas-accum2": (8, "1f1b", 2, 2),
}


def run_flags(opts: dict) -> list[str]:
    return [*(f"--{k.replace('_', '-')}={v}" for k, v in opts.items() if k != "checkpointing"), "--no-checkpointing"]


@pytest.fixture(scope="module")
def batches(tmp_path_factory: pytest.TempPathFactory) -> Batches:
    """The traced runs of 4 ranks in one torchrun launch (`tests.runtime_batch`); the 8-rank one
    launches ``shardsim run`` alone."""
    cases = {
        name: (world, run_flags(pipeline_args(schedule, accum, microbatches)))
        for name, (world, schedule, microbatches, accum) in TRACED.items()
        if world == WORLD
    }
    return Batches(tmp_path_factory.mktemp("traced"), cases, save_params=False, trace=True)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(TRACED))
def test_sharded_pipeline_plan_equals_real_run(tmp_path: Path, batches: Batches, case: str) -> None:
    world, schedule, microbatches, accum = TRACED[case]
    opts = pipeline_args(schedule, accum, microbatches)
    if case in batches.cases:
        trace_dir = batches[case].folder / "trace"
        batches[case].ok()
    else:
        trace_dir = tmp_path / "trace"
        proc, _ = shardsim_run(tmp_path, [*run_flags(opts), "--nproc", str(world)], env={TRACE_ENV: str(trace_dir)})
        assert proc.returncode == 0, proc.stderr[-3000:]
    plan, precision = planned(opts, world)
    row = 2 * PRESETS["tiny-gpt"].hidden
    for stage in range(PP):  # stage 0: embedding + 2 blocks; stage 1: 2 blocks + head
        rank = stage * world // PP
        want = plan_collectives(plan, precision, rank_class=stage)
        steps = load_rank_trace(trace_dir, rank)
        assert steps, f"rank {rank} traced no step"
        for step in steps:  # every measured step (the warm-up step also infers shapes)
            assert_equal_up_to_padding(want, [(c.kind, c.numel, c.group_size) for c in step], row, SHARD)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("accum", [1, 3])
def test_each_block_gathers_once_per_forward_resharding_it_plus_once(schedule: str, accum: int) -> None:
    """Per block and schedule step: a gather for every op that follows a forward (the
    forward resharded the block) plus the first: M + 1 in GPipe and 1F1B alike; the root
    once per step; one reduce-scatter per unit and step."""
    plan, precision = planned(pipeline_args(schedule, accum))
    for stage in range(PP):
        ops = [op for op in plan.ops if op.rank_class == stage and op.kind == "comm" and op.coll != "send_recv"]
        blocks = [n for n, _ in plan.classes[stage].units if n != "root"]
        for b in blocks:
            assert (
                sum(op.name.startswith(("AG ", "AG' ")) and f" {b} " in op.name for op in ops)
                == (MICROBATCHES + 1) * accum
            )
        assert sum(op.name.startswith("AG root") for op in ops) == accum
        assert sum(op.coll == "reduce_scatter" for op in ops) == len(plan.classes[stage].units) * accum
        assert all(op.coll != "all_reduce" for op in ops)  # one shard group per stage: no replicas


def test_send_waits_follow_the_schedules() -> None:
    """GPipe waits for every forward send before its first backward; 1F1B's steady phase
    waits for the previous op's send, its warm-up and cool-down for the one before that."""
    assert send_waits("gpipe", 0, 2, 3) == [[], [], [], [0, 1, 2], [], []]
    # stage 0 of 2, 4 microbatches: F0 F1 | B0 F2 B1 F3 B2 | B3
    assert send_waits("1f1b", 0, 2, 4) == [[], [], [0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5]]
