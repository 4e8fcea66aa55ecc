"""zero2d: FSDP2 over a 2-D mesh, sharded within groups of `degree` consecutive ranks and
replicated across them (MiCS, FSDP's HYBRID_SHARD); without a degree, within each node (HYBRID_SHARD's default)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from shardsim.core.errors import ConfigError
from shardsim.spec.strategies.zero import ZERO, Fsdp

if TYPE_CHECKING:
    from collections.abc import Iterable

    from shardsim.config import Strategy
    from shardsim.simulator.sweep.space import SweepSpace


def zero2d_degrees(world: int, space: SweepSpace) -> list[int]:
    """zero2d's degrees: those listed, else every divisor strictly between 1 and the world (d = 1
    is ddp; d = world is zero, which resolve() says so: only when asked for by --degrees)."""
    from shardsim.simulator.sweep.space import divisors

    ds = sorted(set(space.degrees)) if space.degrees is not None else divisors(world)[1:-1]
    return [d for d in ds if d > 1]


class Zero2d(Fsdp):
    name = "zero2d"
    description = "FSDP2 sharded within groups of `degree` consecutive ranks, replicated across them"
    color = "#DD8452"
    plot_order = 1
    fsdp_sharding = {"HYBRID_SHARD": True, "_HYBRID_SHARD_ZERO2": False}

    def shard(self, s: Strategy, world: int, where: str, node_ranks: int | None = None) -> int:
        """The degree; without one, the data-parallel ranks of a node: FSDP's HYBRID_SHARD shards
        within each node by default (its intra-node group of the node's devices)."""
        if s.degree is not None:
            return s.degree
        if node_ranks is None:
            why = "zero2d without a degree shards within a node, whose GPU count is not known here; give a degree"
            raise ConfigError(why, where=where, field="degree")
        return node_ranks

    def resolved(self, shard: int, world: int) -> str:
        return ZERO.name if shard == world else self.name  # MiCS with one partition group is plain ZeRO-3

    def label(self, s: Strategy) -> str:
        degree = "node" if s.degree is None else s.degree  # None: the GPUs of a node, until resolved
        return f"zero2d d={degree}" + ("" if s.reshard_after_forward else " (ZeRO-2)")

    def plot_label(self, degree: int, pp: int, microbatches: int, schedule: str) -> str:
        return f"zero2d d={degree}"

    def sharded_degree(self, s: Strategy, world: int) -> int:
        return s.degree or 1

    def sweep(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> Iterable[Strategy]:
        from shardsim.config import Strategy

        for d in zero2d_degrees(world, space):
            for raf in reshard:
                yield Strategy(self.name, degree=d, reshard_after_forward=raf)

    def sweep_count(
        self, world: int, n_layers: int, batch_per_device: int, space: SweepSpace, reshard: tuple[bool, ...]
    ) -> int:
        return len(zero2d_degrees(world, space)) * len(reshard)

    def matrix_entries(self, world: int) -> list[dict]:
        return [{"strategy": self.name, "degree": d} for d in range(2, world) if world % d == 0]


ZERO2D = Zero2d()
