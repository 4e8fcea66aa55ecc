"""The collectives PyTorch's tensor parallelism issues for one step, as the runtime applies it
(`collective_trace.trace_step`, fake process group): their kinds, sizes and groups per layer."""

from __future__ import annotations

from collections import Counter

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.runtime.collective_trace import trace_step
from shardsim.specs.model.arch import Arch
from shardsim.specs.model.library import PRESETS

GPT = PRESETS["tiny-gpt"]  # 4 layers, hidden 64, 32 tokens
B = 3  # B x tokens differs from hidden: the loss's all-reduces tell apart from the norms'


def traced(kind: str, world: int, tp: int, sp: bool) -> Counter:
    cfg = RunConfig(
        workload=GPT,
        strategy=Strategy(kind, tp=tp, sequence_parallel=sp),
        batch_per_device=B,
        checkpointing=False,
        backend="gloo",
    )
    return Counter((c.kind, c.numel, c.group_size, c.group) for c in trace_step(cfg, world))


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_without_sp_all_reduces_activations(tp):
    L, act, tokens = GPT.layers, B * GPT.tokens * GPT.hidden, B * GPT.tokens
    calls = traced("ddp", tp, tp, sp=False)
    # forward: embedding + 2 per layer; backward: 2 per layer + the head's input
    assert calls[("all_reduce", act, tp, "tp")] == 2 * (2 * L + 1)
    assert calls[("all_reduce", tokens, tp, "tp")] == 3  # vocabulary-parallel cross-entropy
    assert sum(calls.values()) == 2 * (2 * L + 1) + 3


def test_tp_with_sp_gathers_and_scatters_along_the_sequence():
    L, act, tokens, tp = GPT.layers, B * GPT.tokens * GPT.hidden, B * GPT.tokens, 2
    calls = traced("ddp", tp, tp, sp=True)
    assert calls[("all_gather", act, tp, "tp")] == 2 * (2 * L + 1)
    assert calls[("reduce_scatter", act, tp, "tp")] == 2 * (2 * L + 1)
    assert calls[("all_reduce", tokens, tp, "tp")] == 3
    # the norms' weight and bias gradients, computed from a sequence shard: one all-reduce each
    assert calls[("all_reduce", GPT.hidden, tp, "tp")] == 2 * (2 * L + 1)
    assert sum(calls.values()) == 6 * (2 * L + 1) + 3


def test_tp_under_fsdp_shards_over_the_data_parallel_dimension():
    calls = traced("zero", 8, 2, sp=False)
    shard = {k for k in calls if k[3] == "dp_shard"}
    assert shard and all(g == 4 for _, _, g, _ in shard)
    assert calls[("all_reduce", B * GPT.tokens * GPT.hidden, 2, "tp")] == 2 * (2 * GPT.layers + 1)


def test_forward_and_backward_collectives_are_labelled():
    L, act = GPT.layers, B * GPT.tokens * GPT.hidden
    cfg = RunConfig(workload=GPT, strategy=Strategy("ddp", tp=2), batch_per_device=B, checkpointing=False)
    calls = trace_step(cfg, 2)
    fwd = [i for i, c in enumerate(calls) if c.phase == "forward" and c.numel == act]
    bwd = [i for i, c in enumerate(calls) if c.phase == "backward" and c.numel == act]
    assert len(fwd) == len(bwd) == 2 * L + 1
    assert fwd[-1] < bwd[0]


@pytest.mark.parametrize(
    ("order", "tp_ranks", "shard_ranks"), [("pp,dp,tp", (0, 1), (1, 3, 5, 7)), ("pp,tp,dp", (1, 5), (0, 1, 2, 3))]
)
def test_mesh_order_places_the_tp_group(order, tp_ranks, shard_ranks):
    """Rank 1 of 8, tp 2, ZeRO over the other 4: TP innermost (consecutive ranks) or outermost."""
    cfg = RunConfig(
        workload=GPT, strategy=Strategy("zero", tp=2, mesh_order=order), batch_per_device=B, checkpointing=False
    )
    calls = trace_step(cfg, 8, rank=1)
    assert {c.ranks for c in calls if c.group == "tp"} == {tp_ranks}
    assert {c.ranks for c in calls if c.group == "dp_shard"} == {shard_ranks}


def test_a_pipeline_stage_runs_its_blocks_tensor_parallel():
    """tp 2 x pp 2 x zero 2 (8 ranks): stage 0 holds the embedding and 2 layers, the last stage 2
    layers and the head (its vocabulary-parallel loss). One microbatch: a replica's 2 x B samples."""
    mb = 2 * B
    L, act, tokens = GPT.layers // 2, mb * GPT.tokens * GPT.hidden, mb * GPT.tokens
    strategy = Strategy("pipeline", pp=2, microbatches=1, degree=2, tp=2)
    cfg = RunConfig(workload=GPT, strategy=strategy, batch_per_device=B, checkpointing=False)
    first = Counter((c.kind, c.numel, c.group) for c in trace_step(cfg, 8, rank=0))
    last = Counter((c.kind, c.numel, c.group) for c in trace_step(cfg, 8, rank=7))
    assert first[("all_reduce", act, "tp")] == (2 * L + 1) + 2 * L  # embedding + layers forward; layers backward
    assert last[("all_reduce", act, "tp")] == 2 * L + (2 * L + 1)  # layers forward; head + layers backward
    assert (first[("all_reduce", tokens, "tp")], last[("all_reduce", tokens, "tp")]) == (0, 3)
    assert first.keys() - {("all_reduce", act, "tp")} and all(g == "dp_shard" for _, _, g in first if g != "tp")


def test_swiglu_gradients_leave_the_mlp_in_one_all_reduce():
    """gate and up both read the MLP's input: their input gradients add up before one all-reduce."""
    llama = Arch("llama", hidden=64, layers=2, heads=4, kv_heads=2, ffn=128, seq_len=32, vocab=256)
    cfg = RunConfig(workload=llama, strategy=Strategy("ddp", tp=2), batch_per_device=B, checkpointing=False)
    calls = trace_step(cfg, 2)
    act = B * llama.tokens * llama.hidden
    phases = Counter(c.phase for c in calls if (c.kind, c.numel) == ("all_reduce", act))
    assert phases == {"forward": 2 * llama.layers + 1, "backward": 2 * llama.layers + 1}
