"""A training step's allocations replayed: the trace holds the memory model's tensors to the
byte, and a GPU prediction's allocated and reserved peaks are the allocator's."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shardsim.config import build_config
from shardsim.core.units import GIB
from shardsim.simulator import memory as M
from shardsim.simulator.allocator import K_SMALL_BUFFER, replay
from shardsim.simulator.predict import predict
from shardsim.simulator.step_trace import GATHER_STREAM, StepBytes, replay_step, spread, step_events, units_of

MIB = 1 << 20


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(0, 64 * MIB), min_size=6, max_size=6),
    st.integers(1, 6),
    st.integers(0, 3),
    st.booleans(),
)
def test_the_traces_requested_peak_is_the_memory_models_tensors_to_the_byte(parts, units, window, gather):
    params, grads, optim, gathered, acts, temps = parts
    b = StepBytes(
        params,
        grads,
        optim,
        gathered,
        acts,
        temps,
        tensors=((3.0, 1.0),) * units,
        saved=(1.0,) * units,
        window=window,
        gather_stream=gather,
    )
    r = replay_step(b)
    assert r.requested_peak == params + grads + optim + max(gathered + acts, temps)
    assert r.requested_peak <= r.allocated_peak <= r.reserved_peak


def test_spread_keeps_the_total_and_the_proportions():
    assert spread(10, [0, 1, 1]) == [0, 5, 5] and spread(7, [1, 1, 1]) == [3, 2, 2]
    assert sum(spread(2**40 + 3, [1, 2, 3])) == 2**40 + 3 and spread(5, [0, 0]) == [0, 0]


def test_cublas_workspace_is_allocated_first_and_kept():
    b = StepBytes(0, 0, 0, 0, 12 * MIB, 0, tensors=((1.0,),), saved=(1.0,), workspace=M.CUBLAS_WORKSPACE_BYTES)
    events, _ = step_events(units_of(b), b.window, b.gather_stream, b.workspace)
    assert events[0] == M.CUBLAS_WORKSPACE_BYTES and ~0 not in events
    r = replay_step(b)  # 8.125 MiB (a 20 MiB segment, split), then 12 MiB beside it in its own segment
    assert r.requested_peak == M.CUBLAS_WORKSPACE_BYTES + 12 * MIB and r.reserved_peak == 20 * MIB + 12 * MIB


def test_fsdp_gathers_on_its_own_stream_and_holds_its_window():
    b = StepBytes(0, 0, 0, 40 * MIB, 0, 0, tensors=((1.0,),) * 4, saved=(1.0,) * 4, window=2, gather_stream=True)
    events, streams = step_events(units_of(b), b.window, b.gather_stream)
    sizes = [(e, s) for e, s in zip(events, streams, strict=True) if e > 0]
    assert {s for _, s in sizes} == {GATHER_STREAM} and {e for e, _ in sizes} == {20 * MIB}
    # two 20 MiB units at a time, on one stream: two segments, reused by every later gather
    assert replay(events, streams).reserved_peak == 40 * MIB


def test_a_gpu_prediction_reserves_whole_segments_above_its_allocated_peak():
    cfg = build_config(
        {"workload": "gpt2-xl", "topology": "p4d.24xlarge", "nodes": 1, "precision": "bf16", "strategy": "zero"}, "t"
    )
    p = predict(cfg)
    m = p.memory
    tensors = m["params_gib"] + m["grads_gib"] + m["optimizer_gib"]
    tensors += max(m["gathered_gib"] + m["activations_gib"], m["step_temporaries_gib"])
    workspace = M.cublas_workspace_bytes(80) / GIB  # A100: cuBLAS's default workspace, in the allocator
    assert tensors + workspace < p.memory_allocated_gib < p.memory_reserved_gib
    assert round(p.memory_reserved_gib * GIB) % K_SMALL_BUFFER == 0  # segments: multiples of 2 MiB
    assert p.memory_required_gib == p.memory_process_gib  # what `fits` compares: the process
    cpu = predict(
        build_config({"workload": "tiny-gpt", "topology": "emu-2x2", "precision": "fp32", "backend": "gloo"}, "t")
    )
    assert cpu.memory_allocated_gib == cpu.memory_reserved_gib  # no caching allocator on a CPU


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.lists(st.integers(0, 256 * MIB), min_size=6, max_size=6),
    st.lists(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=4), min_size=1, max_size=5),
    st.integers(0, 3),
    st.booleans(),
    st.sampled_from([0, 8 * MIB + MIB // 8]),
    st.integers(1, 3),
    st.booleans(),
)
def test_a_replay_resumed_after_the_states_is_the_whole_traces(parts, tensors, window, gather, workspace, words, exp):
    """`replay_step` resumes from the pools its model states leave (cached, shared by every step of
    those states): the same peaks and segments as the whole trace replayed from empty pools, and the
    cached pools are not changed by a replay resumed from them."""
    params, grads, optim, gathered, acts, temps = parts
    saved = tuple(float(i + 1) for i in range(len(tensors)))
    b = StepBytes(params, grads, optim, gathered, acts, temps, tuple(map(tuple, tensors)), saved, words, window, gather,
                  workspace)  # fmt: skip
    whole = replay(*step_events(units_of(b), window, gather, workspace), expandable_segments=exp)
    assert replay_step(b, exp) == whole
    other = StepBytes(params, grads, optim, gathered + 3 * MIB, acts * 2 + 1, temps, b.tensors, saved, words, window,
                      gather, workspace)  # fmt: skip
    assert replay_step(other, exp) == replay(*step_events(units_of(other), window, gather, workspace),
                                             expandable_segments=exp)  # fmt: skip
    assert replay_step.__wrapped__(b, exp) == whole  # the cached pools after `other` resumed from them
