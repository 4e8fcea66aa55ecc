"""A pipeline rank's sends to two peers (a V-shaped schedule's: activations and gradients go to
both neighbours): over gloo they wait for their receivers in order per peer only, so one held by
its receiver does not hold a later one to another rank (which deadlocked ZBV's plan); NCCL's
eager sends stay in order per direction."""

from __future__ import annotations

import pytest

from shardsim.config import RunConfig, Strategy
from shardsim.simulator.predict import predict
from shardsim.specs.model.arch import Shape
from tests.helpers import plan_ops

EMU = dict(workload="small-gpt", precision="fp32", checkpointing=False)


def _cfg(
    schedule: str, pp: int, m: int, backend: str = "gloo", topology: str = "emu-2x2", nodes: int = 2, **kw
) -> RunConfig:
    s = Strategy("pipeline", pp=pp, microbatches=m, schedule=schedule, stages_per_rank=2)
    return RunConfig(**EMU, **kw, topology=topology, nodes=nodes, backend=backend, strategy=s)


def _sends(ops: list) -> list:
    return [op for op in ops if op.kind == "comm" and op.coll == "send_recv"]


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "topology", "kw"),
    [
        ("zbv", 4, 16, "emu-2x2", {"nodes": 2, "batch_per_device": 8}),
        ("zbv", 4, 8, "emu-4x2", {"nodes": 4, "batch_per_device": 4}),
        ("dualpipev", 8, 16, "emu-4x2", {"nodes": 4, "batch_per_device": 4, "shape": Shape(layers=16)}),
    ],
)
def test_v_shaped_schedules_over_gloo_are_predicted(schedule: str, pp: int, m: int, topology: str, kw: dict) -> None:
    """Layouts whose plan deadlocked while a rank's sends waited in one queue a direction."""
    p = predict(_cfg(schedule, pp, m, topology=topology, **kw))  # raises on a deadlock
    assert p.step_time_s > 0


def test_a_gloo_send_waits_behind_the_earlier_sends_to_its_own_peer_only() -> None:
    ops = plan_ops(_cfg("zbv", 4, 8))
    by_id = {op.id: op for op in ops}
    peers_of_stream: dict[tuple[int, str], set[int]] = {}
    for op in _sends(ops):
        peers_of_stream.setdefault((op.rank_class, op.stream), set()).add(op.peer)
        before = [by_id[d] for d in op.deps if by_id[d].stream == op.stream and by_id[d].rank_class == op.rank_class]
        assert all(b.peer == op.peer for b in before), op.name
    assert peers_of_stream[(1, "p2p_fwd")] == {0, 2}  # rank 1 sends activations to both neighbours


def test_a_send_held_by_its_receiver_is_overtaken_by_one_to_another_rank() -> None:
    """Rank 1 issues stage 1's activation of microbatch 5 (to rank 2) before stage 6's of
    microbatch 1 (to rank 0); rank 2 posts its recv later than rank 0 does, so the second
    arrives first."""
    ops = {op.name: op for op in plan_ops(_cfg("zbv", 4, 8))}
    assert ops["send act s1 m5"].id < ops["send act s6 m1"].id
    spans = {s.name: s for s in predict(_cfg("zbv", 4, 8)).spans}
    assert spans["send act s6 m1"].end < spans["send act s1 m5"].start


def test_nccl_sends_wait_behind_the_earlier_ones_of_their_direction() -> None:
    ops = plan_ops(_cfg("zbv", 4, 8, backend="nccl", topology="p4d.24xlarge", nodes=1, batch_per_device=2))
    ops_by_id = {op.id: op for op in ops}
    last: dict[tuple[int, str], int] = {}
    crossed = 0
    for op in _sends(ops):
        key = (op.rank_class, op.stream)
        if key in last:
            assert last[key] in op.deps, op.name
            crossed += ops_by_id[last[key]].peer != op.peer
        last[key] = op.id
    assert crossed  # the queue of one direction holds sends to both neighbours
