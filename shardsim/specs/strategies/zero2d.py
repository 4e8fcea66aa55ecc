"""zero2d: FSDP2 over a 2-D mesh, sharded within groups of `degree` consecutive ranks and
replicated across them (MiCS, FSDP's HYBRID_SHARD); without a degree, within each node (HYBRID_SHARD's default)."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.strategies.base import StrategyFields
from shardsim.specs.strategies.zero import ZERO, Fsdp


class Zero2d(Fsdp):
    name = "zero2d"
    description = "FSDP2 sharded within groups of `degree` consecutive ranks, replicated across them"
    fsdp_sharding = {"HYBRID_SHARD": True, "_HYBRID_SHARD_ZERO2": False}

    def shard(self, s: StrategyFields, world: int, where: str, node_ranks: int | None = None) -> int:
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

    def label(self, s: StrategyFields) -> str:
        degree = "node" if s.degree is None else s.degree  # None: the GPUs of a node, until resolved
        return f"zero2d d={degree}" + ("" if s.reshard_after_forward else " (ZeRO-2)")

    def sharded_degree(self, s: StrategyFields, world: int) -> int:
        return s.degree or 1


ZERO2D = Zero2d()
