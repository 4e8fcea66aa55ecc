"""ddp: `DistributedDataParallel`, the model replicated on every rank."""

from __future__ import annotations

from shardsim.core.errors import ConfigError
from shardsim.specs.strategies.base import StrategyFields


class Ddp:
    name = "ddp"
    description = "DistributedDataParallel: the model replicated, gradients all-reduced"
    is_pipeline = False
    fsdp = False
    replicates = True
    fsdp_sharding = {"NO_SHARD": True}

    def check(self, s: StrategyFields, where: str) -> None:
        if s.degree not in (None, 1):
            raise ConfigError(
                f"ddp replicates the model; a shard degree of {s.degree} contradicts it", where=where, field="degree"
            )

    def shard(self, s: StrategyFields, world: int, where: str, node_ranks: int | None = None) -> int:
        return 1

    def resolved(self, shard: int, world: int) -> str:
        return self.name

    def label(self, s: StrategyFields) -> str:
        return self.name + ("" if s.reshard_after_forward else " (ZeRO-2)")

    def sharded_degree(self, s: StrategyFields, world: int) -> int:
        return 1


DDP = Ddp()
