"""DeepSpeed ZeRO stage 3's step (`deepspeed_stage3`): its coordinator's all-gathers counted by hand
from DeepSpeed's rules (partitioned_param_coordinator.py) on a small model, and a stage-3
ds_config against stages 1 and 2 (DeepSpeed itself is not installed in CI)."""

from __future__ import annotations

import json

from shardsim.api import predict as api_predict
from shardsim.config import RunConfig
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.simulator.predict import predict
from shardsim.simulator.strategies.deepspeed_stage3 import block_tensors, fetch_schedule, ipg_buckets, trace_of
from shardsim.simulator.workload.resolve import load_workload
from shardsim.specs.model.workload import Block


def block(name: str, kind: str, params: int, tensors: int, largest: int = 0) -> Block:
    return Block(name, params, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, kind=kind, param_tensors=tensors, largest_tensor=largest)


# embedding 3,000; three layers of a 1,000 weight and a 100 norm; a head of 10: with a persistence
# threshold of 200 the norms and the head are kept whole. The trace's uses:
# forward  0 E, 1 L0w, 2 L0n, 3 L1w, 4 L1n, 5 L2w, 6 L2n, 7 H
# backward 8 H, 9 L2n, 10 L2w, 11 L1n, 12 L1w, 13 L0n, 14 L0w, 15 E
MODEL = [block("embed", "embed", 3000, 1)]
MODEL += [block(f"layer{i}", "layer", 1100, 2, 1000) for i in range(3)]
MODEL += [block("head", "head", 10, 1)]
TRACE = trace_of(MODEL)[0]


def schedule(**knobs):
    ds = DeepSpeedSettings(**{"stage3_param_persistence_threshold": 200, **knobs})
    return fetch_schedule(TRACE, ds)


def gathers(sched) -> list[tuple[int, int, bool]]:
    return [(f.at, f.elems, f.prefetch) for f in sched.fetches]


def test_the_trace_is_forward_then_backward_by_tensor():
    assert TRACE.elems == (3000, 1000, 100, 1000, 100, 1000, 100, 10)
    assert TRACE.order == (0, 1, 2, 3, 4, 5, 6, 7, 7, 6, 5, 4, 3, 2, 1, 0)


def test_without_prefetch_or_reuse_each_use_gathers_its_module():
    # every non-persistent use fetches its own module and releases it after: 4 forward, 4 backward
    sched = schedule(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0)
    assert gathers(sched) == [(s, e, False) for s, e in [(0, 3000), (1, 1000), (3, 1000), (5, 1000)]] + [
        (s, e, False) for s, e in [(10, 1000), (12, 1000), (14, 1000), (15, 3000)]
    ]
    assert sched.persistent == 3 * 100 + 10  # never gathered
    assert sched.peak_live == 3000


def test_reuse_distance_keeps_the_last_layer_for_its_backward():
    # L2w's next use (10) is 100 + 10 + 10 + 100 = 220 elements ahead: within 250, kept; L1w's
    # (12) 2,420 ahead: released and gathered again
    sched = schedule(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=250)
    assert [f.at for f in sched.fetches] == [0, 1, 3, 5, 12, 14, 15]
    assert sum(f.elems for f in sched.fetches) == 2 * 3000 + 5 * 1000


def test_prefetch_gathers_ahead_in_trace_order_by_the_bucket():
    # after each wait the next entries of the trace up to 1,000 elements: L0w at 0, L1w at 1, L2w at
    # 3; at 5 L2w's backward entry is popped already available (so kept for it) and L1w's backward
    # one gathered; at 10 L0w's; at 12 the embedding's whole 3,000
    sched = schedule(stage3_prefetch_bucket_size=1000, stage3_max_reuse_distance=0)
    assert gathers(sched) == [
        (0, 3000, False),
        (0, 1000, True),
        (1, 1000, True),
        (3, 1000, True),
        (5, 1000, True),
        (10, 1000, True),
        (12, 3000, True),
    ]


def test_max_live_parameters_bounds_the_prefetch():
    # a bucket large enough for the whole model: at 0 everything is prefetched and kept for its
    # backward (6,000 alive); at most 2,000 live: a module's own fetch is never refused (the
    # embedding at 0, L0w at 1), the prefetch takes what is left under the bound, and one tensor
    # may pass it (the embedding's 3,000 at 14 beside L0w's 1,000)
    free = schedule(stage3_prefetch_bucket_size=10_000, stage3_max_reuse_distance=0)
    bound = schedule(stage3_prefetch_bucket_size=10_000, stage3_max_reuse_distance=0, stage3_max_live_parameters=2000)
    assert free.peak_live == 6000 and len(free.fetches) == 2
    assert bound.peak_live == 4000
    assert [(f.at, f.prefetch) for f in bound.fetches] == [(0, False), (1, False)] + [
        (s, True) for s in (1, 3, 5, 12, 14)
    ]


def test_persistent_parameters_are_never_gathered():
    sched = schedule(stage3_param_persistence_threshold=5000)
    assert sched.fetches == () and sched.peak_live == 0 and sched.persistent == sum(TRACE.elems)


def test_ipg_buckets_send_before_the_gradient_that_would_overflow():
    # backward's gradients 10, 100, 1000 | 100, 1000, 100 | 1000 | 3000 in buckets of 1,200 (a
    # bucket of exactly 1,200 is not past it)
    grads = [TRACE.elems[p] for p in TRACE.order[TRACE.forward_uses :]]
    assert ipg_buckets(grads, 1200) == [(3, 1110), (6, 1200), (7, 1000), (None, 3000)]


def test_a_dense_layer_is_its_linears_then_its_small_tensors():
    w = load_workload("gpt2-xl")
    h = 1600
    assert block_tensors(w.layers[0], w.arch) == [h * 3 * h, h * h, h * 4 * h, 4 * h * h] + [2600] * 8
    assert sum(block_tensors(w.layers[0], w.arch)) == w.layers[0].params


# --- the step ------------------------------------------------------------------------------------

SMALL = {"family": "gpt", "hidden": 64, "layers": 2, "heads": 4, "seq_len": 32, "vocab": 512}
SMALL_RUN = {"workload": SMALL, "topology": "p4d.24xlarge", "nodes": 1, "precision": "bf16"}


def small(grad_accum: int = 2, **zero) -> RunConfig:
    zero = {"stage": 3, "stage3_param_persistence_threshold": 1000, **zero}
    return RunConfig(
        workload=SMALL,
        topology="p4d.24xlarge",
        nodes=1,
        precision="bf16",
        grad_accum=grad_accum,
        zero_optimization=zero,
    )


def test_the_plan_issues_the_schedules_collectives():
    pred = predict(small(stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=0))
    # per micro-step, forward and backward: the token and position embeddings, each layer's 4
    # linears and the LM head (untied); norms and biases (under 1,000 elements) kept whole
    assert pred.collectives == {"all_gather": 2 * 2 * (2 + 2 * 4 + 1), "reduce_scatter": 2}
    kept = predict(small(stage3_param_persistence_threshold=10**6))
    assert kept.collectives == {"reduce_scatter": 2}  # every tensor kept whole: nothing to gather


def test_stage_3_of_a_ds_config_is_slower_and_smaller_than_stages_1_and_2(tmp_path):
    base = json.loads(open("docs/examples/ds_config.json").read())
    preds = []
    for stage in (1, 2, 3):
        path = tmp_path / f"stage{stage}.json"
        path.write_text(json.dumps({**base, "zero_optimization": {**base["zero_optimization"], "stage": stage}}))
        preds.append(api_predict(str(path), workload="gpt2-xl", topology="p4d.24xlarge", nodes=1))
    one, two, three = preds
    assert three.step_time_s > two.step_time_s > one.step_time_s
    assert three.memory_required_gib < two.memory_required_gib < one.memory_required_gib
    assert "all_reduce" not in three.collectives  # reduce-scatters only; no all-gather after the step


def test_reuse_distance_keeps_every_layer_of_a_small_model():
    # DeepSpeed's default reuse distance (1e9 elements) spans the whole small model: nothing is
    # gathered twice; with none, backward gathers again what forward released
    kept, again = (predict(small(1, stage3_prefetch_bucket_size=0, stage3_max_reuse_distance=r)) for r in (10**9, 0))
    assert kept.collectives == {"all_gather": 2 + 2 * 4 + 1, "reduce_scatter": 1}
    assert again.collectives == {"all_gather": 2 * (2 + 2 * 4 + 1), "reduce_scatter": 1}
    assert kept.memory["gathered_gib"] > again.memory["gathered_gib"]


def test_the_op_estimate_bounds_the_plan():
    from shardsim.config import resolve
    from shardsim.simulator.compute import ComputeModel
    from shardsim.simulator.scale import plan_ops_estimate
    from shardsim.simulator.strategies.build import build_plan
    from shardsim.specs.hardware.topology import make_cluster

    w = load_workload("gpt2-xl")
    every = {"stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0, "stage3_max_reuse_distance": 0}
    for zero in ({"stage": 3}, {"stage": 3, **every}):  # DeepSpeed's defaults; every tensor gathered twice
        cfg = RunConfig(workload="gpt2-xl", topology="p4d.24xlarge", nodes=2, grad_accum=2, zero_optimization=zero)
        cfg, res = resolve(cfg, 16, len(w.layers), tied_embeddings=w.tied_embeddings, arch=w.arch)
        cm = ComputeModel(make_cluster("p4d.24xlarge", 2).instance.device, cfg.precision, arch=w.arch)
        assert len(build_plan(cfg, res, w, cm).ops) <= plan_ops_estimate(cfg, len(w.layers))


def test_the_compute_bound_is_below_the_step_per_parameter():
    from shardsim.simulator.bounds import compute_bound_s
    from shardsim.simulator.predict import prepare

    for stage in (2, 3):  # DeepSpeed steps one flat partition: no launch a tensor
        cfg = RunConfig(**{**SMALL_RUN, "optimizer_impl": "per-parameter"}, zero_optimization={"stage": stage})
        assert compute_bound_s(prepare(cfg)) <= predict(cfg).step_time_s
