"""Expert parallelism inside a pipeline's stages: each stage's MoE layers carry their all-to-alls
over the stage's EP groups per microbatch, their experts sharded over the stage's data-parallel
ranks left after EP and reduced once per schedule step; memory falls with ep."""

from __future__ import annotations

import re

import pytest

from shardsim.config import RunConfig
from shardsim.config.load import load_config
from shardsim.simulator.predict import predict, prepare
from shardsim.simulator.strategies.planners import PLANNERS
from shardsim.simulator.strategies.steps import stage_blocks
from shardsim.sweep.space import SweepSpace, enumerate_configs

# tiny-moe: 4 layers, the first dense; over 2 stages, stage 0 holds layers 0-1 (one MoE layer), stage 1 layers 2-3 (two)
MOE_LAYERS = {0: 1, 1: 2}


def _tiny(**keys):
    base = {"topology": "emu-4x2", "nodes": 4, "workload": "tiny-moe", "strategy": "pipeline", "pp": 2}
    base |= {"degree": 2, "ep": 2, "microbatches": 2, "checkpointing": "none", "backend": "gloo"}
    return load_config(None, base | keys)


def _a2a_by_stage_and_microbatch(cfg: RunConfig) -> dict[tuple[int, int], list]:
    p = prepare(cfg).plan()
    out: dict[tuple[int, int], list] = {}
    for o in p.ops:
        if o.coll == "all_to_all":
            m = re.search(r" s(\d+) m(\d+)", o.name)
            assert m is not None, o.name
            out.setdefault((int(m[1]), int(m[2])), []).append(o)
            assert int(m[1]) == o.rank_class
    return out


@pytest.mark.parametrize(("checkpointing", "per_layer"), [("none", 5), ("full", 8)])
def test_each_stage_carries_its_moe_layers_all_to_alls_per_microbatch(checkpointing, per_layer):
    """Per MoE layer and microbatch: counts, dispatch and combine in forward, the two reverses in
    backward, and with full checkpointing the forward's three again; each over its stage's EP
    groups of 2 consecutive ranks (stage s holds ranks 4s to 4s + 3)."""
    found = _a2a_by_stage_and_microbatch(_tiny(checkpointing=checkpointing))
    assert sorted(found) == [(s, m) for s in (0, 1) for m in (0, 1)]
    for (s, _), ops in found.items():
        assert len(ops) == per_layer * MOE_LAYERS[s]
        for o in ops:
            assert o.layout.groups().tolist() == [[4 * s, 4 * s + 1], [4 * s + 2, 4 * s + 3]]


def test_the_experts_are_sharded_over_the_ranks_left_after_ep_and_reduced_once_a_step():
    """degree 4 over a stage's 4 ranks, ep 2: the experts' unit is gathered and reduce-scattered over
    dp_shard = 2 ranks, ep apart; its gradient is reduce-scattered once per schedule step (at
    perform_reduce_grad), not per microbatch, whatever the microbatches."""
    for m in (2, 4):
        p = prepare(_tiny(degree=4, microbatches=m)).plan()
        for s in (0, 1):
            rs = [o for o in p.ops if o.rank_class == s and o.name.startswith("RS experts")]
            assert len(rs) == MOE_LAYERS[s]
            for o in rs:
                assert o.layout.groups().tolist() == [[4 * s, 4 * s + 2], [4 * s + 1, 4 * s + 3]]
            ag = [o for o in p.ops if o.rank_class == s and o.name.startswith("AG experts")]
            assert ag and all(o.layout.size == 2 for o in ag)


def test_replicated_stages_all_reduce_the_experts_shard_once_a_step():
    """degree 2 = ep: the experts are not sharded (dp_shard 1, no reduce-scatter), and the two
    replicas of a stage all-reduce each MoE layer's experts once per step."""
    p = prepare(_tiny(grad_accum=2)).plan()
    for s in (0, 1):
        ar = [o for o in p.ops if o.rank_class == s and o.name.startswith("AR experts")]
        assert len(ar) == MOE_LAYERS[s] and all(o.layout.size == 2 for o in ar)
        assert not [o for o in p.ops if o.rank_class == s and o.name.startswith("RS experts")]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_the_plans_size_is_within_its_estimate(schedule):
    v = 2 if schedule == "interleaved-1f1b" else 1
    cfg = _tiny(checkpointing="full", schedule=schedule, stages_per_rank=v, degree=4, grad_accum=2)
    p = prepare(cfg).plan()
    assert len(p.ops) <= PLANNERS["pipeline"].ops_estimate(cfg.strategy, 2, 4)
    assert predict(cfg).moe["ep"] == 2  # type: ignore[index]


def test_memory_per_rank_falls_with_ep_in_a_pipeline():
    """Mixtral's shape (4 layers) in 2 stages on one p5: a stage's 4 ranks shard everything either
    way (degree 4); each EP rank holds ep times fewer experts unsharded while its layer runs."""
    base = {"workload": "mixtral-8x7b", "topology": "p5.48xlarge", "nodes": 1, "strategy": "pipeline", "pp": 2}
    base |= {"degree": 4, "microbatches": 2, "shape": {"layers": 4, "seq_len": 4096}}
    mem = [predict(RunConfig(**base, ep=e)).memory_required_gib for e in (1, 2, 4)]
    assert mem[0] > mem[1] > mem[2]


def test_a_sweep_spans_ep_with_sharded_stages_and_whole_backward_schedules():
    space = SweepSpace(
        strategies=("pipeline",), pp=(2,), degrees=(1, 2), ep=(1, 2), tp_degrees=(1,),
        schedules=("1f1b", "zbv"), stages_per_rank=(1, 2), microbatches=(2,),
    )  # fmt: skip
    labels = {c.label for c in enumerate_configs(_tiny(ep=1, degree=1), space).candidates}
    with_ep = {label for label in labels if "ep=2" in label}
    assert with_ep and all("d=2" in label and "zbv" not in label for label in with_ep), labels
    assert any("zbv" in label for label in labels)


@pytest.mark.parametrize("ep", [2, 4])
def test_a_stages_memory_holds_its_shard_and_its_units_with_experts_over_ep(ep):
    """degree 4 over a stage's 4 ranks, fp32: a rank's fp32 parameters are its stage's over 4 (the
    dense part over dp_shard x ep, the experts over dp_shard: the same share), and what it holds
    unsharded from its first backward (pipelining's set_reshard_after_backward(False)) is every unit
    of its stage, an MoE layer's with experts / ep experts, parameters and gradients (4 + 4 bytes)."""
    s = prepare(_tiny(degree=4, ep=ep))
    expected = set()
    for embed, layers, head in stage_blocks(s.res, s.ranks_workload):
        blocks = [*embed, *layers, *head]
        held = sum(b.params - (b.moe.experts - b.moe.experts // ep) * b.moe.expert_params if b.moe else b.params
                   for b in blocks)  # fmt: skip
        expected.add((round(sum(b.params for b in blocks) / 4 * 4), round(held * 8)))
    got = (round(s.memory.params_gib * 2**30), round(s.memory.gathered_gib * 2**30))
    assert got in expected, (got, expected)
