"""Library deepspeed: DeepSpeed's partitioning against its documented memory formulas
(deepspeed/runtime/zero/stage_1_and_2.py `estimate_zero2_model_states_mem_needs`: 2 + 18 / N
bytes a parameter; stage3.py `estimate_zero3_model_states_mem_needs`: 4 x the largest layer +
18 / N), worked by hand here (DeepSpeed itself is not installed in CI), and the step of stages
1 and 2: ipg buckets of reduce_bucket_size, on the boundary or every micro-step, one all-gather."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardsim.config import RunConfig
from shardsim.config.deepspeed_settings import DeepSpeedSettings
from shardsim.simulator.predict import predict
from shardsim.simulator.strategies.deepspeed_zero import bucket_collective, stage_of, zero_states

DEFAULTS = DeepSpeedSettings()
GPT2_XL = 1_557_611_200  # parameters (gpt2-xl), 8 ranks: DeepSpeed's estimator by hand below


def test_stage_2_model_states_are_deepspeeds_estimate():
    # estimate_zero2_model_states_mem_needs(P, 8, 1, cpu_offload=False): 2 P + int(18 P / 8)
    z = zero_states(2, GPT2_XL, 8, 2, 2.0, DEFAULTS)
    assert z.model_states == 2 * GPT2_XL + 18 * GPT2_XL / 8 == 6_619_847_600
    # parts: bf16 parameters whole + fp32 master partition; bf16 gradient partition; Adam's m, v
    assert (z.params, z.grads, z.optimizer, z.step) == (2 * GPT2_XL + GPT2_XL / 2, GPT2_XL / 4, GPT2_XL, GPT2_XL / 2)


def test_stage_1_keeps_the_half_gradients_whole():
    z = zero_states(1, GPT2_XL, 8, 2, 2.0, DEFAULTS)
    # 2 P half parameters + 2 P half gradients (param.grad) + 2 P / 8 (the partition's copy) + 16 P / 8
    assert z.model_states == 4 * GPT2_XL + 18 * GPT2_XL / 8


def test_stage_3_model_states_and_what_is_gathered():
    live = 80_411_200 + 50_000_000  # e.g. gpt2-xl's embedding (50,257 x 1,600) and a prefetch bucket
    z = zero_states(3, GPT2_XL, 8, 2, 2.0, DEFAULTS, live=live)
    # estimate_zero3_model_states_mem_needs: 4 x largest + 18 P / 8; shardsim holds the bf16 gradient
    # partition besides (grad_partitions_flat_buffer): 20 P / 8
    assert z.model_states == 20 * GPT2_XL / 8
    # the fetched parameters alive at most (`deepspeed_stage3.fetch_schedule`) and the one reduce bucket
    assert z.gathered == 2 * live + 2 * 500_000_000


def test_small_parameters_are_kept_whole_at_stage_3():
    kept = zero_states(3, 1_000_000, 4, 2, 2.0, DEFAULTS, persistent=1000)
    assert kept.params == 2 * (999_000 / 4 + 1000) + 4 * 1_000_000 / 4


@pytest.mark.parametrize(("overlap", "contiguous", "buffers"), [(True, True, 2), (False, True, 1), (True, False, 1)])
def test_the_reduce_buckets_of_stage_2(overlap, contiguous, buffers):
    ds = DeepSpeedSettings(reduce_bucket_size=10**8, overlap_comm=overlap, contiguous_gradients=contiguous)
    assert zero_states(2, GPT2_XL, 8, 2, 2.0, ds).gathered == buffers * 2 * 10**8


@settings(max_examples=50, derandomize=True, deadline=None)
@given(params=st.integers(10**6, 10**11), dp=st.sampled_from([1, 2, 8, 64, 512]), half=st.sampled_from([2, 4]))
def test_each_stage_holds_less_model_state_than_the_last(params, dp, half):
    assume(dp > 1)
    states = [zero_states(s, params, dp, half, 2.0, DEFAULTS).model_states for s in (1, 2, 3)]
    assert states[0] > states[1] > states[2]
    assert math.isclose(states[0] - states[1], half * params)  # stage 1's whole half gradients


def test_the_collective_of_a_bucket():
    assert bucket_collective(DEFAULTS) == "all_reduce"  # allreduce_and_scatter
    assert bucket_collective(DeepSpeedSettings(use_multi_rank_bucket_allreduce=False)) == "reduce_scatter"
    assert bucket_collective(DeepSpeedSettings(reduce_scatter=False)) == "all_reduce"


# --- the step ------------------------------------------------------------------------------------

TINY = {"workload": "tiny-gpt", "topology": "p4d.24xlarge", "nodes": 1, "precision": "bf16"}


def run(stage: int, **zero) -> tuple[RunConfig, object]:
    cfg = RunConfig(**TINY, grad_accum=2, zero_optimization={"stage": stage, **zero})
    return cfg, predict(cfg)


def test_the_kinds_are_their_stages():
    assert [stage_of(run(s)[0]) for s in (1, 2, 3)] == [1, 2, 3]


@pytest.mark.parametrize(("stage", "reductions"), [(1, 1), (2, 2)])
def test_stage_2_reduces_every_micro_step_stage_1_on_the_boundary(stage, reductions):
    cfg, pred = run(stage, reduce_bucket_size=10**9)  # one bucket holds the whole model
    assert pred.collectives == {"all_reduce": reductions, "all_gather": 1}


@pytest.mark.parametrize("bucket", [5_000, 20_000, 60_000])
def test_buckets_of_reduce_bucket_size(bucket):
    cfg, pred = run(2, reduce_bucket_size=bucket)
    assert pred.collectives["all_reduce"] == 2 * math.ceil(pred.params / bucket)  # 2 micro-steps


def test_library_deepspeed_predicts_other_memory_than_pytorchs_zero():
    cfg, pred = run(2)
    pytorch = predict(cfg.replace(library="pytorch", deepspeed=None))
    # the tensors differ (a model this small fits the same allocator segments either way)
    assert pred.memory_allocated_gib != pytorch.memory_allocated_gib


@pytest.mark.parametrize("stage", [1, 2])
def test_without_overlap_comm_the_reductions_are_not_hidden(stage):
    hidden = run(stage, overlap_comm=True, reduce_bucket_size=5_000)[1]
    waited = run(stage, overlap_comm=False, reduce_bucket_size=5_000)[1]
    assert waited.step_time_s > hidden.step_time_s
