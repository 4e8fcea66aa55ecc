"""The collectives PyTorch's tensor parallelism issues for one step, as the runtime applies it
(`collective_trace.trace_step`, fake process group): their kinds, sizes and groups per layer."""

from __future__ import annotations

from collections import Counter

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.runtime.collective_trace import trace_step
from shardsim.simulator.workload.library import PRESETS

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
    shard = {k for k in calls if k[3] == "shard"}
    assert shard and all(g == 4 for _, _, g, _ in shard)
    assert calls[("all_reduce", B * GPT.tokens * GPT.hidden, 2, "tp")] == 2 * (2 * GPT.layers + 1)
