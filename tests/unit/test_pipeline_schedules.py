"""The simulator's pipeline schedules against PyTorch's own: for every (schedule, pp,
microbatches, stages per rank) of a grid, the schedule class built over mock stages (no
process group, as PyTorch's own schedule tests do) gives each rank's compute actions, which
must equal `specs.schedules.rank_order`'s; and what PyTorch refuses, `schedule_refusal` refuses."""

from __future__ import annotations

import pytest

from shardsim.specs.schedules import Action, rank_order, rank_stages, schedule_refusal, stage_rank

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
stage_mod = pytest.importorskip("torch.distributed.pipelining.stage")

CLASSES = {
    "gpipe": schedules.ScheduleGPipe,
    "1f1b": schedules.Schedule1F1B,
    "looped-bfs": schedules.ScheduleLoopedBFS,
    "interleaved-1f1b": schedules.ScheduleInterleaved1F1B,
    "interleaved-zb": schedules.ScheduleInterleavedZeroBubble,
    "zbv": schedules.ScheduleZBVZeroBubble,
    "dualpipev": schedules.ScheduleDualPipeV,
}
KIND = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "I", "BACKWARD_WEIGHT": "W"}


class _MockStage(stage_mod._PipelineStageBase):
    """A stage with what a schedule's constructor reads, and no module or process group."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int) -> None:
        self.submod = None
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.group = None
        self.stage_index_to_group_rank = {}

    def _create_grad_recv_info(self, *args, **kwargs):
        return ()

    def _prepare_forward_infra(self, *args, **kwargs):
        return None

    def _prepare_backward_infra(self, *args, **kwargs):
        return None


def _torch_orders(schedule: str, pp: int, m: int, v: int) -> dict[int, list[Action]] | str:
    """Each rank's compute actions of PyTorch's schedule, or the message it refuses with."""
    cls = CLASSES[schedule]
    try:
        if schedule in ("gpipe", "1f1b"):
            out = {}
            for r in range(pp):
                stage = _MockStage(r, pp, pp, r)
                cls(stage, m, loss_fn=lambda y, t: y)  # refuses what it refuses
                out[r] = rank_order(schedule, pp, m, 1, r)  # a single-stage schedule has no order table
            return out
        stages = [_MockStage(s, pp * v, pp, 0) for s in rank_stages(schedule, pp, v, 0)]
        sched = cls(stages, m, loss_fn=lambda y, t: y)
    except (ValueError, AssertionError, KeyError) as exc:  # V-shaped with V != 2 fail their stage-map checks
        return str(exc)
    return {r: [x for a in acts if a is not None for x in _leaves(a)] for r, acts in sched.pipeline_order.items()}


def _leaves(a) -> list[Action]:
    """An action as its compute passes: an overlapped forward-backward (DualPipeV's OVERLAP_F_B)
    as its sub-actions, in the order `_PipelineScheduleRuntime` runs them."""
    if a.sub_actions:
        return [x for sub in a.sub_actions for x in _leaves(sub)]
    return [Action(a.stage_index, KIND[a.computation_type.name], a.microbatch_index)]


GRID = [
    (schedule, pp, m, v)
    for schedule in CLASSES
    for pp in (2, 3, 4, 8)
    for m in (1, 2, 3, 4, 6, 8, 12, 16)
    for v in (1, 2, 3, 4)
    if not (schedule in ("gpipe", "1f1b") and v > 1)
]


def test_orders_equal_pytorch_over_the_grid() -> None:
    """Every case of the grid PyTorch builds: each rank's actions equal; the cases PyTorch
    refuses (with the messages of its constructors) are those `schedule_refusal` refuses among
    them; ours refuses V = 1 of an interleaved schedule besides."""
    built = refused = 0
    for schedule, pp, m, v in GRID:
        got = _torch_orders(schedule, pp, m, v)
        ours = schedule_refusal(schedule, pp, m, v)
        if isinstance(got, str) and schedule in ("gpipe", "1f1b"):
            # Schedule1F1B refuses m < pp; the simulator has always accepted it (left as is)
            assert schedule == "1f1b" and m < pp and ours is None, (schedule, pp, m, v, got)
            continue
        if isinstance(got, str):
            assert ours is not None, (schedule, pp, m, v, got)
            refused += 1
            continue
        if ours is not None:
            assert schedule.startswith("interleaved") and v == 1, (schedule, pp, m, v, ours)
            continue
        for r in range(pp):
            assert rank_order(schedule, pp, m, v, r) == got[r], (schedule, pp, m, v, r)
        built += 1
    assert (built, refused) == (412, 219)  # the grid covers both


def test_stages_sit_where_pytorch_places_them() -> None:
    """Looped: stage s on rank s mod pp; V-shaped: rank r holds r and 2pp - 1 - r
    (pipelining's generate_stage_to_rank_mapping)."""
    from torch.distributed.pipelining.schedules import generate_stage_to_rank_mapping

    for pp in (2, 4, 8):
        for v in (2, 4):
            loop = generate_stage_to_rank_mapping(pp, pp * v)
            assert all(stage_rank("interleaved-1f1b", pp, s) == r for s, r in loop.items())
        vee = generate_stage_to_rank_mapping(pp, 2 * pp, style="v")
        assert all(stage_rank("zbv", pp, s) == r for s, r in vee.items())
        assert all(s in rank_stages("zbv", pp, 2, r) for s, r in vee.items())


def test_every_pass_once_and_backward_after_forward() -> None:
    """On every rank each (stage, microbatch) runs F once, then B once, or I then W."""
    for schedule, pp, m, v in GRID:
        if schedule_refusal(schedule, pp, m, v):
            continue
        for r in range(pp):
            order = rank_order(schedule, pp, m, v, r)
            assert len(order) == len(set(order))
            seen = {(a.stage, a.kind, a.microbatch): i for i, a in enumerate(order)}
            for s in rank_stages(schedule, pp, v, r):
                for i in range(m):
                    f = seen[(s, "F", i)]
                    if (s, "I", i) in seen:
                        assert f < seen[(s, "I", i)] < seen[(s, "W", i)] and (s, "B", i) not in seen
                    else:
                        assert f < seen[(s, "B", i)]


def test_zbv_over_four_gloo_ranks_is_predicted():
    from shardsim.config import load_config
    from shardsim.simulator.predict import predict

    flags = {"topology": "emu-2x2", "workload": "small-gpt", "backend": "gloo", "strategy": "pipeline", "pp": 4,
             "microbatches": 8, "schedule": "zbv", "stages_per_rank": 2}  # fmt: skip
    assert predict(load_config(None, flags)).step_time_s > 0
