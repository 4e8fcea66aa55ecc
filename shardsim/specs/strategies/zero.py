"""zero: FSDP2 `fully_shard` over the whole world (ZeRO-3; ZeRO-2 with reshard_after_forward False)."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.strategies.base import StrategyFields


class Fsdp:
    """What the FSDP2 kinds share (zero, zero2d): every parameter sharded."""

    name = ""
    description = ""
    is_pipeline = False
    fsdp = True
    replicates = False
    fsdp_sharding: dict[str, bool] = {}

    def check(self, s: StrategyFields, where: str) -> None:
        return None

    def label(self, s: StrategyFields) -> str:
        return self.name + ("" if s.reshard_after_forward else " (ZeRO-2)")


class Zero(Fsdp):
    name = "zero"
    description = "FSDP2 over the whole world (ZeRO-3; ZeRO-2 with reshard_after_forward false)"
    fsdp_sharding = {"FULL_SHARD": True, "SHARD_GRAD_OP": False}

    def shard(self, s: StrategyFields, world: int, where: str, node_ranks: int | None = None) -> int:
        if s.degree not in (None, world):
            raise ConfigError(
                f"zero shards over the whole world ({world}); degree {s.degree} contradicts it (use zero2d)",
                where=where,
                field="degree",
            )
        return world

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def sharded_degree(self, s: StrategyFields, world: int) -> int:
        return world


ZERO = Zero()
