"""Ring attention's rounds between which nothing is issued or awaited are planned as one op (the
forward's after its all-gather): the step is the one the plan of a round an op gives, with fewer
ops to simulate."""

from __future__ import annotations

import dataclasses

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.simulator.predict import prepare
from shardsim.simulator.scale import plan_ops_estimate
from shardsim.simulator.strategies import build
from shardsim.simulator.strategies import context_parallel as cpmod
from shardsim.specs.hardware.topology import Cluster
from shardsim.specs.model.arch import Arch
from tests.helpers import instance

LLAMA = Arch("llama", hidden=64, layers=2, heads=8, kv_heads=2, ffn=128, seq_len=64, vocab=256)


def _unfused(*args, **kwargs) -> cpmod.ContextParallel:
    return dataclasses.replace(cpmod.context_parallel(*args, **kwargs), fuse=False)


@pytest.mark.parametrize(
    ("strategy", "rotate", "checkpointing"),
    [
        (Strategy("zero", cp=8), "allgather", "none"),
        (Strategy("zero", cp=8), "allgather", "full"),
        (Strategy("zero", cp=4), "alltoall", "none"),
        (Strategy("zero2d", degree=2, cp=4, tp=2, sequence_parallel=True), "allgather", "full"),
        (Strategy("pipeline", pp=2, microbatches=4, cp=4), "allgather", "none"),
        (Strategy("pipeline", pp=2, microbatches=4, cp=2, tp=2, schedule="1f1b"), "allgather", "full"),
    ],
    ids=["zero-cp8", "zero-cp8-ckpt", "zero-alltoall", "zero2d-tp", "pipeline", "pipeline-tp-cp2"],
)
def test_fused_rounds_give_the_step_of_a_round_an_op(
    strategy: Strategy, rotate: str, checkpointing: str, monkeypatch
) -> None:
    cfg = RunConfig(
        workload=LLAMA,
        strategy=strategy.replace(cp_rotate=rotate),
        batch_per_device=2,
        checkpointing=checkpointing,
        precision="bf16",
    )
    s = prepare(cfg, cluster=Cluster(instance(devices=8), 2))
    fused = s.plan()
    with monkeypatch.context() as m:
        m.setattr(build, "context_parallel", _unfused)
        whole = s.plan()
    got, want = s.simulated(fused), s.simulated(whole)
    assert got.step_time_s == pytest.approx(want.step_time_s, rel=1e-12)
    assert got.breakdown == pytest.approx(want.breakdown, rel=1e-12, abs=1e-15)
    assert got.collectives == want.collectives
    attn = sum(o.duration for o in fused.ops if " attn " in o.name)
    assert attn == pytest.approx(sum(o.duration for o in whole.ops if " attn " in o.name), rel=1e-12)
    fewer = strategy.cp > 2 and rotate == "allgather"  # the forward's rounds 1 to cp - 1: one op
    assert (len(fused.ops) < len(whole.ops)) == fewer
    assert len(fused.ops) <= plan_ops_estimate(s.cfg, LLAMA.layers)
