"""The plan of a pipeline with sharded stages, in-process: a unit all-gathers only when a forward
resharded it (plus the first), and a schedule's sends are waited for where pipelining waits for
them. tests/integration/test_plan_mirrors_pipeline.py compares the same plans with real runs."""

from __future__ import annotations

import pytest

from shardsim.config import load_config, resolve
from shardsim.simulator.compute import ComputeModel
from shardsim.simulator.plan import Plan
from shardsim.simulator.strategies.build import build_plan
from shardsim.simulator.strategies.pipeline import send_waits
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.hardware.topology import make_cluster

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
