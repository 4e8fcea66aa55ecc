"""What a sweep asks of each strategy kind: the strategies it tries on a cluster (and how many,
counted without making them), whether it tries the kind unless --strategies names the kinds, and
the kind's colour, place and short label in the sweep's plots. One face per kind, in `FACES`
under the names of `specs.strategies.STRATEGIES` (a test checks that every concern's registry
holds the same names)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from shardsim.config import Strategy
from shardsim.specs.schedules import SINGLE, schedule_refusal
from shardsim.specs.strategies import DDP, PIPELINE, ZERO, ZERO1, ZERO2D


class SweepSpace(Protocol):
    """The axes of a sweep's space a face reads (`sweep.space.SweepSpace` has them):
    None where every valid value is tried."""

    degrees: tuple[int, ...] | None
    pp: tuple[int, ...] | None
    microbatches: tuple[int, ...] | None
    schedules: tuple[str, ...]
    stages_per_rank: tuple[int, ...] | None


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def default_microbatches(pp: int, batch_per_device: int) -> list[int]:
    """pp, 2·pp, 4·pp microbatches where they divide the per-replica batch (batch_per_device × pp).

    Fewer than pp microbatches leave stages idle by construction; more than 4·pp buy a
    bubble under (pp-1)/(5·pp-1) at the price of tiny microbatches and, for sharded stages,
    one all-gather of every unit per microbatch — pass --microbatches to go further."""
    per_replica = batch_per_device * pp
    return [m for m in (pp, 2 * pp, 4 * pp) if per_replica % m == 0]


def pipeline_axes(
    world: int, n_layers: int, batch_per_device: int, space: SweepSpace
) -> list[tuple[int, list[int], list[int]]]:
    """(pp, the stages' shard degrees, microbatch counts) of every pipeline degree of the space."""
    pps = sorted(space.pp) if space.pp is not None else [p for p in divisors(world) if 2 <= p <= n_layers]
    out = []
    for pp in pps:
        if pp < 2:
            continue  # a one-stage pipeline is data parallel: ddp/zero/zero2d cover it
        stage_ranks = world // pp if world % pp == 0 else 0
        if space.degrees is not None:
            ds = sorted(set(space.degrees))
        else:
            ds = divisors(stage_ranks) if stage_ranks else [1]
        if space.microbatches is not None:
            ms = sorted(space.microbatches)
        else:
            ms = default_microbatches(pp, batch_per_device)
        out.append((pp, ds, ms))
    return out


def zero2d_degrees(world: int, space: SweepSpace) -> list[int]:
    """zero2d's degrees: those listed, else every divisor strictly between 1 and the world (d = 1
    is ddp; d = world is zero, which resolve() says so: only when asked for by --degrees)."""
    ds = sorted(set(space.degrees)) if space.degrees is not None else divisors(world)[1:-1]
    return [d for d in ds if d > 1]


class Face(Protocol):
    """How a sweep enumerates and draws one kind."""

    color: str  # of its bars and lines in the sweep's plots
    plot_order: int  # its place among the data-parallel kinds in the scaling plot
    in_default_sweep: bool  # a sweep tries it unless --strategies names the kinds

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        """The strategies of this kind a sweep of `space` tries on `world` ranks."""
        ...

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        """How many strategies `sweep` yields, counted without making them."""
        ...

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        """Its short label in the sweep's plots."""
        ...


class DdpFace:
    color = "#4C72B0"
    plot_order = 0
    in_default_sweep = True

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        yield Strategy(DDP.name)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        return 1

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return f"{DDP.name} (d=1)"


class Zero1Face(DdpFace):
    color = "#8172B3"
    plot_order = 0
    in_default_sweep = False  # asked for by name (--strategies zero1): the committed sweeps predate it

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        yield Strategy(ZERO1.name)

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return ZERO1.name


class ZeroFace:
    color = "#C44E52"
    plot_order = 2
    in_default_sweep = True

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        for raf in reshard:
            yield Strategy(ZERO.name, reshard_after_forward=raf)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        return len(reshard)

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return f"{ZERO.name} (d={degree})"


class Zero2dFace:
    color = "#DD8452"
    plot_order = 1
    in_default_sweep = True

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        for d in zero2d_degrees(world, space):
            for raf in reshard:
                yield Strategy(ZERO2D.name, degree=d, reshard_after_forward=raf)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        return len(zero2d_degrees(world, space)) * len(reshard)

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return f"{ZERO2D.name} d={degree}"


def schedule_axes(space: SweepSpace, pp: int, m: int) -> list[tuple[str, int]]:
    """(schedule, stages per rank) of a pipeline of `pp` stages and `m` microbatches: each listed
    schedule with each listed count (default: 1 for one stage a rank, 2 for virtual stages),
    those PyTorch refuses (`schedule_refusal`) left out (more stages than layers: resolve's)."""
    out = []
    for sched in space.schedules:
        for v in space.stages_per_rank or ((1,) if sched in SINGLE else (2,)):
            if schedule_refusal(sched, pp, m, v) is None:
                out.append((sched, v))
    return out


class PipelineFace:
    color = "#55A868"
    plot_order = 3
    in_default_sweep = True

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        for pp, ds, ms in pipeline_axes(world, n_layers, batch_per_device, space):
            for d in ds:
                for m in ms:
                    for sched, v in schedule_axes(space, pp, m):
                        yield Strategy(
                            PIPELINE.name, degree=d, pp=pp, microbatches=m, schedule=sched, stages_per_rank=v
                        )

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        axes = pipeline_axes(world, n_layers, batch_per_device, space)
        return sum(len(ds) * sum(len(schedule_axes(space, pp, m)) for m in ms) for pp, ds, ms in axes)

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        shard = f" d={degree}" if degree > 1 else ""
        return f"pp={pp} m={microbatches} {schedule}{shard}"


FACES: dict[str, Face] = {
    DDP.name: DdpFace(),
    ZERO.name: ZeroFace(),
    ZERO2D.name: Zero2dFace(),
    PIPELINE.name: PipelineFace(),
    ZERO1.name: Zero1Face(),
}
# the kinds a sweep tries unless --strategies names others (zero1 is asked for by name)
DEFAULT_SWEEP = tuple(k for k, v in FACES.items() if v.in_default_sweep)
# what --strategies says of its default
DEFAULT_SWEEP_TEXT = (
    f"default: {','.join(DEFAULT_SWEEP)}; {', '.join(k for k in FACES if k not in DEFAULT_SWEEP)} only when named"
)
