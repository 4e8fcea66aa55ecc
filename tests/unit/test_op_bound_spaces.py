"""The op bound leaves no layout of dense training today out: every pipeline layout of
llama-3.1-70b on 16 x p5.48xlarge and of llama-3.1-405b on 64 x p5.48xlarge at 8,192 tokens
(pp up to 16, up to 64 microbatches, every schedule with up to 4 stages per rank) is within
`scale.MAX_PLAN_OPS`, counted by `plan_ops_estimate` without building a plan."""

from __future__ import annotations

import pytest

from shardsim.config import load_config
from shardsim.simulator.scale import MAX_PLAN_OPS, plan_ops_estimate
from shardsim.simulator.workload.resolve import load_workload
from shardsim.sweep.space import OVER_OP_BOUND, SweepSpace, enumerate_configs

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv")


@pytest.mark.parametrize(("workload", "nodes"), [("llama-3.1-70b", 16), ("llama-3.1-405b", 64)])
def test_no_pipeline_layout_of_the_dense_spaces_is_over_the_op_bound(workload: str, nodes: int) -> None:
    base = load_config(
        None, {"workload": workload, "topology": "p5.48xlarge", "nodes": nodes, "precision": "bf16", "seq_len": 8192}
    )
    space = SweepSpace(
        strategies=("pipeline",),
        pp=(2, 4, 8, 16),
        microbatches=(1, 2, 4, 8, 16, 32, 64),
        schedules=SCHEDULES,
        stages_per_rank=(1, 2, 4),
    )
    w = load_workload(base.workload, base.shape, base.source)
    got = enumerate_configs(base, space, w)
    assert OVER_OP_BOUND not in got.dropped_kinds, got.dropped_kinds
    layouts = {
        (c.cfg.strategy.pp, c.cfg.strategy.microbatches, c.cfg.strategy.schedule, c.cfg.strategy.stages_per_rank)
        for c in got.candidates
    }
    # the largest of the space are there: 16 stages, 64 microbatches, 4 virtual stages a rank
    assert {(16, 64, "interleaved-1f1b", 4), (16, 64, "interleaved-zb", 4)} <= layouts
    assert {c.cfg.strategy.degree > 1 for c in got.candidates} == {False, True}  # sharded stages too
    largest = max(plan_ops_estimate(c.cfg, len(w.layers)) for c in got.candidates)
    assert 100_000 < largest <= MAX_PLAN_OPS  # beyond the bound before it was raised
