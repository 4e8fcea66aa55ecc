"""Pipeline schedules of `torch.distributed.pipelining` as per-rank action orders: which stage
each rank holds (`rank_stages`), the order in which a rank runs its stages' forwards (F), full
backwards (B), input-gradient (I, BACKWARD_INPUT) and weight-gradient (W, BACKWARD_WEIGHT)
passes (`rank_order`), and what PyTorch refuses (`schedule_refusal`).

The orders follow the rules PyTorch's schedule classes (torch 2.13, `schedules.py`) state:
- gpipe (ScheduleGPipe): every forward, then every backward; 1f1b (Schedule1F1B): pp - r - 1
  warm-up forwards on rank r, then a forward and a backward alternately, then the rest;
- looped-bfs (ScheduleLoopedBFS): each local stage's forwards in turn, then each local stage's
  backwards, last stage first, microbatches in reverse;
- interleaved-1f1b (ScheduleInterleaved1F1B): microbatches in rounds of M / max(1, M // pp);
  (V - 1) rounds + 2 (pp - 1 - r) warm-up forwards, then F/B pairs, then the backwards; the
  k-th forward goes to local stage (k // round) mod V, the k-th backward to V - 1 - that;
- interleaved-zb (ScheduleInterleavedZeroBubble, ZB1P): as interleaved-1f1b with (V - 1)
  rounds + (pp - 1 - r) warm-up forwards and I for B; after the j-th I, the W of backward
  j - r (rank r holds r weight passes back), the rest at the end;
- zbv (ScheduleZBVZeroBubble): two stages a rank in a V (rank r holds r and 2 pp - 1 - r), the
  ZB-V warm-up, steady and cool-down phases over max(2 pp - 1, M) microbatches, those beyond M
  left out;
- dualpipev (ScheduleDualPipeV, DeepSeek's DualPipe in a V): the same placement, its eight
  phases; its overlapped forward-backward pairs (OVERLAP_F_B) run their forward, then their
  full backward (what `_PipelineScheduleRuntime` does without a custom overlap function).
Virtual stages: stage s of a looped schedule sits on rank s mod pp; of a V-shaped one on rank
s for s < pp, else 2 pp - 1 - s.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

SINGLE = ("gpipe", "1f1b")  # PipelineScheduleSingle: one stage a rank
LOOPED = ("interleaved-1f1b", "looped-bfs", "interleaved-zb")
V_SHAPED = ("zbv", "dualpipev")
ZERO_BUBBLE = ("interleaved-zb", "zbv", "dualpipev")  # backward split into I and W (dualpipev: some)
ALL = (*SINGLE, *LOOPED, *V_SHAPED)


class Action(NamedTuple):
    """One pass of a schedule: `kind` F, B, I or W of `microbatch` on (global) `stage`."""

    stage: int
    kind: str
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.microbatch}"


def stage_rank(schedule: str, pp: int, stage: int) -> int:
    """The rank of the pipeline group that holds `stage`."""
    if schedule in V_SHAPED:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def rank_stages(schedule: str, pp: int, v: int, rank: int) -> list[int]:
    """The stages rank `rank` holds, in its local order."""
    if schedule in V_SHAPED:
        return [rank, 2 * pp - 1 - rank]
    return [rank + i * pp for i in range(v)]


def schedule_refusal(schedule: str, pp: int, microbatches: int, v: int) -> tuple[str, str] | None:
    """(field, why) where PyTorch refuses this schedule with these sizes (or a single-stage
    schedule is given virtual stages), None where it builds it."""
    if schedule in SINGLE and v != 1:
        return "stages_per_rank", f"{schedule} runs one stage a rank (stages_per_rank 1), got {v}"
    if schedule in V_SHAPED and v != 2:
        return "stages_per_rank", f"{schedule} needs exactly 2 stages a rank, got {v}"
    if schedule == "dualpipev" and microbatches < 2 * pp:
        why = f"dualpipev needs at least as many microbatches as stages (2 x pp = {2 * pp}), got {microbatches}"
        return "microbatches", why
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        if v < 2:
            why = f"{schedule} interleaves virtual stages: stages_per_rank 2 or more (with 1 it is 1f1b)"
            return "stages_per_rank", why
        rounds = max(1, microbatches // pp)
        if microbatches % rounds:
            why = (
                f"{schedule} needs microbatches a multiple of its rounds max(1, microbatches // pp) = {rounds}, "
                f"got {microbatches} (pp {pp})"
            )
            return "microbatches", why
    return None


def rank_order(schedule: str, pp: int, microbatches: int, v: int, rank: int) -> list[Action]:
    """The passes rank `rank` runs in one schedule step, in order."""
    m = microbatches
    if schedule == "gpipe":
        return [Action(rank, "F", i) for i in range(m)] + [Action(rank, "B", i) for i in range(m)]
    if schedule == "1f1b":
        return _one_f_one_b(pp, m, rank)
    if schedule == "looped-bfs":
        stages = rank_stages(schedule, pp, v, rank)
        forwards = [Action(s, "F", i) for s in stages for i in range(m)]
        return forwards + [Action(s, "B", i) for s in stages[::-1] for i in reversed(range(m))]
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        return _interleaved(pp, m, v, rank, zero_bubble=schedule == "interleaved-zb")
    if schedule == "zbv":
        return _zbv(pp, m, rank)
    if schedule == "dualpipev":
        return _dualpipev(pp, m, rank)
    raise ValueError(f"unknown schedule {schedule!r}")


def _one_f_one_b(pp: int, m: int, rank: int) -> list[Action]:
    warm = min(pp - rank - 1, m)
    order = [Action(rank, "F", i) for i in range(warm)]
    for i in range(m - warm):
        order += [Action(rank, "F", warm + i), Action(rank, "B", i)]
    return order + [Action(rank, "B", i) for i in range(m - warm, m)]


class _Counter:
    """Next microbatch per (stage, kind)."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, str], int] = defaultdict(int)

    def take(self, stage: int, kind: str) -> Action:
        i = self.next[(stage, kind)]
        self.next[(stage, kind)] = i + 1
        return Action(stage, kind, i)


def _interleaved(pp: int, m: int, v: int, rank: int, zero_bubble: bool) -> list[Action]:
    per_round = m // max(1, m // pp)
    hops = (pp - 1 - rank) * (1 if zero_bubble else 2)
    total = m * v
    warm = min((v - 1) * per_round + hops, total)
    local: Callable[[int], int] = lambda k: (k // per_round) % v  # noqa: E731 (the k-th pass's local stage)
    fwd = [rank + local(k) * pp for k in range(total)]
    bwd = [rank + (v - 1 - local(k)) * pp for k in range(total)]
    c = _Counter()
    order = [c.take(fwd[k], "F") for k in range(warm)]
    for j in range(total):  # the j-th backward, after the (warm + j)-th forward while any is left
        if warm + j < total:
            order.append(c.take(fwd[warm + j], "F"))
        order.append(c.take(bwd[j], "I" if zero_bubble else "B"))
        if zero_bubble and j >= rank:
            order.append(c.take(bwd[j - rank], "W"))
    if zero_bubble:
        order += [c.take(bwd[j], "W") for j in range(total - rank, total) if j >= 0]
    return order


def _zbv(pp: int, m: int, rank: int) -> list[Action]:
    n = max(2 * pp - 1, m)
    s0, s1 = rank, 2 * pp - 1 - rank
    c = _Counter()
    order = [c.take(s0, "F") for _ in range(2 * (pp - rank) - 1)]
    for _ in range(rank):
        order += [c.take(s1, "F"), c.take(s0, "F")]
    for _ in range(pp - rank):
        order += [c.take(s1, "F"), c.take(s1, "I"), c.take(s1, "W")]
    while c.next[(s1, "F")] < c.next[(s0, "F")] or c.next[(s0, "F")] < n:
        if c.next[(s0, "F")] < n:
            order.append(c.take(s0, "F"))
        order += [c.take(s0, "I"), c.take(s0, "W"), c.take(s1, "F"), c.take(s1, "I"), c.take(s1, "W")]
    for _ in range(rank):
        order += [c.take(s0, "I"), c.take(s1, "I")]
    for _ in range(pp - rank):
        order += [c.take(s0, "I"), c.take(s0, "W")]
    for s in (s1, s0):
        while c.next[(s, "W")] < c.next[(s, "I")]:
            order.append(c.take(s, "W"))
    return [a for a in order if a.microbatch < m]


def _dualpipev(pp: int, m: int, rank: int) -> list[Action]:
    s0, s1 = rank, 2 * pp - 1 - rank
    c = _Counter()
    order: list[Action] = []
    weights: list[tuple[int, int]] = []  # (stage, microbatch) of the I passes whose W is pending

    def pass_(stage: int, kind: str) -> None:
        """F, B or I of the stage's next microbatch (B and I share a count; I queues its W)."""
        a = c.take(stage, "F" if kind == "F" else "I")
        order.append(Action(stage, kind, a.microbatch))
        if kind == "I":
            weights.append((stage, a.microbatch))

    def weight() -> None:
        """The W of the oldest pending I, if any."""
        if weights:
            stage, mb = weights.pop(0)
            order.append(Action(stage, "W", mb))

    hops = pp - rank - 1
    for _ in range(2 * hops):
        pass_(s0, "F")
    for _ in range(rank + 1):
        pass_(s0, "F")
        pass_(s1, "F")
    for _ in range(hops):
        pass_(s1, "I")
        weight()
        pass_(s1, "F")
    for _ in range(m - 2 * pp + rank + 1):
        pass_(s0, "F")  # with the next: an overlapped pair (or, first on the last rank, two passes)
        pass_(s1, "B")
        pass_(s1, "F")
        pass_(s0, "B")
    for _ in range(hops):
        pass_(s1, "B")
        pass_(s1, "F")
        pass_(s0, "B")
    zb = False
    for i in range(rank + 1):  # the second half's backwards split (from the middle on)
        if i == (rank + 1) // 2 and rank % 2 == 1:
            zb = True
        pass_(s1, "I" if zb else "B")
        if i == (rank + 1) // 2 and rank % 2 == 0:
            zb = True
        pass_(s0, "I" if zb else "B")
    for _ in range(hops):
        weight()
        pass_(s0, "I" if zb else "B")
    for _ in range(rank + 1):
        weight()
    return order
