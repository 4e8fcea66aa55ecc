"""The validation matrix's shorthands: a kind's name alone in a matrix file stands for the
strategies of that kind it validates on a cluster of `world` ranks. One entry per kind, in
`SHORTHANDS` under the names of `specs.strategies.STRATEGIES` (a test checks that every concern's
registry holds the same names)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardsim.specs.strategies import DDP, PIPELINE, ZERO, ZERO1, ZERO2D

Shorthand = Callable[[int], list[dict[str, Any]]]


def _alone(kind: str) -> Shorthand:
    """The kind with no field of its own, whatever the world."""
    return lambda world: [{"strategy": kind}]


def _zero2d(world: int) -> list[dict[str, Any]]:
    """Every degree strictly between 1 and the world that divides it."""
    return [{"strategy": ZERO2D.name, "degree": d} for d in range(2, world) if world % d == 0]


def _pipeline(world: int) -> list[dict[str, Any]]:
    """Two stages of four microbatches under each schedule."""
    return [{"strategy": PIPELINE.name, "pp": 2, "microbatches": 4, "schedule": s} for s in ("gpipe", "1f1b")]


SHORTHANDS: dict[str, Shorthand] = {
    DDP.name: _alone(DDP.name),
    ZERO.name: _alone(ZERO.name),
    ZERO2D.name: _zero2d,
    PIPELINE.name: _pipeline,
    ZERO1.name: _alone(ZERO1.name),
}
