"""Point-to-point sends of a pipeline: gloo's rendezvous (bytes move once the receiver has
posted its recv; a small isend frees its sender at the rendezvous) against NCCL's eager sends,
and no schedule deadlocks under either."""

from __future__ import annotations

import itertools

import pytest

import shardsim.simulator.strategies.pipeline as pipeline_mod
from shardsim.config import RunConfig, Strategy
from shardsim.simulator.plan import ASYNC_STREAMS
from shardsim.simulator.predict import predict
from tests.helpers import plan_ops

EMU = dict(workload="small-gpt", topology="emu-2x2", nodes=2, batch_per_device=4, precision="fp32", checkpointing=False)


def _spans(cfg: RunConfig) -> dict[str, tuple[float, float]]:
    return {s.name: (s.start, s.end) for s in predict(cfg).spans}


def _cfg(schedule: str, backend: str = "gloo", **kw) -> RunConfig:
    s = Strategy("pipeline", pp=2, microbatches=4, schedule=schedule)
    return RunConfig(**{**EMU, **kw}, backend=backend, strategy=s)


def test_gloo_activation_moves_only_once_the_next_stage_posts_its_recv() -> None:
    """GPipe: stage 0 runs its forwards back to back, but stage 1 posts the recv of
    microbatch 1 only when its forward of microbatch 0 is done; the send starts then."""
    sp = _spans(_cfg("gpipe"))
    assert sp["F s0 m1 (5 blocks)"][1] < sp["F s1 m0 (5 blocks)"][1]  # stage 0 is ahead
    assert sp["send act s0 m1"][0] >= sp["F s1 m0 (5 blocks)"][1] - 1e-12
    assert sp["F s1 m1 (5 blocks)"][0] >= sp["send act s0 m1"][1] - 1e-12


def test_without_a_rendezvous_the_activation_leaves_when_it_is_computed(monkeypatch) -> None:
    monkeypatch.setattr(pipeline_mod, "RENDEZVOUS_BACKENDS", frozenset())
    sp = _spans(_cfg("gpipe"))
    assert sp["send act s0 m1"][0] == pytest.approx(sp["F s0 m1 (5 blocks)"][1])
    assert sp["send act s0 m1"][0] < sp["F s1 m0 (5 blocks)"][1]


def test_a_small_gloo_isend_frees_its_sender_at_the_rendezvous(monkeypatch) -> None:
    """1F1B stage 0 waits for its isend of microbatch 1 before its first backward: with a
    message the socket buffers hold, until the rendezvous; with none buffered, until delivery."""
    buffered = predict(_cfg("1f1b"))
    ops = {op.name: op for op in plan_ops(_cfg("1f1b"))}
    b0 = ops["B s0 m0 (5 blocks)"]
    assert ops["post act s0 m1"].id in b0.deps and ops["send act s0 m1"].id not in b0.deps
    monkeypatch.setattr(pipeline_mod, "BUFFERED_SEND_BYTES", 0)
    ops = {op.name: op for op in plan_ops(_cfg("1f1b"))}
    assert ops["send act s0 m1"].id in ops["B s0 m0 (5 blocks)"].deps
    assert predict(_cfg("1f1b")).step_time_s >= buffered.step_time_s - 1e-12


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_no_pipeline_schedule_deadlocks(backend: str) -> None:
    """Every schedule, stage count, microbatch count and sharding of tiny-gpt on 8 ranks
    (emulated CPU nodes for gloo, GPU nodes for NCCL)."""
    topology, nodes = ("emu-4x2", 4) if backend == "gloo" else ("g4dn.12xlarge", 2)
    for pp, mult, schedule, degree, accum in itertools.product((2, 4), (1, 2), ("gpipe", "1f1b"), (1, 2), (1, 2)):
        s = Strategy("pipeline", pp=pp, microbatches=pp * mult, schedule=schedule, degree=degree)
        cfg = RunConfig(
            workload="tiny-gpt",
            topology=topology,
            nodes=nodes,
            batch_per_device=2 * pp,
            grad_accum=accum,
            precision="fp32",
            checkpointing=False,
            backend=backend,
            strategy=s,
        )
        p = predict(cfg)  # raises on a deadlock
        assert p.step_time_s > 0


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_a_ddp_stage_sends_its_last_input_gradient_after_its_gradient_sync(backend: str, schedule: str) -> None:
    """DDP's backward() returns once its buckets are all-reduced (the gradients are in sync
    when it returns), so the last microbatch's input gradient leaves a replicated stage after
    its all-reduce, and the stage before runs its last backward after that. Traced in
    emu-4x2 (pp=2, 4 replicas, gloo): stage 1's last backward took 1.0-1.4 s of which 0.1 s
    was compute, and stage 0's began only when it returned."""
    topology = dict(topology="emu-4x2", nodes=4) if backend == "gloo" else dict(topology="g4dn.12xlarge", nodes=2)
    spans = predict(_cfg(schedule, backend, **topology)).spans
    ar_end = max(s.end for s in spans if s.name.startswith("AR bucket s1"))
    sp = {s.name: (s.start, s.end) for s in spans}
    send = [n for n in sp if n.startswith("send grad s1 m3")]
    assert send and sp[send[0]][0] >= ar_end - 1e-12
    last_b0 = min(s.start for s in spans if s.rank_class == 0 and s.name.startswith("B") and "m3" in s.name)
    assert last_b0 >= sp[send[0]][1] - 1e-12


def test_a_replicated_stage_all_reduces_while_it_computes_a_sharded_one_does_not() -> None:
    """On CPU with gloo, DDP's reducer all-reduces a bucket on gloo's threads while the
    backward goes on (a replicated stage is a DDP module); FSDP2 has no streams there, so a
    sharded stage's collectives run between its computations."""

    def streams(ops, kinds) -> set[str]:  # the pipeline's sends and their posting have their own
        return {op.stream for op in ops if op.kind in kinds and op.stream not in ASYNC_STREAMS}

    replicated = plan_ops(_cfg("1f1b", topology="emu-4x2", nodes=4))
    assert {op.stream for op in replicated if op.name.startswith("AR bucket")} == {"ar"}
    assert streams(replicated, ("compute", "optimizer")) == {"compute"}
    sharded = plan_ops(RunConfig(**EMU, backend="gloo", strategy=Strategy("pipeline", pp=2, degree=2, microbatches=4)))
    assert streams(sharded, ("compute", "optimizer", "comm")) == {"main"}
